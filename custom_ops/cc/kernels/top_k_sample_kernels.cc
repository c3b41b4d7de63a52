// Copyright 2026 The tfgc Authors.
//
// CPU kernels of Tfgc>TopKSample and Tfgc>TopKSampleWithResidual (and the
// TensorFlow glue of their CUDA kernels when built with GOOGLE_CUDA).
//
// The CPU algorithm reads the input two or three times whatever `rounds` is:
//   1. statistics: sum, max and count of the finite keys (fused with
//      acc = gradient + residual in the residual variant; SSE2 for float32);
//   2. counts at six coarse thresholds (the ratios 1/2, 1/4, ..., 1/64 the
//      bisection visits first, or the five trimmed top-k ratios), which
//      answer the first rounds and bound all later thresholds from below.
//      For inputs of 256 Ki keys or more, a strided sample of 64 Ki keys
//      predicts that bound and the same pass compacts the keys above it;
//   3. only when there was no prediction or it was too high: an ordered
//      compaction of the candidates (keys at or above the bound);
// then the remaining rounds, and the final selection, run on the candidates
// (typically well under 1 % of the input for densities of 0.1-1 %).
// Every pass is split into fixed blocks run on the intra-op thread pool, and
// every result is exactly the one of the pure-TF reference.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"
#include "tensorflow/core/framework/register_types.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#include "unsupported/Eigen/CXX11/Tensor"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace {

constexpr float kMaxFloat = std::numeric_limits<float>::max();

template <typename T>
inline float Magnitude(T x) {
  return std::fabs(static_cast<float>(x));
}

// The key of the header: NaN maps to -1.
inline float KeyOf(float magnitude) {
  return std::isnan(magnitude) ? -1.0f : magnitude;
}

struct Stats {
  float mean = 0.0f;
  float max = 0.0f;
  float diff = 0.0f;
};

struct BlockStats {
  double sum = 0.0;
  float max = 0.0f;
  int64_t finite = 0;
};

template <typename T>
inline void AccumulateScalar(const T* x, int64_t begin, int64_t end,
                             BlockStats* out) {
  double sum[4] = {0.0, 0.0, 0.0, 0.0};
  float mx = 0.0f;
  int64_t finite = 0;
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    for (int l = 0; l < 4; ++l) {
      const float a = Magnitude(x[i + l]);
      const bool ok = a <= kMaxFloat;
      sum[l] += ok ? a : 0.0f;
      mx = ok && a > mx ? a : mx;
      finite += ok;
    }
  }
  for (; i < end; ++i) {
    const float a = Magnitude(x[i]);
    const bool ok = a <= kMaxFloat;
    sum[0] += ok ? a : 0.0f;
    mx = ok && a > mx ? a : mx;
    finite += ok;
  }
  out->sum = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  out->max = mx;
  out->finite = finite;
}

