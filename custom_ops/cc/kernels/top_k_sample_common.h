// Copyright 2026 The tfgc Authors.
//
// TopKSample: sampled top-k selection by magnitude (MSTopK, RedSync threshold
// search, trimmed top-k). This header holds the definitions that the CPU
// functors, the CUDA kernels and the CUDA harness share. It includes no
// TensorFlow header: top_k_sample_kernels.cu.cc is compiled by nvcc alone
// (kernel_utils.h says why).
//
// Definitions shared by every implementation (and by the pure-TF reference in
// tfgc/ops/top_k_sample.py, which is the test oracle):
//   key(x)  = the bit pattern of |x| in float32 as an unsigned integer, that
//             of +inf when x is NaN: non-finite values (NaN, +-inf) count as
//             the largest magnitude and go first. Keys are compared as
//             integers, never as floats: TensorFlow's threads flush
//             denormals (FTZ/DAZ), under which a float comparison would
//             take a subnormal for zero. So subnormals rank above zero, in
//             the order of their values, whatever the thread's float mode.
//   stats   = over the finite keys, each subnormal one counted as 0: mean =
//             (sum in double / number of finite keys) rounded to float32,
//             0 when no key is finite; max = largest (0 if none); diff = max
//             - mean rounded to float32. Every float32 result below 2^-126
//             is flushed to 0 (Flush()), so that no arithmetic meets a
//             subnormal and the results do not depend on the float mode.
//   thr(r)  = mean + Flush(r * diff) in float32, r a dyadic ratio in [0, 1];
//             a threshold is compared through its key.
// Output indices are always in increasing order.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_COMMON_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_COMMON_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// The arithmetic below (keys, statistics, thresholds, the bisection and the
// plans) runs on the host and, in top_k_sample_kernels.cu.cc, on the device:
// __host__ __device__ under nvcc, nothing for host-only compilers (the CPU
// kernel, the TF glue and the harness's CPU emulation of CUDA). The same
// code gives the same results on both: no library call whose device version
// could differ, and no product that nvcc could contract into a fused
// multiply-add.
#if defined(__CUDACC__)
#define TFGC_HOST_DEVICE __host__ __device__
#else
#define TFGC_HOST_DEVICE
#endif

namespace tfgc {

enum class TopKSampleMode : int {
  kMsTopK = 0,     // exact k: bisection, then band fill from a random slice
  kThreshold = 1,  // RedSync: bisection until k < count < 2k
  kTrimmed = 2,    // exact top-k (lowest index first among equal keys)
};

// The final selection, in terms of keys: every element with
// `has_above && key >= above` (key > above when `above_strict`) is selected,
// plus the elements of the band `band_lo <= key < above` (no upper bound
// when !has_above; no lower bound when !has_band_lo) whose rank inside the
// band, in index order, lies in [start, start + need). `above` and
// `band_lo` are keys, as in the definitions above.
struct SelectionPlan {
  bool has_above = false;
  bool above_strict = false;
  uint32_t above = 0;
  int64_t above_count = 0;
  bool has_band_lo = false;
  uint32_t band_lo = 0;
  int64_t need = 0;
  int64_t start = 0;
  int64_t output_size = 0;
};

// SplitMix64 finaliser; the reference implements the same in TF uint64 ops.
TFGC_HOST_DEVICE inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Start of MSTopK's band slice: uniform in [0, max_start] given the seed.
TFGC_HOST_DEVICE inline int64_t SliceStart(int64_t seed,
                                           int64_t max_start) {
  if (max_start <= 0) return 0;
  const double u = static_cast<double>(
                       SplitMix64(static_cast<uint64_t>(seed)) >> 11) *
                   (1.0 / 9007199254740992.0);  // 2^-53
  const int64_t s =
      static_cast<int64_t>(u * static_cast<double>(max_start + 1));
  return s > max_start ? max_start : s;
}

// The key of +inf (and of NaN); finite keys are below it.
constexpr uint32_t kInfKey = 0x7f800000u;
// The key of 2^-126, the smallest normal float32; subnormal keys are below.
constexpr uint32_t kMinNormalKey = 0x00800000u;
// Above every key: a threshold no key passes, strictly or not.
constexpr uint32_t kNoKey = 0x7fffffffu;

// key(x) of a float32 value (bits, so no float mode can change it).
TFGC_HOST_DEVICE inline uint32_t KeyOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits &= 0x7fffffffu;
  return bits < kInfKey ? bits : kInfKey;
}

