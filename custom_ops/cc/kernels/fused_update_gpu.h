// Copyright 2026 The tfgc Authors.
//
// The CUDA launchers of FusedUpdate (fused_update_kernels.cu.cc), for float
// variables. The GPU functors of fused_update_kernels.cc and the CUDA
// harness call them. No TensorFlow or CUDA header here (kernel_utils.h says
// why). The rules and their arithmetic are fused_update_common.h's.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_GPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_GPU_H_

#include <cstdint>

#include "custom_ops/cc/kernels/fused_update_common.h"

namespace tfgc {
namespace gpu {

// Updates every one of the `count` tensors (a host array; their buffers are
// device pointers) by `rule`, with weight decay first when `weight_decay`.
// `scalars` is a device array of fused_update::NumScalars(rule,
// weight_decay) floats, read on the device (the host never waits for
// them). Each element gets the operations of fused_update::UpdateElement,
// every float32 operand and result that is subnormal flushed to a zero of
// its sign, as TensorFlow's CPU threads (FTZ and DAZ) compute them, so the
// CPU kernel's bits. Launches without waiting; `stream` is a cudaStream_t.
// Returns a cudaError_t value (0 is success; cudaErrorInvalidValue for a
// negative size or count).
int FusedUpdate(fused_update::Rule rule, bool weight_decay,
                const fused_update::Tensor<float>* tensors, int64_t count,
                const float* scalars, void* stream);

// dst[n] = src[n] on `stream` (device pointers): the copy a variable's
// buffer gets before an in-place update when something else still reads
// it.
int CopyBuffer(float* dst, const float* src, int64_t n, void* stream);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_GPU_H_
