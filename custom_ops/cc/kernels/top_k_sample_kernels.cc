// Copyright 2026 The tfgc Authors.
//
// CPU kernels of Tfgc>TopKSample and Tfgc>TopKSampleWithResidual (and the
// TensorFlow glue of their CUDA kernels when built with GOOGLE_CUDA).
//
// The CPU algorithm reads the input two or three times whatever `rounds` is:
//   1. statistics: sum, max and count of the finite keys (fused with
//      acc = gradient + residual in the residual variant);
//   2. counts at six thresholds: for the bisection the ratios 1/2, 1/4, ...,
//      1/64 it visits first, which answer the first rounds and bound all
//      later thresholds from below; for trimmed top-k its five ratios plus
//      a threshold about 1.5 k keys exceed. For inputs of 256 Ki keys or
//      more, a sample of 64 Ki keys (256 runs of 256) predicts the bound
//      (or that threshold) and the same pass compacts the elements above it
//      as candidates (value and index);
//   3. only when there was no prediction or it was wrong: an ordered
//      compaction of the candidates at the exact bound;
// then the remaining rounds run on the candidates (dropping those below the
// bisection's lower end as it rises), trimmed top-k finds the k-th largest
// key by radix selection, and the selection is written from the candidates.
// Every full pass is split into fixed blocks run on the intra-op thread
// pool, and every result is exactly the one of the pure-TF reference. The
// two full passes have AVX2 versions (simd.h), chosen at run time, that read
// float32, float16 (F16C) and bfloat16 directly, eight keys per instruction.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/simd.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"
#include "tensorflow/core/framework/register_types.h"


#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#include "unsupported/Eigen/CXX11/Tensor"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace {

// The key of the header of an element of type T (float16 and bfloat16
// convert to float32 exactly).
template <typename T>
inline uint32_t ElementKey(T x) {
  return KeyOf(static_cast<float>(x));
}

// A finite key as the float32 magnitude that the statistics add: 0 when it
// is subnormal.
inline float StatsMagnitude(uint32_t key) {
  const uint32_t bits = key < kMinNormalKey ? 0 : key;
  float a;
  std::memcpy(&a, &bits, sizeof(a));
  return a;
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

// Adds element key `key` to the lane's sum and to the max and count.
inline void AccumulateKey(uint32_t key, double* sum, float* mx,
                          int64_t* finite) {
  const bool ok = key < kInfKey;
  const float a = ok ? StatsMagnitude(key) : 0.0f;  // 0 or normal
  *sum += a;
  *mx = a > *mx ? a : *mx;
  *finite += ok;
}

template <typename T>
inline void AccumulateScalar(const T* x, int64_t begin, int64_t end,
                             BlockStats* out) {
  double sum[4] = {0.0, 0.0, 0.0, 0.0};
  float mx = 0.0f;
  int64_t finite = 0;
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    for (int l = 0; l < 4; ++l) {
      AccumulateKey(ElementKey(x[i + l]), &sum[l], &mx, &finite);
    }
  }
  for (; i < end; ++i) AccumulateKey(ElementKey(x[i]), &sum[0], &mx, &finite);
  out->sum = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  out->max = mx;
  out->finite = finite;
}

#if TFGC_HAVE_AVX2_PATH
// The keys of x[0..8) (min_epi32: NaN patterns are above +inf's).
template <typename T>
TFGC_AVX2 inline __m256i LoadKey8(const T* p) {
  const __m256i bits = _mm256_castps_si256(LoadMagnitude8(p));
  return _mm256_min_epi32(bits, _mm256_set1_epi32(kInfKey));
}

// Lanes of `key` that are finite (all ones) and, in `*use`, the finite
// keys as the statistics add them: subnormal ones as 0.
TFGC_AVX2 inline __m256i FiniteKeys8(__m256i key, __m256* use) {
  const __m256i finite =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(kInfKey), key);
  const __m256i normal =
      _mm256_cmpgt_epi32(key, _mm256_set1_epi32(kMinNormalKey - 1));
  *use = _mm256_castsi256_ps(
      _mm256_and_si256(key, _mm256_and_si256(finite, normal)));
  return finite;
}

