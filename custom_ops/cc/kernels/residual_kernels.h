// Copyright 2026 The tfgc Authors.
//
// NewResidual: what error feedback keeps after a step, corrected - sent,
// and +0 wherever sent is not finite, in one pass over both inputs. The
// op's functor (kernel_utils.h describes the layout): the CPU
// specialisation in residual_kernels.cc, the GPU one over the launcher of
// residual_gpu.h.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_RESIDUAL_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_RESIDUAL_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/kernel_utils.h"

namespace tfgc {
namespace functor {

// out[i] = corrected[i] - sent[i] where sent[i] is finite, else +0; the
// subtraction is T's own (float32 arithmetic rounded once for half and
// bfloat16), with subnormals flushed as TensorFlow's CPU threads flush them.
template <typename Device, typename T>
struct NewResidual {
  absl::Status operator()(OpKernelContext* ctx, const T* corrected,
                          const T* sent, int64_t n, T* out);
};

}  // namespace functor
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_RESIDUAL_KERNELS_H_
