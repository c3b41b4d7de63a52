// Copyright 2026 The tfgc Authors.
//
// CPU kernels of Tfgc>TopKSample and Tfgc>TopKSampleWithResidual (and the
// TensorFlow glue of their CUDA kernels when built with GOOGLE_CUDA).
//
// The CPU algorithm reads the input once, whatever the data and `rounds`
// (PlanCpu says why this is exact): one pass, in chunks that stay in L1,
// computes the statistics (sum, max and count of the finite keys; trimmed
// top-k needs none), writes acc = gradient + residual in the residual
// variant, and compacts every element whose key is at least a floor taken
// from a sample of 64 Ki keys (value and index, in index order). Then the
// order statistics come from the candidates (two 11-bit histogram levels,
// then nth_element in one small bucket), the bisection runs on them without
// touching the data, and the selection is written from the candidates.
// Only when the sample misleads, or the bisection's lo threshold lies below
// the floor, is the compaction repeated at a lower floor. Every full pass
// is split into fixed blocks run on the intra-op thread pool, and every
// result is exactly the one of the pure-TF reference. The passes have AVX2
// versions (simd.h), chosen at run time, that read float32, float16 (F16C)
// and bfloat16 directly, eight keys per instruction.

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

// Whether `key` passes threshold key `t`: key >= t, or key > t when kStrict.
template <bool kStrict>
inline bool Passes(uint32_t key, uint32_t t) {
  return kStrict ? key > t : key >= t;
}

// Histogram of the top 11 bits of keys (keys <= 0x7f800000 < 2^31).
constexpr int kTopShift = 20;
using DigitHist = std::array<int64_t, 1 << 11>;

// The digit of `h`, searched from the top, that holds the r-th largest
// count; `*r` becomes the rank inside it.
int FindDigit(const DigitHist& h, int64_t* r) {
  int d = static_cast<int>(h.size()) - 1;
  while (h[d] < *r) *r -= h[d--];  // the counts add up to at least r
  return d;
}

// The r-th largest (1 <= r <= keys.size()) of `keys`, whose top-digit
// histogram is `top`, for each r of `ranks`: the top digit from `top`, the
// next 11 bits from one histogram pass over the keys, then nth_element
// among the few keys that share both digits.
template <size_t kRanks>
std::array<uint32_t, kRanks> KthLargest(const std::vector<uint32_t>& keys,
                                        const DigitHist& top,
                                        std::array<int64_t, kRanks> ranks,
                                        std::vector<uint32_t>* bucket) {
  constexpr int kNextShift = kTopShift - 11;
  std::array<uint32_t, kRanks> digit;
  for (size_t j = 0; j < kRanks; ++j) digit[j] = FindDigit(top, &ranks[j]);
  const std::array<int64_t, kRanks> in_digit = ranks;  // ranks in the digit
  std::array<DigitHist, kRanks> next{};
  for (uint32_t u : keys) {
    for (size_t j = 0; j < kRanks; ++j) {
      if ((u >> kTopShift) == digit[j]) ++next[j][(u >> kNextShift) & 0x7ffu];
    }
  }
  std::array<uint32_t, kRanks> out;
  for (size_t j = 0; j < kRanks; ++j) {
    if (j > 0 && digit[j] == digit[j - 1] && in_digit[j] == in_digit[j - 1]) {
      out[j] = out[j - 1];  // the same rank again
      continue;
    }
    const uint32_t prefix = digit[j] << 11 | FindDigit(next[j], &ranks[j]);
    bucket->clear();
    for (uint32_t u : keys) {
      if ((u >> kNextShift) == prefix) bucket->push_back(u);
    }
    const auto nth = bucket->begin() + (ranks[j] - 1);
    std::nth_element(bucket->begin(), nth, bucket->end(),
                     [](uint32_t a, uint32_t b) { return a > b; });
    out[j] = *nth;
  }
  return out;
}