#if defined(__SSE2__)
// float32 statistics four keys at a time: finite keys masked in, widened
// to double in two lanes pairs (fixed lane order: deterministic).
inline void AccumulateFloat(const float* x, int64_t begin, int64_t end,
                            BlockStats* out) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  const __m128 big = _mm_set1_ps(kMaxFloat);
  __m128d s0 = _mm_setzero_pd(), s1 = _mm_setzero_pd();
  __m128d s2 = _mm_setzero_pd(), s3 = _mm_setzero_pd();
  __m128 mx = _mm_setzero_ps();
  __m128i cnt = _mm_setzero_si128();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m128 a = _mm_and_ps(_mm_loadu_ps(x + i), abs_mask);
    const __m128 b = _mm_and_ps(_mm_loadu_ps(x + i + 4), abs_mask);
    const __m128 fa = _mm_cmple_ps(a, big);  // false for NaN and inf
    const __m128 fb = _mm_cmple_ps(b, big);
    const __m128 ma = _mm_and_ps(a, fa);
    const __m128 mb = _mm_and_ps(b, fb);
    s0 = _mm_add_pd(s0, _mm_cvtps_pd(ma));
    s1 = _mm_add_pd(s1, _mm_cvtps_pd(_mm_movehl_ps(ma, ma)));
    s2 = _mm_add_pd(s2, _mm_cvtps_pd(mb));
    s3 = _mm_add_pd(s3, _mm_cvtps_pd(_mm_movehl_ps(mb, mb)));
    mx = _mm_max_ps(mx, _mm_max_ps(ma, mb));
    cnt = _mm_sub_epi32(cnt, _mm_castps_si128(fa));
    cnt = _mm_sub_epi32(cnt, _mm_castps_si128(fb));
  }
  alignas(16) double d[8];
  _mm_store_pd(d, s0);
  _mm_store_pd(d + 2, s1);
  _mm_store_pd(d + 4, s2);
  _mm_store_pd(d + 6, s3);
  alignas(16) float m[4];
  _mm_store_ps(m, mx);
  alignas(16) int32_t c[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(c), cnt);
  BlockStats tail;
  AccumulateScalar(x + i, 0, end - i, &tail);  // < 8 keys left
  double sum = tail.sum;
  for (int l = 0; l < 8; ++l) sum += d[l];
  float mxs = tail.max;
  for (int l = 0; l < 4; ++l) mxs = std::max(mxs, m[l]);
  out->sum = sum;
  out->max = mxs;
  out->finite =
      tail.finite + int64_t{c[0]} + int64_t{c[1]} + int64_t{c[2]} + c[3];
}
#endif  // __SSE2__

template <typename T>
inline void Accumulate(const T* x, int64_t begin, int64_t end,
                       BlockStats* out) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    AccumulateFloat(x, begin, end, out);
    return;
  }
#endif
  AccumulateScalar(x, begin, end, out);
}

Stats Combine(const std::vector<BlockStats>& parts) {
  double sum = 0.0;
  float mx = 0.0f;
  int64_t finite = 0;
  for (const BlockStats& p : parts) {
    sum += p.sum;
    mx = std::max(mx, p.max);
    finite += p.finite;
  }
  Stats s;
  if (finite > 0) {
    s.mean = static_cast<float>(sum / static_cast<double>(finite));
    s.max = mx;
  }
  s.diff = s.max - s.mean;
  return s;
}

template <typename T>
Stats ComputeStats(OpKernelContext* ctx, const T* x, int64_t n) {
  Blocks blocks(n, NumThreads(ctx));
  std::vector<BlockStats> parts(blocks.count());
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    Accumulate(x, blocks.begin(b), blocks.end(b), &parts[b]);
  });
  return Combine(parts);
}

// acc = gradient + residual (in T, as TensorFlow adds), then statistics.
template <typename T>
Stats AddAndComputeStats(OpKernelContext* ctx, const T* g, const T* r, T* acc,
                         int64_t n) {
  Blocks blocks(n, NumThreads(ctx));
  std::vector<BlockStats> parts(blocks.count());
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    const int64_t begin = blocks.begin(b);
    const int64_t end = blocks.end(b);
    // Add in chunks that stay in L1, then read them back for the stats.
    constexpr int64_t kChunk = 2048;
    BlockStats total;
    for (int64_t c = begin; c < end; c += kChunk) {
      const int64_t ce = std::min(end, c + kChunk);
      for (int64_t i = c; i < ce; ++i) acc[i] = static_cast<T>(g[i] + r[i]);
      BlockStats part;
      Accumulate(acc, c, ce, &part);
      total.sum += part.sum;
      total.max = std::max(total.max, part.max);
      total.finite += part.finite;
    }
    parts[b] = total;
  });
  return Combine(parts);
}

// Number of coarse thresholds counted in the second pass (unused slots are
// NaN, which no key passes).
constexpr int kCoarse = 6;

struct Candidates {
  std::vector<float> key;
  std::vector<int32_t> index;
};

// Growable, uninitialised (key, index) storage for one block's candidates.
struct CandidateBuffer {
  std::unique_ptr<float[]> key;
  std::unique_ptr<int32_t[]> index;
  int64_t size = 0;
  int64_t capacity = 0;