// Statistics sixteen keys at a time: finite keys masked in, widened to
// double in four accumulators (fixed lane order: deterministic).
template <typename T>
TFGC_AVX2 void AccumulateAvx2(const T* x, int64_t begin, int64_t end,
                              BlockStats* out) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  __m256d s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
  __m256 mx = _mm256_setzero_ps();
  __m256i cnt = _mm256_setzero_si256();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m256 ma, mb;  // 0 or normal: no float mode changes sums or maxima
    const __m256i fa = FiniteKeys8(LoadKey8(x + i), &ma);
    const __m256i fb = FiniteKeys8(LoadKey8(x + i + 8), &mb);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(ma)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(ma, 1)));
    s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm256_castps256_ps128(mb)));
    s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm256_extractf128_ps(mb, 1)));
    mx = _mm256_max_ps(mx, _mm256_max_ps(ma, mb));
    cnt = _mm256_sub_epi32(cnt, fa);
    cnt = _mm256_sub_epi32(cnt, fb);
  }
  alignas(32) double d[16];
  _mm256_store_pd(d, s0);
  _mm256_store_pd(d + 4, s1);
  _mm256_store_pd(d + 8, s2);
  _mm256_store_pd(d + 12, s3);
  alignas(32) float m[8];
  _mm256_store_ps(m, mx);
  BlockStats tail;
  AccumulateScalar(x + i, 0, end - i, &tail);  // < 16 keys left
  double sum = tail.sum;
  for (double v : d) sum += v;
  float mxs = tail.max;
  for (float v : m) mxs = std::max(mxs, v);
  out->sum = sum;
  out->max = mxs;
  out->finite = tail.finite + HorizontalSum(cnt);
}
#endif  // TFGC_HAVE_AVX2_PATH

template <typename T>
inline void Accumulate(const T* x, int64_t begin, int64_t end,
                       BlockStats* out) {
#if TFGC_HAVE_AVX2_PATH
  if (UseAvx2()) return AccumulateAvx2(x, begin, end, out);
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
  s.mean = Mean(sum, finite);
  s.max = finite > 0 ? mx : 0.0f;
  s.diff = Diff(s.max, s.mean);
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
// kNoKey, which no key passes).
constexpr int kCoarse = 6;

// The keys of the coarse thresholds.
using CoarseKeys = std::array<uint32_t, kCoarse>;

// Whether `key` passes threshold key `t`: key >= t, or key > t when kStrict.
template <bool kStrict>
inline bool Passes(uint32_t key, uint32_t t) {
  return kStrict ? key > t : key >= t;
}

// Growable, uninitialised (value, index) storage for one block's candidates.
struct CandidateBuffer {
  std::unique_ptr<float[]> value;
  std::unique_ptr<int32_t[]> index;
  int64_t size = 0;
  int64_t capacity = 0;

  void Reserve(int64_t want) {
    if (want <= capacity) return;
    const int64_t cap = std::max(want, 2 * capacity);
    std::unique_ptr<float[]> v(new float[cap]);
    std::unique_ptr<int32_t[]> i(new int32_t[cap]);
    std::copy(value.get(), value.get() + size, v.get());
    std::copy(index.get(), index.get() + size, i.get());
    value = std::move(v);
    index = std::move(i);
    capacity = cap;
  }
};

// Candidates hold the element's value (as float, exactly) rather than its
// key, so that writing the selection never reads the input again. The
// kernel keeps one Candidates between calls: the fresh pages of a few MB of
// candidates cost more than the pass that fills them.
struct Candidates {
  std::vector<float> value;
  std::vector<int32_t> index;
  std::vector<CandidateBuffer> parts;  // per-block output of the fused pass
  std::vector<uint32_t> radix;         // ExactTopK's keys
};

// Appends element i (value v) to the candidates.
inline void Append(float v, int64_t i, CandidateBuffer* part) {
  part->value[part->size] = v;
  part->index[part->size] = static_cast<int32_t>(i);
  ++part->size;
}

// Adds to c[j] the number of keys of x[begin, end) passing th[j] and appends
// the elements passing `thr` (none when thr is kNoKey) to `part`, in index
// order. The caller reserved room for every element of the range.
template <typename T, bool kStrict>
void CountRangeScalar(const T* x, int64_t begin, int64_t end,
                      const uint32_t* th, uint32_t thr, int64_t* c,
                      CandidateBuffer* part) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = static_cast<float>(x[i]);
    const uint32_t a = KeyOf(v);
    for (int j = 0; j < kCoarse; ++j) c[j] += Passes<kStrict>(a, th[j]);
    if (Passes<kStrict>(a, thr)) Append(v, i, part);
  }
}

