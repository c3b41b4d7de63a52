// Copyright 2026 The tfgc Authors.
//
// The CUDA launchers of TopKSample (top_k_sample_kernels.cu.cc), typed on
// the element type T: float, __half or __nv_bfloat16, the types they are
// instantiated for. The GPU functors of top_k_sample_kernels.cc and the CUDA
// harness call them. No TensorFlow or CUDA header here (kernel_utils.h says
// why). All pointers are device pointers unless said otherwise; `stream` is
// a cudaStream_t; an int result is a cudaError_t value (0 is success).

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_GPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_GPU_H_

#include <cstdint>

#include "custom_ops/cc/kernels/top_k_sample_common.h"

namespace tfgc {
namespace gpu {

// Bytes of device scratch the launchers need for `n` elements on the
// current device.
int64_t TopKSampleScratchBytes(int64_t n);

// acc = gradient + residual (rounded to T); `acc` may alias `residual`.
template <typename T>
int AddResidual(const T* gradient, const T* residual, T* acc, int64_t n,
                void* stream);

// TopKRatioWithResidual (trimmed top-k by RatioScore, top_k_sample_common.h)
// in one call: acc = gradient + residual as AddResidual writes it (`acc`
// may alias `residual`) and the float32 scores in one pass, the trimmed
// selection of the scores (TopKSamplePlan and TopKSampleWrite), then
// values[j] = acc[indices[j]] and those entries of acc zeroed; k values and
// increasing indices, 0 <= k <= n. `scratch` holds TopKRatioScratchBytes.
int64_t TopKRatioScratchBytes(int64_t n, int64_t k);

template <typename T>
int TopKRatio(const T* gradient, const T* residual, const T* weights,
              float floor, int64_t n, int64_t k, T* acc, T* values,
              int32_t* indices, void* scratch, void* stream);

// A selection takes three calls on the same stream and scratch:
//   TopKSamplePlan       the statistics, the order statistics, the
//                        bisection and the plan with its tile offsets, all
//                        left in `scratch`; no host synchronisation;
//   TopKSampleOutputSize the plan's output size: k in mstopk and trimmed
//                        modes, with no synchronisation; in threshold mode
//                        it depends on the data: one copy to the host and
//                        one stream synchronisation;
//   TopKSampleWrite      the selection (`output_size` entries).
// 0 <= k <= n.
template <typename T>
int TopKSamplePlan(const T* x, int64_t n, int64_t k, TopKSampleMode mode,
                   int rounds, int64_t seed, void* scratch, void* stream);

int TopKSampleOutputSize(TopKSampleMode mode, int64_t n, int64_t k,
                         const void* scratch, void* stream,
                         int64_t* output_size);

// Writes the output_size values and int32 indices in index order; when
// `zero_selected` is not null, also zeroes those positions there (it may be
// `x` itself).
template <typename T>
int TopKSampleWrite(const T* x, int64_t n, int64_t output_size, T* values,
                    int32_t* indices, T* zero_selected, void* scratch,
                    void* stream);

// ---------------------------------------------------------------------------
// Segmented selection: one selection over many tensors fused in one buffer,
// in one set of launches instead of one per tensor. Each segment's values,
// indices and zeroed entries are bit for bit those of the single-tensor
// launchers above run on the segment alone with its own k and seed; mode
// and rounds are shared. The single-tensor launchers are the one-segment
// case of the same kernels. Segment tables (TopKSampleSegment, host
// memory) are as in top_k_sample_common.h.
// ---------------------------------------------------------------------------

// Bytes of device scratch for these segments on the current device (-1
// for an invalid table).
int64_t TopKSampleSegmentsScratchBytes(const TopKSampleSegment* segments,
                                       int count);

// As TopKSamplePlan / TopKSampleOutputSize / TopKSampleWrite, for every
// segment at once (the same table, stream and scratch in all three):
//   TopKSampleSegmentsPlan        copies the table to the scratch (one
//                                 asynchronous copy from the host) and
//                                 plans every segment; no host
//                                 synchronisation;
//   TopKSampleSegmentsOutputSizes every segment's output size into
//                                 output_sizes[count] (host): k (0 for an
//                                 empty segment) in mstopk and trimmed
//                                 modes, with no synchronisation; in
//                                 threshold mode one copy of all the sizes
//                                 to the host and one stream
//                                 synchronisation;
//   TopKSampleSegmentsWrite       the selections one after another in
//                                 segment order into values and indices
//                                 (output_size entries in all, the sum of
//                                 the sizes), each segment's indices
//                                 counted from its own start; with
//                                 `zero_selected` (a buffer laid out as
//                                 `x`, possibly `x`), those entries zeroed.
// A residual is added to the whole fused buffer by AddResidual. An invalid
// table gives cudaErrorInvalidValue.
template <typename T>
int TopKSampleSegmentsPlan(const T* x, const TopKSampleSegment* segments,
                           int count, TopKSampleMode mode, int rounds,
                           void* scratch, void* stream);

int TopKSampleSegmentsOutputSizes(TopKSampleMode mode,
                                  const TopKSampleSegment* segments,
                                  int count, const void* scratch,
                                  void* stream, int64_t* output_sizes);

template <typename T>
int TopKSampleSegmentsWrite(const T* x, const TopKSampleSegment* segments,
                            int count, int64_t output_size, T* values,
                            int32_t* indices, T* zero_selected,
                            void* scratch, void* stream);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_GPU_H_
