// Copyright 2026 The tfgc Authors.
//
// TopKSample: sampled top-k selection by magnitude (MSTopK, RedSync threshold
// search, trimmed top-k). This header holds everything the CPU kernel, the
// CUDA kernels and the standalone CUDA harness share. It does not include any
// TensorFlow header, so that `custom_ops/cuda_harness/` can compile the same
// kernel source with nvcc alone.
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

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_KERNELS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

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
inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Start of MSTopK's band slice: uniform in [0, max_start] given the seed.
inline int64_t SliceStart(int64_t seed, int64_t max_start) {
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
inline uint32_t KeyOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits &= 0x7fffffffu;
  return bits < kInfKey ? bits : kInfKey;
}

// A non-negative double rounded to float32, 0 below 2^-126: the statistics
// and thresholds are 0 or normal, with or without flush-to-zero.
inline float Flush(double v) {
  return v < static_cast<double>(std::numeric_limits<float>::min())
             ? 0.0f
             : static_cast<float>(v);
}

// The mean of `finite` finite keys summing to `sum` (subnormal ones as 0).
inline float Mean(double sum, int64_t finite) {
  return finite > 0 ? Flush(sum / static_cast<double>(finite)) : 0.0f;
}

// max - mean, max the largest finite key (subnormal ones as 0).
inline float Diff(float max, float mean) {
  return Flush(static_cast<double>(max) - static_cast<double>(mean));
}

inline float Threshold(float mean, float diff, float ratio) {
  // The product is exact in double: one rounding, as float32 r * diff.
  const float step = Flush(static_cast<double>(ratio) * diff);
  return mean + step;  // 0 or normal: no float mode changes the sum
}

// The bisection of MSTopK (counts of key >= thr) and of RedSync's threshold
// search (counts of key > thr). Drive it with NextThreshold()/Update().
class Bisection {
 public:
  Bisection(TopKSampleMode mode, int64_t k, float mean, float diff)
      : mode_(mode), k_(k), mean_(mean), diff_(diff) {}

  float NextRatio() const { return (lo_ + hi_) * 0.5f; }
  float NextThreshold() const { return Threshold(mean_, diff_, NextRatio()); }
  uint32_t NextKey() const { return KeyOf(NextThreshold()); }

  // Feeds the count at NextThreshold().
  void Update(int64_t count) {
    const float ratio = NextRatio();
    const float thr = Threshold(mean_, diff_, ratio);
    if (mode_ == TopKSampleMode::kThreshold) {
      if (count <= k_) {
        hi_ = ratio;
      } else if (count >= 2 * k_) {
        lo_ = ratio;
        if (!has_lo_ || count < lo_count_) Lo(thr, count);
      } else {
        accepted_ = true;
        lo_ = ratio;
        Lo(thr, count);
      }
      return;
    }
    if (count <= k_) {
      hi_ = ratio;
      if (!has_hi_ || count > hi_count_) {
        has_hi_ = true;
        hi_thr_ = thr;
        hi_count_ = count;
      }
    } else {
      lo_ = ratio;
      if (!has_lo_ || count < lo_count_) Lo(thr, count);
    }
  }

  bool accepted() const { return accepted_; }
  bool has_hi() const { return has_hi_; }
  float hi_thr() const { return hi_thr_; }
  int64_t hi_count() const { return hi_count_; }
  bool has_lo() const { return has_lo_; }
  float lo_thr() const { return lo_thr_; }
  int64_t lo_count() const { return lo_count_; }
  float lo_ratio() const { return lo_; }
  float hi_ratio() const { return hi_; }

 private:
  void Lo(float thr, int64_t count) {
    has_lo_ = true;
    lo_thr_ = thr;
    lo_count_ = count;
  }

  TopKSampleMode mode_;
  int64_t k_;
  float mean_;
  float diff_;
  float lo_ = 0.0f;
  float hi_ = 1.0f;
  bool accepted_ = false;
  bool has_hi_ = false;
  float hi_thr_ = 0.0f;
  int64_t hi_count_ = 0;
  bool has_lo_ = false;
  float lo_thr_ = 0.0f;
  int64_t lo_count_ = 0;
};

// Whether `key` is in the plan's above set.
inline bool IsAbove(const SelectionPlan& p, uint32_t key) {
  return p.has_above && (p.above_strict ? key > p.above : key >= p.above);
}

// Plan for MSTopK after the bisection; `n` is the number of elements.
inline SelectionPlan MsTopKPlan(const Bisection& b, int64_t n, int64_t k,
                                int64_t seed) {
  SelectionPlan p;
  p.has_above = b.has_hi();
  p.above = KeyOf(b.hi_thr());
  p.above_count = b.has_hi() ? b.hi_count() : 0;
  p.has_band_lo = b.has_lo();
  p.band_lo = KeyOf(b.lo_thr());
  const int64_t band = (b.has_lo() ? b.lo_count() : n) - p.above_count;
  p.need = k - p.above_count;
  p.start = SliceStart(seed, band - p.need);
  p.output_size = k;
  return p;
}

// Plan for the threshold search when a count > k was seen (accepted or not):
// everything with key > lo_thr.
inline SelectionPlan ThresholdPlan(const Bisection& b) {
  SelectionPlan p;
  p.has_above = true;
  p.above_strict = true;
  p.above = KeyOf(b.lo_thr());
  p.above_count = b.lo_count();
  p.output_size = b.lo_count();
  return p;
}

// Plan for exact top-k given the k-th largest key `v` and the number of keys
// strictly greater than it.
inline SelectionPlan ExactPlan(uint32_t v, int64_t greater, int64_t k) {
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

// Ratios of the trimmed top-k candidate search, highest first.
constexpr int kTrimmedSteps = 5;
constexpr float kTrimmedRatios[kTrimmedSteps] = {0.8f, 0.6f, 0.4f, 0.2f,
                                                 0.0f};

// ---------------------------------------------------------------------------
// CUDA launchers (defined in *.cu.cc; declared here so that the TF glue and
// the harness call the same code). All pointers are device pointers.
// ---------------------------------------------------------------------------
namespace gpu {

// Element types of the launchers (the TF glue passes Eigen::half and
// Eigen::bfloat16 buffers, bit-compatible with __half and __nv_bfloat16).
enum class DType : int { kFloat = 0, kHalf = 1, kBfloat16 = 2 };

// Bytes of device scratch the launchers need for `n` elements on the
// current device.
int64_t TopKSampleScratchBytes(int64_t n);

// acc = gradient + residual (rounded to the element type); `acc` may alias
// `residual`. Returns a cudaError_t value (0 is success).
int AddResidual(DType dtype, const void* gradient, const void* residual,
                void* acc, int64_t n, void* stream);

// Statistics and bisection (synchronising with the host; 0 < k <= n);
// fills `plan`. Returns a cudaError_t value.
int TopKSamplePlan(DType dtype, const void* x, int64_t n, int64_t k,
                   TopKSampleMode mode, int rounds, int64_t seed,
                   void* scratch, void* stream, SelectionPlan* plan);

// Writes plan.output_size values and int32 indices in index order; when
// `zero_selected` is not null, also zeroes those positions there (it may be
// `x` itself). Returns a cudaError_t value.
int TopKSampleWrite(DType dtype, const void* x, int64_t n,
                    const SelectionPlan& plan, void* values, int32_t* indices,
                    void* zero_selected, void* scratch, void* stream);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_KERNELS_H_