  void Reserve(int64_t want) {
    if (want <= capacity) return;
    const int64_t cap = std::max(want, 2 * capacity);
    std::unique_ptr<float[]> k(new float[cap]);
    std::unique_ptr<int32_t[]> i(new int32_t[cap]);
    std::copy(key.get(), key.get() + size, k.get());
    std::copy(index.get(), index.get() + size, i.get());
    key = std::move(k);
    index = std::move(i);
    capacity = cap;
  }
};

// Predicts, from a strided sample of about 64 Ki keys, the coarse level the
// counts will choose: the first j whose count is `>= k` (at_least) or `> k`,
// one level lower when the estimate is within 25 % of k (a superset is
// needed, so the prediction errs low). Returns -1 for no prediction and sets
// `*fraction` to the sampled fraction of keys passing the predicted level.
template <typename T, bool kStrict>
int PredictLevel(const T* x, int64_t n, int64_t k,
                 const std::array<float, kCoarse>& t, int levels,
                 bool at_least, double* fraction) {
  constexpr int64_t kSample = int64_t{1} << 16;
  if (n < 4 * kSample) return -1;  // small inputs: the exact passes are cheap
  const int64_t stride = n / kSample;
  int64_t c[kCoarse] = {0};
  int64_t samples = 0;
  for (int64_t i = stride / 2; i < n; i += stride, ++samples) {
    const float a = Magnitude(x[i]);
    for (int j = 0; j < levels; ++j) c[j] += kStrict ? a > t[j] : a >= t[j];
  }
  for (int j = 0; j < levels; ++j) {
    const double est = static_cast<double>(c[j]) * n / samples;
    if (at_least ? est >= k : est > k) {
      const int level = est < 1.25 * k ? std::min(j + 1, levels - 1) : j;
      *fraction = static_cast<double>(c[level]) / samples;
      return level;
    }
  }
  return -1;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Adds to c[j] the number of mag[0..len) passing th[j] and appends those
// passing `thr` (never when thr is NaN) with indices offset by `base`. With
// SSE2: four keys per compare, and a movemask test so the rarely taken
// append costs nothing for groups of four that do not pass.
template <bool kStrict>
inline void CountChunk(const float* mag, int64_t len, const float* th,
                       float thr, int64_t base, uint32_t* c,
                       CandidateBuffer* part) {
  part->Reserve(part->size + len);  // room for the whole chunk
  float* out_key = part->key.get() + part->size;
  int32_t* out_index = part->index.get() + part->size;
  int64_t out = 0;
  int64_t i = 0;
#if defined(__SSE2__)
  __m128 t[kCoarse];
  __m128i acc[kCoarse];
  for (int j = 0; j < kCoarse; ++j) {
    t[j] = _mm_set1_ps(th[j]);
    acc[j] = _mm_setzero_si128();
  }
  const __m128 tl = _mm_set1_ps(thr);
  for (; i + 4 <= len; i += 4) {
    const __m128 v = _mm_loadu_ps(mag + i);
    for (int j = 0; j < kCoarse; ++j) {
      const __m128 m = kStrict ? _mm_cmpgt_ps(v, t[j]) : _mm_cmpge_ps(v, t[j]);
      acc[j] = _mm_sub_epi32(acc[j], _mm_castps_si128(m));
    }
    int bits = _mm_movemask_ps(kStrict ? _mm_cmpgt_ps(v, tl)
                                       : _mm_cmpge_ps(v, tl));
    while (bits != 0) {
      const int l = __builtin_ctz(bits);
      out_key[out] = mag[i + l];
      out_index[out] = static_cast<int32_t>(base + i + l);
      ++out;
      bits &= bits - 1;
    }
  }
  for (int j = 0; j < kCoarse; ++j) {
    alignas(16) uint32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), acc[j]);
    c[j] += lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
#endif
  for (; i < len; ++i) {
    const float a = mag[i];
    for (int j = 0; j < kCoarse; ++j) c[j] += kStrict ? a > th[j] : a >= th[j];
    if (kStrict ? a > thr : a >= thr) {
      out_key[out] = a;
      out_index[out] = static_cast<int32_t>(base + i);
      ++out;
    }
  }
  part->size += out;
}

