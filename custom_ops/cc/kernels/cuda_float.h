// Copyright 2026 The tfgc Authors.
//
// Element types of the *.cu.cc kernels to and from float32, and the flush
// that gives a device addition the bits of TensorFlow's CPU kernels: those
// run on threads with FTZ and DAZ set, so a float32 (and bfloat16)
// subnormal counts as a zero of its sign there, while device code built
// without --ftz=true keeps it. Only *.cu.cc files include this header.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_FLOAT_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_FLOAT_H_

#include <cstdint>

#include "custom_ops/cc/kernels/cuda_launch.h"

namespace tfgc {
namespace gpu {

// The launchers take these for Eigen::half and Eigen::bfloat16 buffers
// (kernel_utils.h's ToCuda), which have this layout.
static_assert(sizeof(__half) == 2 && alignof(__half) == 2,
              "__half must have the layout of Eigen::half");
static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2,
              "__nv_bfloat16 must have the layout of Eigen::bfloat16");

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// *p = v rounded to nearest even in p's type.
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__half* p, float v) {
  *p = __float2half_rn(v);
}
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// A float32 subnormal becomes a zero of its sign, as on a CPU thread with
// FTZ and DAZ set (an addition's subnormal result is exact, so flushing it
// afterwards is what FTZ does).
__device__ __forceinline__ float Flush(float v) {
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x7f800000u) == 0 ? __uint_as_float(bits & 0x80000000u) : v;
}

// a + b as a CPU thread with FTZ and DAZ adds them.
__device__ __forceinline__ float AddFlushed(float a, float b) {
  return Flush(Flush(a) + Flush(b));
}

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_FLOAT_H_
