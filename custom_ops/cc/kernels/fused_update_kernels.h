// Copyright 2026 The tfgc Authors.
//
// FusedUpdate: the update of many variables and their optimizer slots in
// one op, by a rule of fused_update_common.h (Keras's SGD, momentum,
// Nesterov, Adam/AdamW, bit for bit). The op's functors (kernel_utils.h
// describes the layout): the CPU specialisations in fused_update_kernels.cc,
// the GPU ones over the launchers of fused_update_gpu.h.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_KERNELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/fused_update_common.h"
#include "custom_ops/cc/kernels/kernel_utils.h"

namespace tfgc {
namespace functor {

// Updates every tensor in place by `rule` (weight decay first when
// `weight_decay`); `scalars` holds fused_update::NumScalars(rule,
// weight_decay) values in the device's memory.
template <typename Device, typename T>
struct FusedUpdate {
  absl::Status operator()(OpKernelContext* ctx, fused_update::Rule rule,
                          bool weight_decay,
                          const std::vector<fused_update::Tensor<T>>& tensors,
                          const T* scalars);
};

// dst[n] = src[n] in the device's memory.
template <typename Device, typename T>
struct CopyBuffer {
  absl::Status operator()(OpKernelContext* ctx, const T* src, int64_t n,
                          T* dst);
};

}  // namespace functor
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_KERNELS_H_