#if TFGC_HAVE_AVX2_PATH
// CountRangeScalar eight keys per compare. The append is branch-free: the
// passing lanes are permuted to the front and all eight stored, and the
// size grows by their number, so `part` needs 8 slots of slack.
template <typename T, bool kStrict>
TFGC_AVX2 void CountRangeAvx2(const T* x, int64_t begin, int64_t end,
                              const uint32_t* th, uint32_t thr, int64_t* c,
                              CandidateBuffer* part) {
  // Keys are at most 0x7f800000, so signed compares order them, and
  // key >= t is key > t - 1 (t - 1 = -1 passes every key; kNoKey - 1 none).
  const uint32_t below = kStrict ? 0 : 1;
  __m256i t[kCoarse];
  __m256i acc[kCoarse];
  for (int j = 0; j < kCoarse; ++j) {
    t[j] = _mm256_set1_epi32(static_cast<int32_t>(th[j] - below));
    acc[j] = _mm256_setzero_si256();
  }
  const __m256i tl = _mm256_set1_epi32(static_cast<int32_t>(thr - below));
  const LeftPackTable& pack = LeftPack();
  float* out_value = part->value.get();
  int32_t* out_index = part->index.get();
  int64_t size = part->size;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 raw = LoadFloat8(x + i);
    const __m256i v = _mm256_min_epi32(
        _mm256_castps_si256(Abs8(raw)), _mm256_set1_epi32(kInfKey));
    for (int j = 0; j < kCoarse; ++j) {
      acc[j] = _mm256_sub_epi32(acc[j], _mm256_cmpgt_epi32(v, t[j]));
    }
    const int bits = _mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(v, tl)));
    const __m256i lanes = _mm256_load_si256(
        reinterpret_cast<const __m256i*>(pack.lanes[bits]));
    _mm256_storeu_ps(out_value + size, _mm256_permutevar8x32_ps(raw, lanes));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out_index + size),
        _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int32_t>(i))));
    size += __builtin_popcount(bits);
  }
  part->size = size;
  for (int j = 0; j < kCoarse; ++j) c[j] += HorizontalSum(acc[j]);
  CountRangeScalar<T, kStrict>(x, i, end, th, thr, c, part);  // < 8 left
}
#endif  // TFGC_HAVE_AVX2_PATH

template <typename T, bool kStrict>
void CountRange(const T* x, int64_t begin, int64_t end, const uint32_t* th,
                uint32_t thr, int64_t* c, CandidateBuffer* part) {
#if TFGC_HAVE_AVX2_PATH
  if (UseAvx2()) {
    return CountRangeAvx2<T, kStrict>(x, begin, end, th, thr, c, part);
  }
#endif
  CountRangeScalar<T, kStrict>(x, begin, end, th, thr, c, part);
}