// One pass: per-block counts of the keys passing each coarse threshold
// (key >= t, or key > t when kStrict; unused slots are NaN, which no key
// passes) and, when level >= 0, the
// elements passing t[level] in index order into `cand`.
template <typename T, bool kStrict>
std::vector<std::array<int64_t, kCoarse>> CountAndCompact(
    OpKernelContext* ctx, const T* x, const std::array<float, kCoarse>& t,
    int level, double fraction, const Blocks& blocks, Candidates* cand) {
  std::vector<std::array<int64_t, kCoarse>> counts(blocks.count());
  std::vector<CandidateBuffer> parts(blocks.count());
  const float thr = level >= 0 ? t[level] : 0.0f;
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    uint32_t c[kCoarse] = {0};
    float th[kCoarse];
    for (int j = 0; j < kCoarse; ++j) th[j] = t[j];
    CandidateBuffer& part = parts[b];
    const int64_t end = blocks.end(b);
    if (level >= 0) {
      part.Reserve(static_cast<int64_t>(
          1.25 * fraction * static_cast<double>(end - blocks.begin(b)) +
          2048));
    }
    // Chunks that stay in L1: a branch-free (vectorisable) counting loop,
    // then the rarely taken compaction branch over the same chunk.
    constexpr int64_t kChunk = 1024;
    float mag[kChunk];
    for (int64_t c0 = blocks.begin(b); c0 < end; c0 += kChunk) {
      const int64_t len = std::min(kChunk, end - c0);
      for (int64_t i = 0; i < len; ++i) mag[i] = Magnitude(x[c0 + i]);
      CountChunk<kStrict>(mag, len, th, level >= 0 ? thr : kNaN, c0, c,
                          &part);
    }
    for (int j = 0; j < kCoarse; ++j) counts[b][j] = c[j];
  });
  if (level >= 0) {
    int64_t total = 0;
    for (const CandidateBuffer& part : parts) total += part.size;
    cand->key.reserve(total);
    cand->index.reserve(total);
    for (const CandidateBuffer& part : parts) {
      cand->key.insert(cand->key.end(), part.key.get(),
                       part.key.get() + part.size);
      cand->index.insert(cand->index.end(), part.index.get(),
                         part.index.get() + part.size);
    }
  }
  return counts;
}

int64_t TotalCount(const std::vector<std::array<int64_t, kCoarse>>& counts,
                   int j) {
  int64_t total = 0;
  for (const auto& c : counts) total += c[j];
  return total;
}

// Copies, in index order, every element passing coarse threshold `level`
// (all of them, NaN keys included, when level < 0).
template <typename T, bool kStrict>
void Compact(OpKernelContext* ctx, const T* x,
             const std::vector<std::array<int64_t, kCoarse>>& counts,
             const std::array<float, kCoarse>& t, int level,
             const Blocks& blocks, Candidates* out) {
  std::vector<int64_t> offsets(blocks.count() + 1, 0);
  for (int64_t b = 0; b < blocks.count(); ++b) {
    const int64_t c =
        level >= 0 ? counts[b][level] : blocks.end(b) - blocks.begin(b);
    offsets[b + 1] = offsets[b] + c;
  }
  out->key.resize(offsets.back());
  out->index.resize(offsets.back());
  const float thr = level >= 0 ? t[level] : 0.0f;
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t o = offsets[b];
    const int64_t end = blocks.end(b);
    float* key = out->key.data();
    int32_t* index = out->index.data();
    if (level < 0) {
      for (int64_t i = blocks.begin(b); i < end; ++i, ++o) {
        key[o] = KeyOf(Magnitude(x[i]));
        index[o] = static_cast<int32_t>(i);
      }
      return;
    }
    for (int64_t i = blocks.begin(b); i < end; ++i) {
      const float a = Magnitude(x[i]);
      if (kStrict ? a > thr : a >= thr) {
        key[o] = a;
        index[o] = static_cast<int32_t>(i);
        ++o;
      }
    }
  });
}

