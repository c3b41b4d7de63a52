// Copyright 2026 The tfgc Authors.
//
// The functor of Tfgc>TopKTwoSided (kernel_utils.h describes the layout):
// the CPU specialisation in top_k_two_sided_kernels.cc, the GPU one over
// the launchers of top_k_two_sided_gpu.h. The definitions every
// implementation shares are in top_k_two_sided_common.h.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/top_k_two_sided_common.h"

namespace tfgc {
namespace functor {

// Both sides' selections in two steps, so that the op kernel can allocate
// the outputs (whose sizes depend on the data) in between; the selection
// goes from one step to the other in the functor object, one per Compute.
// `Cache` is what the op kernel keeps for the functor between calls. Each
// device specialises the whole class template; the primary template is
// only the interface both follow.
template <typename Device, typename T>
class TopKTwoSided {
 public:
  struct Cache;

  explicit TopKTwoSided(Cache* cache);

  // Selects both sides of x[0, n), 0 <= k <= n < 2^31, and sets
  // sizes[side] = min(k, the entries on that side).
  absl::Status Plan(OpKernelContext* ctx, const T* x, int64_t n, int64_t k,
                    int64_t sizes[kSides]);

  // Writes each side's selection (sizes[side] entries, some > 0): values
  // (x, or -x on the negative side) and int32 indices in index order.
  absl::Status Write(OpKernelContext* ctx, const T* x, int64_t n,
                     T* const values[kSides], int32_t* const indices[kSides]);
};

}  // namespace functor
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_KERNELS_H_