// The samples that predict where to compact: kRuns runs of kRun
// consecutive keys (16 cache lines, prefetched, read far faster than 64 Ki
// keys one cache line apart), spread evenly, in inputs of kMinSampled keys
// or more (below that the exact passes are cheap).
constexpr int64_t kRuns = 256;
constexpr int64_t kRun = 256;
constexpr int64_t kMinSampled = 4 * kRuns * kRun;

inline int64_t RunBegin(int64_t n, int64_t r) {
  const int64_t stride = n / kRuns;
  return r * stride + (stride - kRun) / 2;
}

// Predicts, from the samples, the coarse level the counts will choose: the
// first j whose count is `> k`, one level lower when the estimate is within
// 25 % of k (a superset is needed, so the prediction errs low). Returns -1
// for no prediction and sets `*fraction` to the sampled fraction of keys
// passing the predicted level.
template <typename T, bool kStrict>
int PredictLevel(const T* x, int64_t n, int64_t k, const CoarseKeys& t,
                 int levels, double* fraction) {
  if (n < kMinSampled) return -1;
  int64_t c[kCoarse] = {0};
  CandidateBuffer none;  // nothing passes kNoKey; the AVX2 path needs slack
  none.Reserve(8);
  for (int64_t r = 0; r < kRuns; ++r) {
    const int64_t begin = RunBegin(n, r);
    CountRange<T, kStrict>(x, begin, begin + kRun, t.data(), kNoKey, c,
                           &none);
  }
  const int64_t samples = kRuns * kRun;
  for (int j = 0; j < levels; ++j) {
    const double est = static_cast<double>(c[j]) * n / samples;
    if (est > k) {
      const int level = est < 1.25 * k ? std::min(j + 1, levels - 1) : j;
      *fraction = static_cast<double>(c[level]) / samples;
      return level;
    }
  }
  return -1;
}

// One pass: per-block counts of the keys passing each coarse threshold
// (key >= t, or key > t when kStrict; unused slots are kNoKey, which no key
// passes) and, when level >= 0, the
// elements passing t[level] in index order into `cand`.
template <typename T, bool kStrict>
std::vector<std::array<int64_t, kCoarse>> CountAndCompact(
    OpKernelContext* ctx, const T* x, const CoarseKeys& t, int level,
    double fraction, const Blocks& blocks, Candidates* cand) {
  std::vector<std::array<int64_t, kCoarse>> counts(blocks.count());
  std::vector<CandidateBuffer>& parts = cand->parts;
  if (static_cast<int64_t>(parts.size()) < blocks.count()) {
    parts.resize(blocks.count());
  }
  for (CandidateBuffer& part : parts) part.size = 0;
  const uint32_t append_thr = level >= 0 ? t[level] : kNoKey;
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t c[kCoarse] = {0};
    CandidateBuffer& part = parts[b];
    const int64_t end = blocks.end(b);
    // Chunks bound what one call may append (plus CountRangeAvx2's slack);
    // the buffer grows between them.
    constexpr int64_t kChunk = 4096;
    if (level >= 0) {
      part.Reserve(static_cast<int64_t>(
          1.25 * fraction * static_cast<double>(end - blocks.begin(b)) +
          kChunk + 8));
    }
    for (int64_t c0 = blocks.begin(b); c0 < end; c0 += kChunk) {
      const int64_t ce = std::min(end, c0 + kChunk);
      part.Reserve(part.size + (ce - c0) + 8);
      CountRange<T, kStrict>(x, c0, ce, t.data(), append_thr, c, &part);
    }
    for (int j = 0; j < kCoarse; ++j) counts[b][j] = c[j];
  });
  if (level >= 0) {
    int64_t total = 0;
    for (int64_t b = 0; b < blocks.count(); ++b) total += parts[b].size;
    cand->value.reserve(total);
    cand->index.reserve(total);
    for (int64_t b = 0; b < blocks.count(); ++b) {
      const CandidateBuffer& part = parts[b];
      cand->value.insert(cand->value.end(), part.value.get(),
                         part.value.get() + part.size);
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
// (all of them when level < 0).
template <typename T, bool kStrict>
void Compact(OpKernelContext* ctx, const T* x,
             const std::vector<std::array<int64_t, kCoarse>>& counts,
             const CoarseKeys& t, int level, const Blocks& blocks,
             Candidates* out) {
  std::vector<int64_t> offsets(blocks.count() + 1, 0);
  for (int64_t b = 0; b < blocks.count(); ++b) {
    const int64_t c =
        level >= 0 ? counts[b][level] : blocks.end(b) - blocks.begin(b);
    offsets[b + 1] = offsets[b] + c;
  }
  out->value.resize(offsets.back());
  out->index.resize(offsets.back());
  const uint32_t thr = level >= 0 ? t[level] : 0;
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t o = offsets[b];
    const int64_t end = blocks.end(b);
    float* value = out->value.data();
    int32_t* index = out->index.data();
    if (level < 0) {
      for (int64_t i = blocks.begin(b); i < end; ++i, ++o) {
        value[o] = static_cast<float>(x[i]);
        index[o] = static_cast<int32_t>(i);
      }
      return;
    }
    for (int64_t i = blocks.begin(b); i < end; ++i) {
      const float v = static_cast<float>(x[i]);
      if (Passes<kStrict>(KeyOf(v), thr)) {
        value[o] = v;
        index[o] = static_cast<int32_t>(i);
        ++o;
      }
    }
  });
}