// Number of candidate keys >= thr (> thr when kStrict).
template <bool kStrict>
int64_t CountPassing(OpKernelContext* ctx, const std::vector<float>& key,
                     float thr) {
  const int64_t n = static_cast<int64_t>(key.size());
  // Below 256 Ki keys one thread beats waking the pool every round.
  Blocks blocks(n, NumThreads(ctx), int64_t{1} << 18);
  std::vector<int64_t> part(blocks.count(), 0);
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t c = 0;
    const float* k = key.data();
    const int64_t end = blocks.end(b);
    for (int64_t i = blocks.begin(b); i < end; ++i) {
      c += kStrict ? (k[i] > thr) : (k[i] >= thr);
    }
    part[b] = c;
  });
  int64_t total = 0;
  for (int64_t c : part) total += c;
  return total;
}

// Exact top-k of the candidates (which hold every key >= the k-th largest).
SelectionPlan ExactTopK(const Candidates& cand, int64_t k) {
  std::vector<float> keys(cand.key);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(),
                   [](float a, float b) { return a > b; });
  const float v = keys[k - 1];
  int64_t greater = 0;
  for (float a : cand.key) greater += a > v;
  return ExactPlan(v, greater, k);
}

// The bisection starts at ratio 1/2 and halves the ratio while counts stay
// <= k, so its first rounds visit 1/2, 1/4, ..., 1/64: one pass counts all
// six, and the first ratio whose count exceeds k bounds every later
// threshold from below. The elements above it (typically a few per cent)
// are compacted and the remaining rounds count on them.
template <typename T, bool kStrict>
SelectionPlan BisectionPlan(OpKernelContext* ctx, const T* x, int64_t n,
                            int64_t k, TopKSampleMode mode, int rounds,
                            int64_t seed, const Stats& st, Candidates* cand) {
  std::array<float, kCoarse> t;
  float ratio = 1.0f;
  for (int j = 0; j < kCoarse; ++j) {
    ratio *= 0.5f;
    t[j] = Threshold(st.mean, st.diff, ratio);
  }
  Blocks blocks(n, NumThreads(ctx));
  double fraction = 0.0;
  const int predicted = PredictLevel<T, kStrict>(
      x, n, k, t, std::min(rounds, kCoarse), false, &fraction);
  const auto counts = CountAndCompact<T, kStrict>(ctx, x, t, predicted,
                                                  fraction, blocks, cand);
  Bisection bis(mode, k, st.mean, st.diff);
  int round = 0;
  int level = -1;
  for (; round < rounds && round < kCoarse && !bis.accepted(); ++round) {
    bis.Update(TotalCount(counts, round));  // NextRatio() was 2^-(round+1)
    if (bis.lo_ratio() > 0.0f) {
      level = round;
      ++round;
      break;
    }
  }
  if (level < 0 || predicted < 0 || level > predicted) {
    cand->key.clear();
    cand->index.clear();
    Compact<T, kStrict>(ctx, x, counts, t, level, blocks, cand);
  }  // else the fused pass already holds a superset of the candidates
  for (; round < rounds && !bis.accepted(); ++round) {
    bis.Update(CountPassing<kStrict>(ctx, cand->key, bis.NextThreshold()));
  }
  if (mode == TopKSampleMode::kMsTopK) return MsTopKPlan(bis, n, k, seed);
  if (bis.has_lo()) return ThresholdPlan(bis);
  return ExactTopK(*cand, k);  // no count above k: candidates are everything
}

