// Copyright 2026 The tfgc Authors.
//
// ScatterAddSum: out[j] = sum of values[i] over every i with indices[i] == j,
// a dense vector of length n (the decompression of (values, indices) pairs
// all-gathered from several workers, in worker order). Each element's values
// are added in input order in a float32 sum starting at +0, then rounded
// once to half or bfloat16: the CPU and CUDA kernels give the same bits
// (but for the payload of a NaN). The op's functor (kernel_utils.h
// describes the layout): the CPU specialisation in scatter_kernels.cc, the
// GPU one over the launcher of scatter_gpu.h.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/kernel_utils.h"

namespace tfgc {

// The CPU kernel sums tile by tile: 2^14 float32 accumulators (64 KiB) stay
// in the L1/L2 cache while the tile's values are added.
constexpr int kScatterTileBits = 14;
constexpr int64_t kScatterTile = int64_t{1} << kScatterTileBits;

// One value bucketed for its tile: its offset in the tile and the value.
struct ScatterEntry {
  uint32_t offset;
  float value;
};

namespace functor {

// out[j] = the float32 sum, in input order from +0, of values[i] over every
// i with indices[i] == j, rounded once to T; out has n elements. When an
// index is outside [0, n), sets *bad_position to the lowest such i and
// *bad_index to indices[i] (out is then not computed), else *bad_position
// to -1.
template <typename Device, typename T>
struct ScatterAddSum {
  absl::Status operator()(OpKernelContext* ctx, const T* values,
                          const int32_t* indices, int64_t m, int64_t n,
                          T* out, int64_t* bad_position, int32_t* bad_index);
};

}  // namespace functor
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_KERNELS_H_
