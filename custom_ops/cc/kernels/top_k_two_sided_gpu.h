// Copyright 2026 The tfgc Authors.
//
// The CUDA launchers of TopKTwoSided (top_k_two_sided_kernels.cu.cc), typed
// on the element type T: float, __half or __nv_bfloat16, the types they are
// instantiated for. The GPU functor of top_k_two_sided_kernels.cc and the
// CUDA harness call them. No TensorFlow or CUDA header here (kernel_utils.h
// says why).
//
// A selection takes three calls on the same stream and scratch:
//   TopKTwoSidedPlan         every pass but the write: the keys' histograms
//                            of both sides, the radix select of each
//                            side's min(k, entries)-th largest key and the
//                            per-tile counts and offsets, on the device;
//   TopKTwoSidedOutputSizes  one copy of both sides' sizes to the host and
//                            the one wait for the stream (the sizes depend
//                            on the data);
//   TopKTwoSidedWrite        each side's selection at its rank, in index
//                            order.
// Pointers are device memory unless said otherwise; `stream` is a
// cudaStream_t; each returns a cudaError_t value (0 is success).

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_GPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_GPU_H_

#include <cstdint>

namespace tfgc {
namespace gpu {

// Bytes of the scratch of a selection from n elements.
int64_t TopKTwoSidedScratchBytes(int64_t n);

// Plans both sides' selections from x[0, n), 0 <= k <= n < 2^31; nothing
// when n or k is 0.
template <typename T>
int TopKTwoSidedPlan(const T* x, int64_t n, int64_t k, void* scratch,
                     void* stream);

// sizes[2] (host memory) = each side's selection size, min(k, entries on
// that side): copied from the plan (one copy and one wait) when n and k
// are > 0, else 0 without either.
int TopKTwoSidedOutputSizes(int64_t n, int64_t k, const void* scratch,
                            void* stream, int64_t* sizes);

// Writes both sides' selections: pos_values / pos_indices get x's values,
// neg_values / neg_indices -x (sign bit flipped); sizes[2] (host memory)
// are TopKTwoSidedOutputSizes's, the lengths of the outputs.
template <typename T>
int TopKTwoSidedWrite(const T* x, int64_t n, const int64_t* sizes,
                      T* pos_values, int32_t* pos_indices, T* neg_values,
                      int32_t* neg_indices, void* scratch, void* stream);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_GPU_H_
