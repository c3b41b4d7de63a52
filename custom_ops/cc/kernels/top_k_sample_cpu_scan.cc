// Copyright 2026 The tfgc Authors.
//
// The one pass of TopKSample's CPU selection over its input (Compact,
// top_k_sample_cpu.h): the statistics of the finite keys, acc = gradient +
// residual in the residual variant, and the compaction of every element
// whose key reaches a floor, in chunks that stay in L1 and in fixed blocks
// on the intra-op thread pool. The statistics and the compaction have an
// AVX2 version (simd.h), one loop for both, chosen at run time, that reads
// float32, float16 (F16C) and bfloat16 directly, eight keys per
// instruction; both versions give the same results. So do the counting of
// mstopk's band and the reading of its slice from the input.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/simd.h"
#include "custom_ops/cc/kernels/top_k_sample_cpu.h"
#include "custom_ops/cc/kernels/top_k_sample_common.h"

namespace tfgc {
namespace cpu {
namespace {

// A finite key as the float32 magnitude that the statistics add: 0 when it
// is subnormal.
inline float StatsMagnitude(uint32_t key) {
  const uint32_t bits = key < kMinNormalKey ? 0 : key;
  float a;
  std::memcpy(&a, &bits, sizeof(a));
  return a;
}

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
// The keys of eight float32 lanes (min_epi32: NaN patterns are above
// +inf's).
TFGC_AVX2 inline __m256i Key8(__m256 raw) {
  return _mm256_min_epi32(_mm256_castps_si256(Abs8(raw)),
                          _mm256_set1_epi32(kInfKey));
}

// The keys of x[0..8).
template <typename T>
TFGC_AVX2 inline __m256i LoadKey8(const T* p) {
  return Key8(LoadFloat8(p));
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

// Asks for the cache line 4 KiB ahead of p. A loop that does more than
// load and compare keeps too few loads in flight to stream from memory at
// full speed without it (measured at 25 M, 0.1 %: the whole selection took
// 1.4-1.6x a reduce_max without, 1.1-1.3x with; 2-8 KiB ahead are alike).
TFGC_AVX2 inline void Prefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + 4096, _MM_HINT_T0);
}

// Lanes of x[0..8) whose key is in [lo, hi), given below = lo - 1 and
// top = hi in every lane (keys are below 2^31, so signed compares order
// them; lo - 1 = -1 when lo = 0).
template <typename T>
TFGC_AVX2 inline __m256i InRange8(const T* p, __m256i below, __m256i top) {
  Prefetch(p);
  const __m256i key = LoadKey8(p);
  return _mm256_and_si256(_mm256_cmpgt_epi32(key, below),
                          _mm256_cmpgt_epi32(top, key));
}
#endif  // TFGC_HAVE_AVX2_PATH

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
// Appends the lanes of `raw` that `bits` selects (elements first + lane) at
// value[size] and their indices at index[size]: moved to the front by one
// permutation and all eight stored, so both need 8 slots of slack. Returns
// the new size.
TFGC_AVX2 inline int64_t AppendLanes(__m256 raw, int bits, int64_t first,
                                     const LeftPackTable& pack, float* value,
                                     int32_t* index, int64_t size) {
  const __m256i lanes = _mm256_load_si256(
      reinterpret_cast<const __m256i*>(pack.lanes[bits]));
  _mm256_storeu_ps(value + size, _mm256_permutevar8x32_ps(raw, lanes));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(index + size),
      _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int32_t>(first))));
  return size + __builtin_popcount(bits);
}