void AddToHist(const uint32_t* keys, int64_t size, DigitHist* h) {
  for (int64_t i = 0; i < size; ++i) ++(*h)[keys[i] >> kTopShift];
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

// Candidates hold the element's value (as float, exactly) as well as its
// key, so that writing the selection reads the input again only for
// mstopk's band when it has no lower end (WriteWholeBand). The
// kernel keeps one Candidates between calls (the fresh pages of a few MB of
// candidates cost more than the pass that fills them), up to kKeptBytes.
struct Candidates {
  std::vector<float> value;
  std::vector<int32_t> index;
  std::vector<CandidateBuffer> parts;  // per-block output of the compaction
  std::vector<uint32_t> keys;          // the candidates' keys
  DigitHist keys_top;                  // their top-digit histogram
  std::vector<uint32_t> sample;        // the sampled keys
  DigitHist sample_top;
  std::vector<uint32_t> bucket;        // KthLargest's scratch

  int64_t Bytes() const {
    int64_t bytes = 4 * static_cast<int64_t>(value.capacity() +
                                             index.capacity() +
                                             keys.capacity() +
                                             sample.capacity() +
                                             bucket.capacity());
    for (const CandidateBuffer& p : parts) bytes += 8 * p.capacity;
    return bytes;
  }
};

// What a kernel keeps between calls: after one call on a huge or
// unfriendly input, more is released rather than kept for good.
constexpr int64_t kKeptBytes = int64_t{64} << 20;

// Appends element i (value v) to the candidates.
inline void Append(float v, int64_t i, CandidateBuffer* part) {
  part->value[part->size] = v;
  part->index[part->size] = static_cast<int32_t>(i);
  ++part->size;
}

// Appends the elements of x[begin, end) whose key is >= s to `part`, in
// index order. The caller reserved room for every element of the range.
template <typename T>
void AppendAtLeastScalar(const T* x, int64_t begin, int64_t end, uint32_t s,
                         CandidateBuffer* part) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = static_cast<float>(x[i]);
    if (KeyOf(v) >= s) Append(v, i, part);
  }
}

#if TFGC_HAVE_AVX2_PATH
// AppendAtLeastScalar eight keys per compare, branch-free: the passing
// lanes are permuted to the front and all eight stored, and the size grows
// by their number, so `part` needs 8 slots of slack.
template <typename T>
TFGC_AVX2 void AppendAtLeastAvx2(const T* x, int64_t begin, int64_t end,
                                 uint32_t s, CandidateBuffer* part) {
  // Keys are at most 0x7f800000, so signed compares order them, and
  // key >= s is key > s - 1 (s - 1 = -1 when s = 0: every key passes).
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(s - 1));
  const LeftPackTable& pack = LeftPack();
  float* out_value = part->value.get();
  int32_t* out_index = part->index.get();
  int64_t size = part->size;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 raw = LoadFloat8(x + i);
    const __m256i key = _mm256_min_epi32(_mm256_castps_si256(Abs8(raw)),
                                         _mm256_set1_epi32(kInfKey));
    const int bits = _mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, below)));
    const __m256i lanes = _mm256_load_si256(
        reinterpret_cast<const __m256i*>(pack.lanes[bits]));
    _mm256_storeu_ps(out_value + size, _mm256_permutevar8x32_ps(raw, lanes));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out_index + size),
        _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int32_t>(i))));
    size += __builtin_popcount(bits);
  }
  part->size = size;
  AppendAtLeastScalar(x, i, end, s, part);  // < 8 left
}
#endif  // TFGC_HAVE_AVX2_PATH

template <typename T>
void AppendAtLeast(const T* x, int64_t begin, int64_t end, uint32_t s,
                   CandidateBuffer* part) {
#if TFGC_HAVE_AVX2_PATH
  if (UseAvx2()) return AppendAtLeastAvx2(x, begin, end, s, part);
#endif
  AppendAtLeastScalar(x, begin, end, s, part);
}

// The data selected from: x itself, or acc = gradient + residual (added in
// T, as TensorFlow adds), which the first pass writes to `acc`.
template <typename T>
struct Input {
  const T* x;                   // x, or the gradient
  const T* residual = nullptr;  // null for TopKSample
  T* acc = nullptr;             // acc's storage (null for TopKSample)
  int64_t n = 0;

  T operator[](int64_t i) const {
    return residual == nullptr ? x[i] : static_cast<T>(x[i] + residual[i]);
  }
  // The data, once the first pass wrote acc.
  const T* data() const { return residual == nullptr ? x : acc; }
};

