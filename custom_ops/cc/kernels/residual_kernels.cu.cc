// Copyright 2026 The tfgc Authors.
//
// CUDA kernel of NewResidual and its launcher (residual_gpu.h),
// instantiated for float, __half and __nv_bfloat16. No TensorFlow header:
// the GPU functor (residual_kernels.cc, GOOGLE_CUDA) and
// custom_ops/cuda_harness/ link it as is. One grid-stride pass; each
// element is computed in float32 from its T values, flushed as a CPU
// thread with FTZ and DAZ computes it, and rounded once to T.

#include <cstdint>

#include "custom_ops/cc/kernels/cuda_float.h"
#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/residual_gpu.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void NewResidualKernel(const T* corrected, const T* sent, T* out,
                                  int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float s = ToFloat(sent[i]);
    // Finite: an exponent that is not all ones. c - s is c + (-s) in IEEE
    // arithmetic.
    const bool finite = (__float_as_uint(s) & 0x7f800000u) != 0x7f800000u;
    Store(out + i, finite ? AddFlushed(ToFloat(corrected[i]), -s) : 0.0f);
  }
}

}  // namespace

template <typename T>
int NewResidual(const T* corrected, const T* sent, int64_t n, T* out,
                void* stream) {
  if (n < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return 0;
  LaunchKernel(NewResidualKernel<T>, StrideGridFor(n, kThreads), kThreads, 0,
               static_cast<cudaStream_t>(stream), corrected, sent, out, n);
  return static_cast<int>(cudaGetLastError());
}

template int NewResidual(const float*, const float*, int64_t, float*, void*);
template int NewResidual(const __half*, const __half*, int64_t, __half*,
                         void*);
template int NewResidual(const __nv_bfloat16*, const __nv_bfloat16*, int64_t,
                         __nv_bfloat16*, void*);

}  // namespace gpu
}  // namespace tfgc