// The statistics (kStats) and the compaction of x[begin, end) in one loop,
// sixteen keys a step, so that each key is loaded once and the arithmetic
// overlaps the loads from memory (two loops, one after the other over a
// chunk, left memory idle during the second). The statistics as
// AccumulateScalar's, finite keys masked in and widened to double in four
// accumulators (fixed lane order: deterministic); the compaction as
// AppendAtLeastScalar's, with no store when none of the sixteen passes
// (most steps: a floor passes a few percent of keys). Keys are at most
// 0x7f800000, so signed compares order them, and key >= s is key > s - 1
// (s - 1 = -1 when s = 0: every key passes).
template <typename T, bool kStats>
TFGC_AVX2 void ScanAvx2(const T* x, int64_t begin, int64_t end, uint32_t s,
                        CandidateBuffer* part, BlockStats* out) {
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(s - 1));
  const LeftPackTable& pack = LeftPack();
  float* value = part->value.get();
  int32_t* index = part->index.get();
  int64_t size = part->size;
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  __m256d s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
  __m256 mx = _mm256_setzero_ps();
  __m256i cnt = _mm256_setzero_si256();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    Prefetch(x + i);
    const __m256 ra = LoadFloat8(x + i);
    const __m256 rb = LoadFloat8(x + i + 8);
    const __m256i ka = Key8(ra);
    const __m256i kb = Key8(rb);
    if constexpr (kStats) {
      __m256 ma, mb;  // 0 or normal: no float mode changes sums or maxima
      const __m256i fa = FiniteKeys8(ka, &ma);
      const __m256i fb = FiniteKeys8(kb, &mb);
      s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(ma)));
      s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(ma, 1)));
      s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm256_castps256_ps128(mb)));
      s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm256_extractf128_ps(mb, 1)));
      mx = _mm256_max_ps(mx, _mm256_max_ps(ma, mb));
      cnt = _mm256_sub_epi32(cnt, fa);
      cnt = _mm256_sub_epi32(cnt, fb);
    }
    const int bits_a = _mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(ka, below)));
    const int bits_b = _mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(kb, below)));
    if ((bits_a | bits_b) != 0) {
      size = AppendLanes(ra, bits_a, i, pack, value, index, size);
      size = AppendLanes(rb, bits_b, i + 8, pack, value, index, size);
    }
  }
  part->size = size;
  AppendAtLeastScalar(x, i, end, s, part);  // < 16 keys left
  if constexpr (kStats) {
    alignas(32) double d[16];
    _mm256_store_pd(d, s0);
    _mm256_store_pd(d + 4, s1);
    _mm256_store_pd(d + 8, s2);
    _mm256_store_pd(d + 12, s3);
    alignas(32) float m[8];
    _mm256_store_ps(m, mx);
    BlockStats tail;
    AccumulateScalar(x + i, 0, end - i, &tail);
    double sum = tail.sum;
    for (double v : d) sum += v;
    float mxs = tail.max;
    for (float v : m) mxs = std::max(mxs, v);
    out->sum = sum;
    out->max = mxs;
    out->finite = tail.finite + HorizontalSum(cnt);
  }
}
// FlushSubnormal of eight lanes: the magnitude bits cleared where the
// exponent is zero.
TFGC_AVX2 inline __m256 Flush8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i tiny = _mm256_cmpeq_epi32(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x7f800000)),
      _mm256_setzero_si256());
  const __m256i magnitude =
      _mm256_and_si256(tiny, _mm256_set1_epi32(0x7fffffff));
  return _mm256_castsi256_ps(_mm256_andnot_si256(magnitude, bits));
}

// ScoreChunk's scalar loop eight lanes at a time, the same operations in
// the same order (RatioScore).
template <typename T>
TFGC_AVX2 void ScoreChunkAvx2(const T* x, const T* w, float floor,
                              int64_t size, float* out) {
  const __m256 f = Flush8(_mm256_set1_ps(floor));
  int64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const __m256 d = Flush8(_mm256_add_ps(Flush8(Abs8(LoadFloat8(w + i))), f));
    _mm256_storeu_ps(out + i,
                     Flush8(_mm256_div_ps(Flush8(LoadFloat8(x + i)), d)));
  }
  for (; i < size; ++i) {
    out[i] = RatioScore(static_cast<float>(x[i]), static_cast<float>(w[i]),
                        floor);
  }
}
#endif  // TFGC_HAVE_AVX2_PATH

// The statistics of x[begin, end) into `out` when `stats`, and its
// elements whose key is >= s appended to `part` in index order, which has
// room for every element of the range and 8 more.
template <typename T>
void Scan(const T* x, int64_t begin, int64_t end, bool stats, uint32_t s,
          CandidateBuffer* part, BlockStats* out) {
#if TFGC_HAVE_AVX2_PATH
  if (UseAvx2()) {
    if (stats) return ScanAvx2<T, true>(x, begin, end, s, part, out);
    return ScanAvx2<T, false>(x, begin, end, s, part, out);
  }
#endif
  if (stats) AccumulateScalar(x, begin, end, out);
  AppendAtLeastScalar(x, begin, end, s, part);
}