// One pass over the input: with a residual, acc = gradient + residual is
// written; with `stats`, the statistics are returned; every element whose
// key is >= s goes, in index order, into `cand` (value, index, key and the
// keys' top-digit histogram). It runs in chunks that stay in L1, so each
// chunk is read from memory once whatever it does. `fraction` estimates
// the share that passes, to size the per-block buffers.
template <typename T>
Stats Compact(OpKernelContext* ctx, const Input<T>& in, bool stats,
              uint32_t s, double fraction, Candidates* cand) {
  const int64_t n = in.n;
  Blocks blocks(n, NumThreads(ctx));
  std::vector<CandidateBuffer>& parts = cand->parts;
  if (static_cast<int64_t>(parts.size()) < blocks.count()) {
    parts.resize(blocks.count());
  }
  std::vector<BlockStats> block_stats(blocks.count());
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    CandidateBuffer& part = parts[b];
    part.size = 0;
    const int64_t begin = blocks.begin(b);
    const int64_t end = blocks.end(b);
    // Chunks also bound what one call may append (plus the AVX2 path's
    // slack); the buffer grows between them.
    constexpr int64_t kChunk = 2048;
    part.Reserve(static_cast<int64_t>(
        1.25 * fraction * static_cast<double>(end - begin) + kChunk + 8));
    BlockStats total;
    for (int64_t c = begin; c < end; c += kChunk) {
      const int64_t ce = std::min(end, c + kChunk);
      if (in.residual != nullptr) {
        for (int64_t i = c; i < ce; ++i) in.acc[i] = in[i];
      }
      const T* x = in.data();
      if (stats) {
        BlockStats chunk;
        Accumulate(x, c, ce, &chunk);
        total.sum += chunk.sum;
        total.max = std::max(total.max, chunk.max);
        total.finite += chunk.finite;
      }
      part.Reserve(part.size + (ce - c) + 8);
      AppendAtLeast(x, c, ce, s, &part);
    }
    block_stats[b] = total;
  });
  std::vector<int64_t> offsets(blocks.count() + 1, 0);
  for (int64_t b = 0; b < blocks.count(); ++b) {
    offsets[b + 1] = offsets[b] + parts[b].size;
  }
  const int64_t size = offsets.back();
  cand->value.resize(size);
  cand->index.resize(size);
  cand->keys.resize(size);
  std::vector<DigitHist> hists(blocks.count());
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    const CandidateBuffer& part = parts[b];
    const int64_t o = offsets[b];
    std::copy(part.value.get(), part.value.get() + part.size,
              cand->value.data() + o);
    std::copy(part.index.get(), part.index.get() + part.size,
              cand->index.data() + o);
    uint32_t* keys = cand->keys.data() + o;
    std::transform(part.value.get(), part.value.get() + part.size, keys,
                   [](float v) { return KeyOf(v); });
    hists[b].fill(0);
    AddToHist(keys, part.size, &hists[b]);
  });
  cand->keys_top.fill(0);
  for (const DigitHist& h : hists) {
    for (size_t d = 0; d < h.size(); ++d) cand->keys_top[d] += h[d];
  }
  return stats ? Combine(block_stats) : Stats();
}

// The keys that predict where to compact: all of them below kMinSampled
// elements, else kRuns runs of kRun consecutive keys (16 cache lines,
// prefetched, read far faster than 64 Ki keys one cache line apart),
// spread evenly.
constexpr int64_t kRuns = 256;
constexpr int64_t kRun = 256;
constexpr int64_t kMinSampled = 4 * kRuns * kRun;

template <typename T>
void DrawSample(const Input<T>& x, Candidates* cand) {
  const int64_t n = x.n;
  std::vector<uint32_t>& sample = cand->sample;
  sample.clear();
  if (n < kMinSampled) {
    for (int64_t i = 0; i < n; ++i) sample.push_back(ElementKey(x[i]));
  } else {
    const int64_t stride = n / kRuns;
    for (int64_t r = 0; r < kRuns; ++r) {
      const int64_t begin = r * stride + (stride - kRun) / 2;
      for (int64_t i = begin; i < begin + kRun; ++i) {
        sample.push_back(ElementKey(x[i]));
      }
    }
  }
  cand->sample_top.fill(0);
  AddToHist(sample.data(), static_cast<int64_t>(sample.size()),
            &cand->sample_top);
}

