// Copyright 2026 The tfgc Authors.
//
// ScatterAddSum: out[j] = sum of values[i] over every i with indices[i] == j,
// a dense vector of length n (the decompression of (values, indices) pairs
// all-gathered from several workers, in worker order). Each element's values
// are added in input order in a float32 sum starting at +0, then rounded
// once to half or bfloat16: the CPU and CUDA kernels give the same bits
// (but for the payload of a NaN).
// Shared by the CPU kernel and the CUDA kernel, which
// custom_ops/cuda_harness/ also compiles without TensorFlow; no TensorFlow
// header here.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_KERNELS_H_

#include <cstdint>

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

namespace gpu {

// CUDA launcher (scatter_kernels.cu.cc). Device pointers except the last
// two; `stream` is a cudaStream_t; `dtype` 0/1/2 = float/half/bfloat16 (as
// gpu::DType of top_k_sample_kernels.h); `scratch` holds
// ScatterAddSumScratchBytes(m) bytes. Every element is the float32 sum of
// its values in input order, from +0 and left to right, rounded once to
// the output type: the CPU kernel's bits (a NaN may carry another
// payload), on every run. When m > 0, blocks until the indices are
// checked, then sets *bad_position to the lowest i with indices[i] outside
// [0, n) and *bad_index to indices[i] (the sums are then not computed), or
// *bad_position to -1. Returns a cudaError_t value (0 is success).
int64_t ScatterAddSumScratchBytes(int64_t m);
int ScatterAddSum(int dtype, const void* values, const int32_t* indices,
                  int64_t m, int64_t n, void* out, void* scratch,
                  void* stream, int64_t* bad_position, int32_t* bad_index);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_SCATTER_KERNELS_H_