// out[i] = RatioScore(x[i], w[i], floor) for i < size: four times the
// compaction's keys per element on two cores at 25 M unless vectorised,
// which the branch-free bit operations of RatioScore allow.
template <typename T>
void ScoreChunk(const T* x, const T* w, float floor, int64_t size,
                float* out) {
#if TFGC_HAVE_AVX2_PATH
  if (UseAvx2()) return ScoreChunkAvx2(x, w, floor, size, out);
#endif
  for (int64_t i = 0; i < size; ++i) {
    out[i] = RatioScore(static_cast<float>(x[i]), static_cast<float>(w[i]),
                        floor);
  }
}

}  // namespace

template <typename T>
Stats Compact(OpKernelContext* ctx, const TopKSampleInput<T>& in, bool stats,
              uint32_t s, double fraction, bool gather, Candidates* cand) {
  const int64_t n = in.n;
  Blocks blocks(n, NumThreads(ctx));
  std::vector<CandidateBuffer>& parts = cand->parts;
  if (static_cast<int64_t>(parts.size()) < blocks.count()) {
    parts.resize(blocks.count());
  }
  cand->parts_used = blocks.count();
  cand->in_parts = !gather;
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
    float scores[kChunk];  // the chunk's RatioScores, with weights
    for (int64_t c = begin; c < end; c += kChunk) {
      const int64_t ce = std::min(end, c + kChunk);
      if (in.residual != nullptr) {
        for (int64_t i = c; i < ce; ++i) in.acc[i] = in[i];
      }
      part.Reserve(part.size + (ce - c) + 8);
      BlockStats chunk;
      if (in.weights != nullptr) {
        // The candidates are scores, their indices counted from the chunk.
        ScoreChunk(in.data() + c, in.weights + c, in.floor, ce - c, scores);
        const int64_t first = part.size;
        Scan(scores, 0, ce - c, stats, s, &part, &chunk);
        for (int64_t j = first; j < part.size; ++j) {
          part.index[j] += static_cast<int32_t>(c);
        }
      } else {
        Scan(in.data(), c, ce, stats, s, &part, &chunk);
      }
      total.sum += chunk.sum;
      total.max = std::max(total.max, chunk.max);
      total.finite += chunk.finite;
    }
    block_stats[b] = total;
  });
  cand->value.clear();
  cand->index.clear();
  cand->keys.clear();
  cand->keys_top.fill(0);
  if (!gather) return stats ? Combine(block_stats) : Stats();
  const std::vector<int64_t> offsets = cand->PartOffsets();
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
    AddDigits(keys, part.size, kTopShift, 0, &hists[b]);
  });
  for (const DigitHist& h : hists) {
    for (size_t d = 0; d < h.size(); ++d) cand->keys_top[d] += h[d];
  }
  return stats ? Combine(block_stats) : Stats();
}

namespace {

// Whether the key of element x is in [lo, hi) (InRange8 eight at a time).
template <typename T>
inline bool InRange(T x, uint32_t lo, uint32_t hi) {
  const uint32_t key = ElementKey(x);
  return key >= lo && key < hi;
}

template <typename T>
int64_t CountInRangeScalar(const T* x, int64_t begin, int64_t end,
                           uint32_t lo, uint32_t hi) {
  int64_t count = 0;
  for (int64_t i = begin; i < end; ++i) count += InRange(x[i], lo, hi);
  return count;
}

#if TFGC_HAVE_AVX2_PATH
// CountInRangeScalar eight keys per compare.
template <typename T>
TFGC_AVX2 int64_t CountInRangeAvx2(const T* x, int64_t begin, int64_t end,
                                   uint32_t lo, uint32_t hi) {
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(lo - 1));
  const __m256i top = _mm256_set1_epi32(static_cast<int32_t>(hi));
  __m256i cnt = _mm256_setzero_si256();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    cnt = _mm256_sub_epi32(cnt, InRange8(x + i, below, top));
  }
  return HorizontalSum(cnt) + CountInRangeScalar(x, i, end, lo, hi);
}
#endif  // TFGC_HAVE_AVX2_PATH

}  // namespace