// Trimmed top-k: the highest of the ratios 0.8, 0.6, ..., 0 whose threshold
// at least k keys exceed bounds the candidates; exact top-k among them.
template <typename T>
SelectionPlan TrimmedPlan(OpKernelContext* ctx, const T* x, int64_t n,
                          int64_t k, const Stats& st, Candidates* cand) {
  std::array<float, kCoarse> t;
  t.fill(std::numeric_limits<float>::quiet_NaN());
  for (int j = 0; j < kTrimmedSteps; ++j) {
    t[j] = Threshold(st.mean, st.diff, kTrimmedRatios[j]);
  }
  Blocks blocks(n, NumThreads(ctx));
  double fraction = 0.0;
  const int predicted =
      PredictLevel<T, true>(x, n, k, t, kTrimmedSteps, true, &fraction);
  const auto counts = CountAndCompact<T, true>(ctx, x, t, predicted,
                                               fraction, blocks, cand);
  int level = -1;
  for (int j = 0; j < kTrimmedSteps; ++j) {
    if (TotalCount(counts, j) >= k) {
      level = j;
      break;
    }
  }
  if (level < 0 || predicted < 0 || level > predicted) {
    cand->key.clear();
    cand->index.clear();
    Compact<T, true>(ctx, x, counts, t, level, blocks, cand);
  }
  return ExactTopK(*cand, k);
}

template <typename T>
SelectionPlan PlanCpu(OpKernelContext* ctx, const T* x, int64_t n, int64_t k,
                      TopKSampleMode mode, int rounds, int64_t seed,
                      const Stats& st, Candidates* cand) {
  switch (mode) {
    case TopKSampleMode::kMsTopK:
      return BisectionPlan<T, false>(ctx, x, n, k, mode, rounds, seed, st,
                                     cand);
    case TopKSampleMode::kThreshold:
      return BisectionPlan<T, true>(ctx, x, n, k, mode, rounds, seed, st,
                                    cand);
    case TopKSampleMode::kTrimmed:
      return TrimmedPlan<T>(ctx, x, n, k, st, cand);
  }
  return SelectionPlan();
}

// Writes the plan's selection from the candidates, in index order.
template <typename T>
absl::Status Extract(const T* x, const Candidates& cand,
                     const SelectionPlan& p, T* values, int32_t* indices,
                     T* zero) {
  int64_t out = 0;
  int64_t band_rank = 0;
  const int64_t band_end = p.start + p.need;
  const int64_t size = static_cast<int64_t>(cand.key.size());
  for (int64_t c = 0; c < size; ++c) {
    const float a = cand.key[c];
    bool take;
    if (IsAbove(p, a)) {
      take = true;
    } else if (!p.has_band_lo || a >= p.band_lo) {
      take = band_rank >= p.start && band_rank < band_end;
      ++band_rank;
    } else {
      take = false;
    }
    if (take) {
      if (out >= p.output_size) break;
      const int32_t i = cand.index[c];
      values[out] = x[i];
      indices[out] = i;
      if (zero != nullptr) zero[i] = static_cast<T>(0.0f);
      ++out;
    }
  }
  if (out != p.output_size) {
    return absl::InternalError(absl::StrCat(
        "TopKSample selected ", out, " elements but planned ", p.output_size,
        " (candidates=", size, ", need=", p.need, ", start=", p.start, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseMode(const std::string& s, TopKSampleMode* mode) {
  if (s == "mstopk") {
    *mode = TopKSampleMode::kMsTopK;
  } else if (s == "threshold") {
    *mode = TopKSampleMode::kThreshold;
  } else if (s == "trimmed") {
    *mode = TopKSampleMode::kTrimmed;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "`mode` must be one of mstopk, threshold, trimmed. Received: mode=",
        s));
  }
  return absl::OkStatus();
}

// Validates k and seed against n and reads them.
template <typename Tk>
absl::Status ValidateArgs(int64_t n, const Tensor& k_t, const Tensor& seed_t,
                          int64_t* k, int64_t* seed) {
  if (!TensorShapeUtils::IsScalar(k_t.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`k` must be a scalar. Received: shape=", k_t.shape().DebugString()));
  }
  if (!TensorShapeUtils::IsScalar(seed_t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("`seed` must be a scalar. Received: shape=",
                     seed_t.shape().DebugString()));
  }
  if (n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TopKSample supports at most 2^31 - 1 elements (int32 indices). "
        "Received: n=",
        n));
  }
  *k = static_cast<int64_t>(k_t.scalar<Tk>()());
  if (*k < 0 || *k > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`k` must be in [0, n]. Received: k=", *k, ", n=", n));
  }
  *seed = seed_t.scalar<int64_t>()();
  return absl::OkStatus();
}

// The attributes `mode` and `rounds` of both ops, validated.
class TopKSampleOpBase : public OpKernel {
 public:
  explicit TopKSampleOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string mode;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mode", &mode));
    OP_REQUIRES_OK(ctx, ParseMode(mode, &mode_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounds", &rounds_));
    OP_REQUIRES(ctx, rounds_ >= 1 && rounds_ <= 64,
                absl::InvalidArgumentError(absl::StrCat(
                    "`rounds` must be in [1, 64]. Received: rounds=",
                    rounds_)));
  }

 protected:
  TopKSampleMode mode_;
  int rounds_;
};

absl::Status CheckSameShape(const Tensor& gradient, const Tensor& residual) {
  if (gradient.shape() == residual.shape()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "`gradient` and `residual` must have the same shape. "
      "Received: gradient.shape=",
      gradient.shape().DebugString(),
      ", residual.shape=", residual.shape().DebugString()));
}

// Allocates outputs 0 and 1, the values and indices of `size` entries.
absl::Status AllocateSelection(OpKernelContext* ctx, int64_t size,
                               Tensor** values, Tensor** indices) {
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({size}), values));
  return ctx->allocate_output(1, TensorShape({size}), indices);
}