// A key that the r-th largest key of the n-element input reaches, judged
// from the sample: exactly the r-th largest when the sample is the whole
// input, otherwise the sample's key of rank r m / n plus four standard
// deviations and 8 (m sampled keys), so it is lower with high probability.
// 0 when the sample cannot tell; kNoRank when r > n.
int64_t LowerBoundOfRank(int64_t n, int64_t r, Candidates* cand) {
  if (r > n) return kNoRank;
  const auto m = static_cast<int64_t>(cand->sample.size());
  int64_t rank = r;
  if (m < n) {
    const double expect = static_cast<double>(r) * m / n;
    rank = static_cast<int64_t>(
        std::ceil(expect + 4.0 * std::sqrt(expect) + 8.0));
    if (rank > m) return 0;
  }
  return KthLargest<1>(cand->sample, cand->sample_top, {rank},
                       &cand->bucket)[0];
}

// Numbers of candidate keys >= a (> a when strict) and >= b.
std::array<int64_t, 2> CountCandidates(const Candidates& cand, uint32_t a,
                                       bool strict, uint32_t b) {
  std::array<int64_t, 2> c = {0, 0};
  for (uint32_t u : cand.keys) {
    c[0] += strict ? u > a : u >= a;
    c[1] += u >= b;
  }
  return c;
}

// Keeps, in order, the candidates whose key is >= thr (> thr when kStrict).
template <bool kStrict>
void Prune(uint32_t thr, Candidates* cand) {
  const auto n = static_cast<int64_t>(cand->value.size());
  float* v = cand->value.data();
  int32_t* idx = cand->index.data();
  uint32_t* key = cand->keys.data();
  int64_t out = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = key[i];
    v[out] = v[i];
    idx[out] = idx[i];
    key[out] = a;
    out += Passes<kStrict>(a, thr);
  }
  cand->value.resize(out);
  cand->index.resize(out);
  cand->keys.resize(out);
}

// Exact top-k of the candidates, which hold every key >= the k-th largest.
SelectionPlan ExactTopK(Candidates* cand, int64_t k) {
  const uint32_t v =
      KthLargest<1>(cand->keys, cand->keys_top, {k}, &cand->bucket)[0];
  return ExactPlan(v, CountCandidates(*cand, v, true, 0)[0], k);
}

// The share of the sampled keys that are >= floor.
double SampledShare(const Candidates& cand, int64_t floor) {
  int64_t passing = 0;
  for (uint32_t u : cand.sample) passing += u >= floor;
  return static_cast<double>(passing) /
         static_cast<double>(std::max<size_t>(1, cand.sample.size()));
}