// Number of candidate keys >= thr (> thr when kStrict).
template <bool kStrict>
int64_t CountPassing(OpKernelContext* ctx, const std::vector<float>& value,
                     uint32_t thr) {
  const int64_t n = static_cast<int64_t>(value.size());
  // Below 256 Ki keys one thread beats waking the pool every round.
  Blocks blocks(n, NumThreads(ctx), int64_t{1} << 18);
  std::vector<int64_t> part(blocks.count(), 0);
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t c = 0;
    const float* v = value.data();
    const int64_t end = blocks.end(b);
    for (int64_t i = blocks.begin(b); i < end; ++i) {
      c += Passes<kStrict>(KeyOf(v[i]), thr);
    }
    part[b] = c;
  });
  int64_t total = 0;
  for (int64_t c : part) total += c;
  return total;
}

// Keeps, in order, the candidates whose key is >= thr (> thr when kStrict).
template <bool kStrict>
void Prune(uint32_t thr, Candidates* cand) {
  const int64_t n = static_cast<int64_t>(cand->value.size());
  float* v = cand->value.data();
  int32_t* idx = cand->index.data();
  int64_t out = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = KeyOf(v[i]);
    v[out] = v[i];
    idx[out] = idx[i];
    out += Passes<kStrict>(a, thr);
  }
  cand->value.resize(out);
  cand->index.resize(out);
}

