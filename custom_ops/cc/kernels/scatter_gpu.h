// Copyright 2026 The tfgc Authors.
//
// The CUDA launcher of ScatterAddSum (scatter_kernels.cu.cc), typed on the
// element type T: float, __half or __nv_bfloat16, the types it is
// instantiated for. The GPU functor of scatter_kernels.cc and the CUDA
// harness call it. No TensorFlow or CUDA header here (kernel_utils.h says
// why).

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_GPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_GPU_H_

#include <cstdint>

namespace tfgc {
namespace gpu {

// Bytes of the device scratch ScatterAddSum needs for m values.
int64_t ScatterAddSumScratchBytes(int64_t m);

// out[n] = the sums of the m values at their indices, through `scratch` of
// ScatterAddSumScratchBytes(m) bytes; device pointers except the last two,
// `stream` a cudaStream_t. Every element is the float32 sum of its values
// in input order, from +0 and left to right, rounded once to T: the CPU
// kernel's bits (a NaN may carry another payload), on every run. When
// m > 0, blocks until the indices are checked, then sets *bad_position to
// the lowest i with indices[i] outside [0, n) and *bad_index to indices[i]
// (the sums are then not computed), or *bad_position to -1. Returns a
// cudaError_t value (0 is success).
template <typename T>
int ScatterAddSum(const T* values, const int32_t* indices, int64_t m,
                  int64_t n, T* out, void* scratch, void* stream,
                  int64_t* bad_position, int32_t* bad_index);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_GPU_H_