// The selection of every mode rests on order statistics: trimmed top-k on
// the k-th largest key, and the bisections of mstopk and threshold, which
// BisectByOrder runs from the (k+1)-th and 2k-th largest keys, then on the
// counts at its final thresholds. So one pass over the input computes the
// statistics (not needed by trimmed top-k) and compacts every element whose
// key is at least a floor F, and the rest runs on the candidates:
//   - an order statistic of rank r is exact when at least r keys are
//     candidates; otherwise it is below F, which decides every comparison
//     with a threshold t >= F as well;
//   - the bisection's selection takes the keys >= its final lo threshold
//     (when mstopk has none, its band is every key below the hi threshold,
//     which WriteWholeBand reads straight from the input).
// F is the sample's lower bound of the largest rank the mode reads (but
// above 0: gradients may be mostly zeros). The lo threshold lies within one
// step of the bisection's grid, diff 2^-rounds, below the (k+1)-th key, so
// on most data the candidates hold it too. When they do not decide or hold
// the selection (a coarse grid, as with one huge outlier, or a misleading
// sample), the compaction is repeated at a lower F, at worst 0 (every
// element).
template <typename T>
SelectionPlan PlanCpu(OpKernelContext* ctx, const Input<T>& in, int64_t k,
                      TopKSampleMode mode, int rounds, int64_t seed,
                      Candidates* cand) {
  const int64_t n = in.n;
  if (k == 0) {
    if (in.residual != nullptr) Compact(ctx, in, false, kNoKey, 0.0, cand);
    return SelectionPlan();
  }
  const bool trimmed = mode == TopKSampleMode::kTrimmed;
  const bool strict = mode == TopKSampleMode::kThreshold;
  DrawSample(in, cand);
  // The largest rank the mode reads. Zeros are candidates only when the
  // selection turns out to need them.
  const int64_t top_rank =
      std::min(n, trimmed ? k : (strict && 2 * k <= n ? 2 * k : k + 1));
  int64_t floor = std::max<int64_t>(1, LowerBoundOfRank(n, top_rank, cand));
  const Stats st = Compact(ctx, in, !trimmed, static_cast<uint32_t>(floor),
                           SampledShare(*cand, floor), cand);
  const Input<T> data{in.data(), nullptr, nullptr, n};
  for (;; Compact(ctx, data, false, static_cast<uint32_t>(floor),
                  SampledShare(*cand, floor), cand)) {
    const auto size = static_cast<int64_t>(cand->keys.size());
    // Every rank <= n is a candidate at floor 0, so the loop ends there.
    if (trimmed) {
      if (size >= k) return ExactTopK(cand, k);
      floor = 0;
      continue;
    }
    // The (k+1)-th and 2k-th largest keys (mstopk reads only the first):
    // exact when candidates, kNoRank beyond n, else below the floor, which
    // floor - 1 stands for.
    const std::array<int64_t, 2> ranks = {k + 1, strict ? 2 * k : k + 1};
    std::array<int64_t, 2> v = {kNoRank, kNoRank};
    bool exact = true;
    if (size > 0) {
      const auto kth = KthLargest<2>(
          cand->keys, cand->keys_top,
          {std::min(ranks[0], size), std::min(ranks[1], size)}, &cand->bucket);
      for (int j = 0; j < 2; ++j) {
        if (ranks[j] <= size) v[j] = kth[j];
      }
    }
    for (int j = 0; j < 2; ++j) {
      if (ranks[j] <= n && ranks[j] > size) {
        v[j] = floor - 1;
        exact = false;
      }
    }
    if (!strict) v[1] = kNoRank;
    const BisectionEnd e =
        BisectByOrder(mode, st.mean, st.diff, rounds, v[0], v[1]);
    if (!exact && e.lowest < floor) {  // a comparison it could not decide
      floor = e.lowest;
      continue;
    }
    if (e.has_lo && e.lo < floor) {
      floor = e.lo;
      continue;
    }
    if (!e.has_lo && strict && size < k) {  // the exact top-k fallback
      floor = 0;
      continue;
    }
    if (strict) {
      if (!e.has_lo) return ExactTopK(cand, k);
      return ThresholdPlan(e, CountCandidates(*cand, e.lo, true, 0)[0]);
    }
    const auto c = CountCandidates(*cand, e.has_hi ? e.hi : kNoKey, false,
                                   e.has_lo ? e.lo : 0);
    return MsTopKPlan(e, c[0], e.has_lo ? c[1] : n, n, k, seed);
  }
}

// Where the selection goes, in index order.
template <typename T>
struct Output {
  const T* x;
  T* values;
  int32_t* indices;
  T* zero;  // where selected entries are zeroed, if anywhere
  int64_t size = 0;

  // Element i, whose value is v (float holds every T value exactly; not
  // always a NaN's payload).
  void Take(int64_t i, float v) {
    values[size] = std::isnan(v) ? x[i] : static_cast<T>(v);
    indices[size] = static_cast<int32_t>(i);
    if (zero != nullptr) zero[i] = static_cast<T>(0.0f);
    ++size;
  }
  void Take(int64_t i) { Take(i, static_cast<float>(x[i])); }
  absl::Status Check(const SelectionPlan& p, int64_t candidates) const {
    if (size == p.output_size) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(
        "TopKSample selected ", size, " elements but planned ",
        p.output_size, " (candidates=", candidates, ", need=", p.need,
        ", start=", p.start, ")"));
  }
};

// Writes mstopk's selection when its band has no lower end (no count was
// above k): the candidates above the plan, which hold every key >= `above`,
// and the band slice, ranks [start, start + need) of the elements below
// `above` in index order. Between two elements above, the band is a run of
// consecutive indices, so the slice is read straight from the input.
template <typename T>
absl::Status WriteWholeBand(int64_t n, const SelectionPlan& p,
                            const Candidates& cand, Output<T>* out) {
  const int64_t band_end = p.start + p.need;
  const auto size = static_cast<int64_t>(cand.keys.size());
  int64_t band_rank = 0;  // of element `next`
  int64_t next = 0;       // the first index not yet passed
  for (int64_t c = 0; c <= size; ++c) {
    if (c < size && !IsAbove(p, cand.keys[c])) continue;
    const int64_t above = c < size ? cand.index[c] : n;
    const int64_t run_end = band_rank + (above - next);
    for (int64_t r = std::max(band_rank, p.start);
         r < std::min(run_end, band_end); ++r) {
      out->Take(next + (r - band_rank));
    }
    band_rank = run_end;
    if (c < size) out->Take(above, cand.value[c]);
    next = above + 1;
  }
  return out->Check(p, size);
}