// v, or a zero of its sign when it is a float32 subnormal: what a CPU thread
// with FTZ and DAZ set reads and writes.
TFGC_HOST_DEVICE inline float FlushSubnormal(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// The score that TopKRatioWithResidual ranks by key(score):
//   score = acc / (|w| + floor)
// in float32, IEEE addition and division rounded to nearest, every operand
// and result flushed as a CPU thread with FTZ and DAZ set would flush it
// (FlushSubnormal), so that the host, the device and the pure-TF reference
// (tfgc/ops/top_k_sample.py, run on such a thread) rank alike. No product:
// nothing for nvcc to contract into a fused multiply-add.
TFGC_HOST_DEVICE inline float RatioScore(float acc, float weight,
                                         float floor) {
  uint32_t bits;
  std::memcpy(&bits, &weight, sizeof(bits));
  bits &= 0x7fffffffu;
  float magnitude;
  std::memcpy(&magnitude, &bits, sizeof(magnitude));
  const float denominator =
      FlushSubnormal(FlushSubnormal(magnitude) + FlushSubnormal(floor));
  return FlushSubnormal(FlushSubnormal(acc) / denominator);
}

// A non-negative double rounded to float32, 0 below 2^-126: the statistics
// and thresholds are 0 or normal, with or without flush-to-zero.
TFGC_HOST_DEVICE inline float Flush(double v) {
  return v < 0x1p-126 ? 0.0f : static_cast<float>(v);  // float32's min()
}

// The mean of `finite` finite keys summing to `sum` (subnormal ones as 0).
TFGC_HOST_DEVICE inline float Mean(double sum, int64_t finite) {
  return finite > 0 ? Flush(sum / static_cast<double>(finite)) : 0.0f;
}

// max - mean, max the largest finite key (subnormal ones as 0).
TFGC_HOST_DEVICE inline float Diff(float max, float mean) {
  return Flush(static_cast<double>(max) - static_cast<double>(mean));
}

TFGC_HOST_DEVICE inline float Threshold(float mean, float diff,
                                        float ratio) {
  // The product is exact in double: one rounding, as float32 r * diff.
  const float step = Flush(static_cast<double>(ratio) * diff);
  return mean + step;  // 0 or normal: no float mode changes the sum
}

// The r-th largest key of the input (1-based), or kNoRank when r > n.
constexpr int64_t kNoRank = -1;

// Where the bisection of MSTopK or of RedSync's threshold search ends: the
// last thresholds (as keys) at which the count was <= k (hi) and > k (lo),
// and whether a threshold search round was accepted (k < count < 2k).
struct BisectionEnd {
  bool accepted = false;
  bool has_hi = false;
  uint32_t hi = 0;
  bool has_lo = false;
  uint32_t lo = 0;
  uint32_t lowest = kNoKey;  // the lowest threshold visited
};

// The bisection on ratio in [0, 1] from 1/2 for `rounds` rounds (stopping
// when a threshold search round is accepted), run on two order statistics
// instead of counts: with v1 the (k+1)-th and v2 the 2k-th largest key
// (kNoRank when there is no such rank),
//   MSTopK:    count(key >= t) > k   iff  t <= v1,
//   threshold: count(key > t) > k    iff  t < v1,
//              count(key > t) >= 2k  iff  t < v2.
// So the rounds need no pass over the data. Thresholds only fall after a
// count <= k and only rise after one > k, so the last hi (lo) visited has
// the largest (smallest) count; where the reference keeps the first of
// equal counts instead, the two thresholds pass the same keys (nested sets
// of equal size), so the selection is the same.
TFGC_HOST_DEVICE inline BisectionEnd BisectByOrder(TopKSampleMode mode,
                                                   float mean, float diff,
                                                   int rounds, int64_t v1,
                                                   int64_t v2) {
  BisectionEnd e;
  float lo = 0.0f, hi = 1.0f;
  for (int round = 0; round < rounds && !e.accepted; ++round) {
    const float ratio = (lo + hi) * 0.5f;
    const uint32_t t = KeyOf(Threshold(mean, diff, ratio));
    const int64_t key = t;
    if (t < e.lowest) e.lowest = t;
    bool above_k;  // the count at t exceeds k
    if (mode == TopKSampleMode::kThreshold) {
      above_k = key < v1;
      e.accepted = above_k && !(key < v2);
    } else {
      above_k = key <= v1;
    }
    if (above_k) {
      lo = ratio;
      e.has_lo = true;
      e.lo = t;
    } else {
      hi = ratio;
      e.has_hi = true;
      e.hi = t;
    }
  }
  return e;
}

// Whether `key` is in the plan's above set.
TFGC_HOST_DEVICE inline bool IsAbove(const SelectionPlan& p,
                                      uint32_t key) {
  return p.has_above && (p.above_strict ? key > p.above : key >= p.above);
}

// Plan for MSTopK after the bisection, given the counts of keys >= e.hi
// (when e.has_hi) and >= e.lo (when e.has_lo); `n` elements.
TFGC_HOST_DEVICE inline SelectionPlan MsTopKPlan(const BisectionEnd& e,
                                                 int64_t hi_count,
                                                 int64_t lo_count, int64_t n,
                                                 int64_t k, int64_t seed) {
  SelectionPlan p;
  p.has_above = e.has_hi;
  p.above = e.hi;
  p.above_count = e.has_hi ? hi_count : 0;
  p.has_band_lo = e.has_lo;
  p.band_lo = e.lo;
  const int64_t band = (e.has_lo ? lo_count : n) - p.above_count;
  p.need = k - p.above_count;
  p.start = SliceStart(seed, band - p.need);
  p.output_size = k;
  return p;
}

// Plan for the threshold search when a count > k was seen (accepted or
// not): the `lo_count` keys > e.lo.
TFGC_HOST_DEVICE inline SelectionPlan ThresholdPlan(const BisectionEnd& e,
                                                    int64_t lo_count) {
  SelectionPlan p;
  p.has_above = true;
  p.above_strict = true;
  p.above = e.lo;
  p.above_count = lo_count;
  p.output_size = lo_count;
  return p;
}

// Plan for exact top-k given the k-th largest key `v` and the number of keys
// strictly greater than it.
TFGC_HOST_DEVICE inline SelectionPlan ExactPlan(uint32_t v, int64_t greater,
                                                int64_t k) {
  SelectionPlan p;
  p.has_above = true;  // key > v
  p.above_strict = true;
  p.above = v;
  p.above_count = greater;
  p.has_band_lo = true;
  p.band_lo = v;
  p.need = k - greater;
  p.start = 0;
  p.output_size = k;
  return p;
}

// A segment of a fused buffer for the segmented ops: elements [offset,
// offset + n), 0 <= k <= n < 2^31, segments disjoint; k and seed are its
// selection's. A segment with n = 0 or k = 0 selects nothing. Segment
// tables are host memory.
struct TopKSampleSegment {
  int64_t offset = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t seed = 0;
};

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_COMMON_H_