// Exact top-k of the candidates (which hold every key >= the k-th largest):
// the k-th largest key by radix selection, 11 + 11 + 10 bits at a time,
// each pass over the keys that share the digits found so far.
SelectionPlan ExactTopK(Candidates* cand, int64_t k) {
  std::vector<uint32_t>& keys = cand->radix;
  keys.resize(cand->value.size());
  std::transform(cand->value.begin(), cand->value.end(), keys.begin(),
                 [](float v) { return KeyOf(v); });  // at most kInfKey
  uint32_t prefix = 0;
  int64_t need = k;  // rank of the k-th largest among the remaining keys
  constexpr int kShifts[3] = {21, 10, 0};
  constexpr int kWidths[3] = {11, 11, 10};
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShifts[pass];
    const uint32_t digits = (uint32_t{1} << kWidths[pass]) - 1;
    std::vector<int64_t> hist(digits + 1, 0);
    for (uint32_t u : keys) ++hist[(u >> shift) & digits];
    uint32_t d = digits;
    while (hist[d] < need) need -= hist[d--];  // sum of all hist >= need
    prefix |= d << shift;
    const uint32_t mask = ~uint32_t{0} << shift;
    keys.erase(std::remove_if(keys.begin(), keys.end(),
                              [&](uint32_t u) { return (u & mask) != prefix; }),
               keys.end());
  }
  // need = how many keys equal to `prefix` the selection takes.
  return ExactPlan(prefix, k - need, k);
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
  CoarseKeys t;
  float ratio = 1.0f;
  for (int j = 0; j < kCoarse; ++j) {
    ratio *= 0.5f;
    t[j] = KeyOf(Threshold(st.mean, st.diff, ratio));
  }
  Blocks blocks(n, NumThreads(ctx));
  double fraction = 0.0;
  const int predicted = PredictLevel<T, kStrict>(
      x, n, k, t, std::min(rounds, kCoarse), &fraction);
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
    cand->value.clear();
    cand->index.clear();
    Compact<T, kStrict>(ctx, x, counts, t, level, blocks, cand);
  }  // else the fused pass already holds a superset of the candidates
  for (; round < rounds && !bis.accepted(); ++round) {
    bis.Update(CountPassing<kStrict>(ctx, cand->value, bis.NextKey()));
    // Later thresholds and the final selection lie above the lowest count
    // > k: drop what is below once that halves the candidates.
    if (bis.has_lo() &&
        2 * bis.lo_count() <= static_cast<int64_t>(cand->value.size())) {
      Prune<kStrict>(KeyOf(bis.lo_thr()), cand);
    }
  }
  if (mode == TopKSampleMode::kMsTopK) return MsTopKPlan(bis, n, k, seed);
  if (bis.has_lo()) return ThresholdPlan(bis);
  return ExactTopK(cand, k);  // no count above k: candidates are everything
}

// A threshold that, judged from the samples, about 1.5 k keys (plus three
// standard deviations) exceed. False when there is no such prediction.
template <typename T>
bool SampledThreshold(const T* x, int64_t n, int64_t k, uint32_t* thr,
                      double* fraction) {
  if (n < kMinSampled) return false;
  std::vector<uint32_t> keys;
  keys.reserve(kRuns * kRun);
  for (int64_t r = 0; r < kRuns; ++r) {
    const int64_t begin = RunBegin(n, r);
    for (int64_t i = begin; i < begin + kRun; ++i) {
      keys.push_back(ElementKey(x[i]));
    }
  }
  const int64_t samples = static_cast<int64_t>(keys.size());
  const double expect = static_cast<double>(k) * samples / n;
  const auto rank = static_cast<int64_t>(
      std::ceil(1.5 * expect + 3.0 * std::sqrt(expect) + 4.0));
  if (rank >= samples) return false;
  std::nth_element(keys.begin(), keys.begin() + rank, keys.end(),
                   [](uint32_t a, uint32_t b) { return a > b; });
  *thr = keys[rank];
  *fraction = static_cast<double>(rank) / samples;
  return true;
}