// Writes the plan's selection from the candidates, in index order.
template <typename T>
absl::Status Write(int64_t n, const SelectionPlan& p, Candidates* cand_p,
                   Output<T>* out) {
  if (!p.has_band_lo && p.need > 0) {
    return WriteWholeBand(n, p, *cand_p, out);
  }
  // Everything selected lies in the band or above it (strictly above
  // `above` when the band is empty): drop the rest first, branch-free.
  if (p.has_band_lo) {
    Prune<false>(p.band_lo, cand_p);
  } else if (p.above_strict) {
    Prune<true>(p.above, cand_p);
  } else {
    Prune<false>(p.above, cand_p);
  }
  const Candidates& cand = *cand_p;
  int64_t band_rank = 0;
  const int64_t band_end = p.start + p.need;
  const auto size = static_cast<int64_t>(cand.keys.size());
  for (int64_t c = 0; c < size && out->size < p.output_size; ++c) {
    bool take = IsAbove(p, cand.keys[c]);
    if (!take) {  // in the band
      take = band_rank >= p.start && band_rank < band_end;
      ++band_rank;
    }
    if (take) out->Take(cand.index[c], cand.value[c]);
  }
  return out->Check(p, size);
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
  // gets fresh ones) and takes them back with their capacity, or fresh ones
  // when they hold more than kKeptBytes.
  class CandidateLease {
   public:
    explicit CandidateLease(TopKSampleOpBase* op) : op_(op) {
      std::lock_guard<std::mutex> lock(op_->mu_);
      cand_ = std::move(op_->kept_);
      if (cand_ == nullptr) cand_ = std::make_unique<Candidates>();
    }
    ~CandidateLease() {
      if (cand_->Bytes() > kKeptBytes) cand_ = std::make_unique<Candidates>();
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
    Input<T> in{x.flat<T>().data(), nullptr, nullptr, n};
    if (kWithResidual) {
      const Tensor& r = ctx->input(1);
      Tensor* acc = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              {1}, 2, r.shape(), &acc));
      in.residual = r.flat<T>().data();
      in.acc = acc->flat<T>().data();
    }
    CandidateLease lease(this);
    Candidates& cand = *lease.get();
    const SelectionPlan plan =
        PlanCpu(ctx, in, k, mode_, rounds_, seed, &cand);
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx,
                   AllocateSelection(ctx, plan.output_size, &values, &indices));
    if (plan.output_size == 0) return;
    Output<T> out{in.data(), values->flat<T>().data(),
                  indices->flat<int32_t>().data(), in.acc};
    OP_REQUIRES_OK(ctx, Write(n, plan, &cand, &out));
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
// GPU glue: k and seed live in host memory. The CUDA launchers of
// top_k_sample_kernels.cu.cc plan and write the selection on the op's
// stream; the host waits for the device only in threshold mode, whose
// output size depends on the data (mstopk and trimmed select k elements).
// ---------------------------------------------------------------------------
template <typename T>
constexpr gpu::DType GpuDTypeOf() {
  return static_cast<gpu::DType>(GpuDType<T>());
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
    void* stream = StreamOf(ctx);
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
    OP_REQUIRES_OK(ctx, CudaStatus(gpu::TopKSamplePlan(
                                       GpuDTypeOf<T>(), x, n, k, mode_, rounds_,
                                       seed, scratch_p, stream),
                                   "TopKSamplePlan"));
    int64_t size = 0;
    OP_REQUIRES_OK(ctx, CudaStatus(gpu::TopKSampleOutputSize(
                                       mode_, n, k, scratch_p, stream, &size),
                                   "TopKSampleOutputSize"));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx, AllocateSelection(ctx, size, &values, &indices));
    if (size == 0) return;
    OP_REQUIRES_OK(
        ctx, CudaStatus(gpu::TopKSampleWrite(
                            GpuDTypeOf<T>(), x, n, size,
                            values->flat<T>().data(),
                            indices->flat<int32_t>().data(), zero, scratch_p,
                            stream),
                        "TopKSampleWrite"));
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