// TopKSample (inputs x, k, seed) or, kWithResidual, TopKSampleWithResidual
// (inputs gradient, residual, k, seed; output 2 the new residual, which
// holds acc = gradient + residual until the selected entries are zeroed).
template <typename T, typename Tk, bool kWithResidual>
class TopKSampleOp : public TopKSampleOpBase {
 public:
  using TopKSampleOpBase::TopKSampleOpBase;

  void Compute(OpKernelContext* ctx) override {
    const int extra = kWithResidual ? 1 : 0;
    const Tensor& x = ctx->input(0);
    if (kWithResidual) OP_REQUIRES_OK(ctx, CheckSameShape(x, ctx->input(1)));
    const int64_t n = x.NumElements();
    int64_t k = 0, seed = 0;
    OP_REQUIRES_OK(ctx, ValidateArgs<Tk>(n, ctx->input(1 + extra),
                                         ctx->input(2 + extra), &k, &seed));
    const T* xp = x.flat<T>().data();
    T* zero = nullptr;  // where the selected entries are zeroed, if anywhere
    Stats st;
    if (kWithResidual) {
      const Tensor& r = ctx->input(1);
      Tensor* acc = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              {1}, 2, r.shape(), &acc));
      zero = acc->flat<T>().data();
      st = AddAndComputeStats(ctx, xp, r.flat<T>().data(), zero, n);
      xp = zero;
    } else if (k > 0) {
      st = ComputeStats(ctx, xp, n);
    }
    Candidates cand;
    SelectionPlan plan;
    if (k > 0) plan = PlanCpu(ctx, xp, n, k, mode_, rounds_, seed, st, &cand);
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx,
                   AllocateSelection(ctx, plan.output_size, &values, &indices));
    if (plan.output_size == 0) return;
    OP_REQUIRES_OK(ctx, Extract(xp, cand, plan, values->flat<T>().data(),
                                indices->flat<int32_t>().data(), zero));
  }
};

#define REGISTER_CPU(T, Tk)                                        \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSample")                  \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tk>("Tk"),           \
                          TopKSampleOp<T, Tk, false>);             \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleWithResidual")      \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tk>("Tk"),           \
                          TopKSampleOp<T, Tk, true>);

#define REGISTER_CPU_ALL_K(T) \
  REGISTER_CPU(T, int32_t)    \
  REGISTER_CPU(T, int64_t)

REGISTER_CPU_ALL_K(float)
REGISTER_CPU_ALL_K(Eigen::half)
REGISTER_CPU_ALL_K(Eigen::bfloat16)

#undef REGISTER_CPU_ALL_K
#undef REGISTER_CPU