// Trimmed top-k is the exact top-k of the keys above the highest of the
// ratios 0.8, 0.6, ..., 0 whose threshold at least k keys exceed; that is
// the exact top-k whatever superset it is taken from. So the counting pass
// also counts a threshold predicted from the samples to hold about 1.5 k
// keys and compacts those; only when fewer than k keys exceed it (rare) is
// the reference's ratio level compacted in another pass.
template <typename T>
SelectionPlan TrimmedPlan(OpKernelContext* ctx, const T* x, int64_t n,
                          int64_t k, const Stats& st, Candidates* cand) {
  static_assert(kTrimmedSteps < kCoarse, "a slot for the sampled threshold");
  CoarseKeys t;
  t.fill(kNoKey);
  for (int j = 0; j < kTrimmedSteps; ++j) {
    t[j] = KeyOf(Threshold(st.mean, st.diff, kTrimmedRatios[j]));
  }
  int sampled = -1;
  double fraction = 0.0;
  if (SampledThreshold(x, n, k, &t[kTrimmedSteps], &fraction)) {
    sampled = kTrimmedSteps;
  }
  Blocks blocks(n, NumThreads(ctx));
  const auto counts = CountAndCompact<T, true>(ctx, x, t, sampled, fraction,
                                               blocks, cand);
  if (sampled >= 0 && TotalCount(counts, sampled) >= k) {
    return ExactTopK(cand, k);
  }
  int level = -1;  // none: every key is a candidate
  for (int j = 0; j < kTrimmedSteps; ++j) {
    if (TotalCount(counts, j) >= k) {
      level = j;
      break;
    }
  }
  cand->value.clear();
  cand->index.clear();
  Compact<T, true>(ctx, x, counts, t, level, blocks, cand);
  return ExactTopK(cand, k);
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
absl::Status Extract(const T* x, const SelectionPlan& p, Candidates* cand_p,
                     T* values, int32_t* indices, T* zero) {
  // Everything selected lies in the band or above it (strictly above
  // `above` when the band is empty): drop the rest first, branch-free.
  if (p.has_band_lo) {
    Prune<false>(p.band_lo, cand_p);
  } else if (p.need == 0 && p.has_above) {
    if (p.above_strict) {
      Prune<true>(p.above, cand_p);
    } else {
      Prune<false>(p.above, cand_p);
    }
  }
  const Candidates& cand = *cand_p;
  int64_t out = 0;
  int64_t band_rank = 0;
  const int64_t band_end = p.start + p.need;
  const int64_t size = static_cast<int64_t>(cand.value.size());
  for (int64_t c = 0; c < size; ++c) {
    const uint32_t a = KeyOf(cand.value[c]);
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
      const float v = cand.value[c];
      // float -> T is exact for values read from T; NaN payloads may not be.
      values[out] = std::isnan(v) ? x[i] : static_cast<T>(v);
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
  // Lends the kernel's kept Candidates for one Compute (a concurrent call
  // gets fresh ones) and takes them back, emptied but with their capacity.
  class CandidateLease {
   public:
    explicit CandidateLease(TopKSampleOpBase* op) : op_(op) {
      std::lock_guard<std::mutex> lock(op_->mu_);
      cand_ = std::move(op_->kept_);
      if (cand_ == nullptr) cand_ = std::make_unique<Candidates>();
    }
    ~CandidateLease() {
      cand_->value.clear();
      cand_->index.clear();
      std::lock_guard<std::mutex> lock(op_->mu_);
      op_->kept_ = std::move(cand_);
    }
    Candidates* get() { return cand_.get(); }

   private:
    TopKSampleOpBase* op_;
    std::unique_ptr<Candidates> cand_;
  };

  TopKSampleMode mode_;
  int rounds_;

 private:
  std::mutex mu_;
  std::unique_ptr<Candidates> kept_;
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
    CandidateLease lease(this);
    Candidates& cand = *lease.get();
    SelectionPlan plan;
    if (k > 0) plan = PlanCpu(ctx, xp, n, k, mode_, rounds_, seed, st, &cand);
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx,
                   AllocateSelection(ctx, plan.output_size, &values, &indices));
    if (plan.output_size == 0) return;
    OP_REQUIRES_OK(ctx, Extract(xp, plan, &cand, values->flat<T>().data(),
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
constexpr gpu::DType GpuDTypeOf() {
  return static_cast<gpu::DType>(GpuDType<T>());
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
                                         GpuDTypeOf<T>(), x, r.flat<T>().data(),
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
                                       GpuDTypeOf<T>(), x, n, k, mode_, rounds_,
                                       seed, scratch_p, stream, &plan),
                                   "Plan"));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx,
                   AllocateSelection(ctx, plan.output_size, &values, &indices));
    if (plan.output_size == 0) return;
    OP_REQUIRES_OK(
        ctx, CudaStatus(gpu::TopKSampleWrite(
                            GpuDTypeOf<T>(), x, n, plan,
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