template <typename T>
void CountKeysInRange(OpKernelContext* ctx, const T* x, int64_t n,
                      uint32_t lo, uint32_t hi, std::vector<int64_t>* counts) {
  const int64_t spans = (n + kSpan - 1) / kSpan;
  counts->assign(spans, 0);
  Blocks blocks(spans, NumThreads(ctx), 1);
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    for (int64_t s = blocks.begin(b); s < blocks.end(b); ++s) {
      const int64_t begin = s * kSpan;
      const int64_t end = std::min(n, begin + kSpan);
#if TFGC_HAVE_AVX2_PATH
      if (UseAvx2()) {
        (*counts)[s] = CountInRangeAvx2(x, begin, end, lo, hi);
        continue;
      }
#endif
      (*counts)[s] = CountInRangeScalar(x, begin, end, lo, hi);
    }
  });
}

namespace {

// Adds to `slice` the elements of x[begin, end), whose keys `bits` marks
// (bit l for element begin + l), after skipping the first *skip of them,
// until it holds `take`. Returns whether it is full.
inline bool TakeMarked(int64_t begin, uint32_t bits, int64_t* skip,
                       int64_t take, std::vector<int32_t>* slice) {
  for (; bits != 0; bits &= bits - 1) {
    if (*skip > 0) {
      --*skip;
      continue;
    }
    slice->push_back(static_cast<int32_t>(begin + __builtin_ctz(bits)));
    if (static_cast<int64_t>(slice->size()) == take) return true;
  }
  return false;
}

template <typename T>
void RangeSliceScalar(const T* x, int64_t begin, int64_t n, uint32_t lo,
                      uint32_t hi, int64_t skip, int64_t take,
                      std::vector<int32_t>* slice) {
  for (int64_t i = begin; i < n; ++i) {
    if (TakeMarked(i, InRange(x[i], lo, hi), &skip, take, slice)) return;
  }
}

#if TFGC_HAVE_AVX2_PATH
// RangeSliceScalar eight keys per compare; eight keys out of the range, the
// most common case in a band that is thinly spread, cost one branch.
template <typename T>
TFGC_AVX2 void RangeSliceAvx2(const T* x, int64_t begin, int64_t n,
                              uint32_t lo, uint32_t hi, int64_t skip,
                              int64_t take, std::vector<int32_t>* slice) {
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(lo - 1));
  const __m256i top = _mm256_set1_epi32(static_cast<int32_t>(hi));
  int64_t i = begin;
  for (; i + 8 <= n; i += 8) {
    const auto bits = static_cast<uint32_t>(_mm256_movemask_ps(
        _mm256_castsi256_ps(InRange8(x + i, below, top))));
    if (bits != 0 && TakeMarked(i, bits, &skip, take, slice)) return;
  }
  RangeSliceScalar(x, i, n, lo, hi, skip, take, slice);
}
#endif  // TFGC_HAVE_AVX2_PATH

}  // namespace

template <typename T>
void RangeSlice(const T* x, int64_t begin, int64_t n, uint32_t lo,
                uint32_t hi, int64_t skip, int64_t take,
                std::vector<int32_t>* slice) {
  slice->clear();
  slice->reserve(take);
  if (take <= 0) return;
#if TFGC_HAVE_AVX2_PATH
  if (UseAvx2()) return RangeSliceAvx2(x, begin, n, lo, hi, skip, take, slice);
#endif
  RangeSliceScalar(x, begin, n, lo, hi, skip, take, slice);
}

#define TFGC_INSTANTIATE_COMPACT(T)                                          \
  template Stats Compact(OpKernelContext*, const TopKSampleInput<T>&, bool,  \
                         uint32_t, double, bool, Candidates*);
TFGC_INSTANTIATE_COMPACT(float)
TFGC_INSTANTIATE_COMPACT(Eigen::half)
TFGC_INSTANTIATE_COMPACT(Eigen::bfloat16)
#undef TFGC_INSTANTIATE_COMPACT

#define TFGC_INSTANTIATE_RANGE(T)                                            \
  template void CountKeysInRange(OpKernelContext*, const T*, int64_t,        \
                                 uint32_t, uint32_t, std::vector<int64_t>*); \
  template void RangeSlice(const T*, int64_t, int64_t, uint32_t, uint32_t,   \
                           int64_t, int64_t, std::vector<int32_t>*);
TFGC_INSTANTIATE_RANGE(float)
TFGC_INSTANTIATE_RANGE(Eigen::half)
TFGC_INSTANTIATE_RANGE(Eigen::bfloat16)
#undef TFGC_INSTANTIATE_RANGE

}  // namespace cpu
}  // namespace tfgc
