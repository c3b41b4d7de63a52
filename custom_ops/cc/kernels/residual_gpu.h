// Copyright 2026 The tfgc Authors.
//
// The CUDA launcher of NewResidual (residual_kernels.cu.cc), typed on the
// element type T: float, __half or __nv_bfloat16, the types it is
// instantiated for. The GPU functor of residual_kernels.cc and the CUDA
// harness call it. No TensorFlow or CUDA header here (kernel_utils.h says
// why).

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_RESIDUAL_GPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_RESIDUAL_GPU_H_

#include <cstdint>

namespace tfgc {
namespace gpu {

// out[i] = corrected[i] - sent[i] where sent[i] is finite, else +0, for the
// n elements of the device buffers, with the CPU kernel's bits (float32
// subnormals flushed, as there). Launches without waiting; `stream` is a
// cudaStream_t. Returns a cudaError_t value (0 is success).
template <typename T>
int NewResidual(const T* corrected, const T* sent, int64_t n, T* out,
                void* stream);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_RESIDUAL_GPU_H_
