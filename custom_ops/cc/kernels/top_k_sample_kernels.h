// Copyright 2026 The tfgc Authors.
//
// The functors of Tfgc>TopKSample, Tfgc>TopKSampleWithResidual and their
// segmented twins (kernel_utils.h describes the layout): the CPU
// specialisations run the selection of top_k_sample_cpu.h, the GPU ones
// the launchers of top_k_sample_gpu.h. The definitions every implementation
// shares are in top_k_sample_common.h.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_KERNELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/top_k_sample_common.h"

namespace tfgc {

// The data selected from: x itself, or acc = gradient + residual (added in
// T, as TensorFlow adds), which the first pass writes to `acc`. The input
// of both devices' functors. With `weights` (TopKRatioWithResidual, trimmed
// mode only) the keys are those of RatioScore(data, weights, floor)
// (top_k_sample_common.h) instead of the data's own, and the values
// written are the data's.
template <typename T>
struct TopKSampleInput {
  const T* x;                   // x, or the gradient
  const T* residual = nullptr;  // null for TopKSample
  T* acc = nullptr;             // acc's storage (null for TopKSample)
  int64_t n = 0;
  const T* weights = nullptr;   // null but for TopKRatioWithResidual
  float floor = 0.0f;

  T operator[](int64_t i) const {
    return residual == nullptr ? x[i] : static_cast<T>(x[i] + residual[i]);
  }
  // The data, once the first pass wrote acc.
  const T* data() const { return residual == nullptr ? x : acc; }
  // What element i is ranked by: its value, or its RatioScore.
  float Score(int64_t i) const {
    const auto v = static_cast<float>((*this)[i]);
    if (weights == nullptr) return v;
    return RatioScore(v, static_cast<float>(weights[i]), floor);
  }
};

namespace functor {

// The functors' interfaces. Each device specialises the whole class
// template (in top_k_sample_kernels.cc); the primary templates below are
// only the interface both follow.

// A selection in two steps, so that the op kernel can allocate the outputs
// in between. The plan goes from one step to the other in the functor
// object, one per Compute; `Cache` is what the op kernel keeps for the
// functor between calls.
template <typename Device, typename T>
class TopKSample {
 public:
  struct Cache;

  explicit TopKSample(Cache* cache);

  // Selects from `in` (0 <= k <= n; with a residual it first writes acc =
  // gradient + residual) and sets the number of selected elements: k in
  // mstopk and trimmed modes, data-dependent in threshold mode.
  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    int64_t k, TopKSampleMode mode, int rounds, int64_t seed,
                    int64_t* output_size);

  // Writes them (output_size > 0), values and int32 indices in index
  // order, and zeroes them in acc with a residual.
  absl::Status Write(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                     int64_t output_size, T* values, int32_t* indices);
};

// The segmented selection, in the same two steps and with the same
// lifetime. The table holds 0 <= k <= n < 2^31 per segment, segments
// contiguous.
template <typename Device, typename T>
class TopKSampleSegments {
 public:
  struct Cache;

  explicit TopKSampleSegments(Cache* cache);

  // Selects in every segment of the table (each as TopKSample would on the
  // segment alone with its k and seed; with a residual it first writes acc
  // over the whole buffer) and writes each segment's output size to
  // `sizes` (host memory, one per segment).
  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    const std::vector<TopKSampleSegment>& segments,
                    TopKSampleMode mode, int rounds, int64_t* sizes);

  // Writes the selections one after another in segment order (output_size
  // > 0 entries in all), each segment's indices counted from its start,
  // and zeroes them in acc with a residual.
  absl::Status Write(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                     const std::vector<TopKSampleSegment>& segments,
                     int64_t output_size, T* values, int32_t* indices);
};

}  // namespace functor
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_KERNELS_H_