#if GOOGLE_CUDA
// ---------------------------------------------------------------------------
// GPU glue: k and seed live in host memory; the CUDA launchers of
// top_k_sample_kernels.cu.cc synchronise with the host for the bisection
// and the (variable) output size.
// ---------------------------------------------------------------------------
using GPUDevice = Eigen::GpuDevice;

template <typename T>
constexpr gpu::DType GpuDType();
template <>
constexpr gpu::DType GpuDType<float>() {
  return gpu::DType::kFloat;
}
template <>
constexpr gpu::DType GpuDType<Eigen::half>() {
  return gpu::DType::kHalf;
}
template <>
constexpr gpu::DType GpuDType<Eigen::bfloat16>() {
  return gpu::DType::kBfloat16;
}

absl::Status CudaStatus(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("TopKSample CUDA launcher ", what, " failed: error ", err));
}

template <typename T, typename Tk, bool kWithResidual>
class TopKSampleGpuOp : public TopKSampleOpBase {
 public:
  using TopKSampleOpBase::TopKSampleOpBase;

  void Compute(OpKernelContext* ctx) override {
    const int extra = kWithResidual ? 1 : 0;
    const Tensor& x_in = ctx->input(0);
    const int64_t n = x_in.NumElements();
    int64_t k = 0, seed = 0;
    OP_REQUIRES_OK(ctx, ValidateArgs<Tk>(n, ctx->input(1 + extra),
                                         ctx->input(2 + extra), &k, &seed));
    void* stream = ctx->eigen_device<GPUDevice>().stream();
    const void* x = x_in.flat<T>().data();
    void* zero = nullptr;
    if (kWithResidual) {
      const Tensor& r = ctx->input(1);
      OP_REQUIRES_OK(ctx, CheckSameShape(x_in, r));
      Tensor* acc = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              {1}, 2, r.shape(), &acc));
      OP_REQUIRES_OK(ctx, CudaStatus(gpu::AddResidual(
                                         GpuDType<T>(), x, r.flat<T>().data(),
                                         acc->flat<T>().data(), n, stream),
                                     "AddResidual"));
      x = acc->flat<T>().data();
      zero = acc->flat<T>().data();
    }
    Tensor scratch;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_temp(tensorflow::DT_INT8,
                                TensorShape({gpu::TopKSampleScratchBytes(n)}),
                                &scratch));
    void* scratch_p = scratch.flat<int8_t>().data();
    SelectionPlan plan;
    OP_REQUIRES_OK(ctx, CudaStatus(gpu::TopKSamplePlan(
                                       GpuDType<T>(), x, n, k, mode_, rounds_,
                                       seed, scratch_p, stream, &plan),
                                   "Plan"));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx,
                   AllocateSelection(ctx, plan.output_size, &values, &indices));
    if (plan.output_size == 0) return;
    OP_REQUIRES_OK(
        ctx, CudaStatus(gpu::TopKSampleWrite(
                            GpuDType<T>(), x, n, plan,
                            values->flat<T>().data(),
                            indices->flat<int32_t>().data(), zero, scratch_p,
                            stream),
                        "Write"));
  }
};

#define REGISTER_GPU(T, Tk)                                          \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSample")                    \
                              .Device(tensorflow::DEVICE_GPU)        \
                              .HostMemory("k")                       \
                              .HostMemory("seed")                    \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<Tk>("Tk"),             \
                          TopKSampleGpuOp<T, Tk, false>);            \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleWithResidual")        \
                              .Device(tensorflow::DEVICE_GPU)        \
                              .HostMemory("k")                       \
                              .HostMemory("seed")                    \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<Tk>("Tk"),             \
                          TopKSampleGpuOp<T, Tk, true>);

#define REGISTER_GPU_ALL_K(T) \
  REGISTER_GPU(T, int32_t)    \
  REGISTER_GPU(T, int64_t)

REGISTER_GPU_ALL_K(float)
REGISTER_GPU_ALL_K(Eigen::half)
REGISTER_GPU_ALL_K(Eigen::bfloat16)

#undef REGISTER_GPU_ALL_K
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
