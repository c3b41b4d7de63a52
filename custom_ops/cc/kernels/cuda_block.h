// Copyright 2026 The tfgc Authors.
//
// Warp and block reductions, and the radix select's bucket search, that
// several *.cu.cc kernels share. Only
// *.cu.cc files include this header (after cuda_launch.h's CUDA headers, or
// the harness's emulation of them).

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_BLOCK_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_BLOCK_H_

#include "custom_ops/cc/kernels/cuda_launch.h"

namespace tfgc {
namespace gpu {

// The sum of v over the warp, in lane 0 (a full warp calls it).
template <typename V>
__device__ __forceinline__ V WarpSum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Exclusive scan of one value per thread of a block of kBlockThreads
// threads (whole warps); *total gets the block's sum. Every thread must
// call it (it has barriers).
template <int kBlockThreads, typename V>
__device__ __forceinline__ V BlockExclusiveScan(V v, V* total) {
  static_assert(kBlockThreads % 32 == 0 && kBlockThreads <= 1024,
                "whole warps, at most 1024 threads");
  constexpr int warps = kBlockThreads / 32;
  __shared__ V s_warp[warps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  V incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const V y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  V warp_base = 0, sum = 0;
  for (int w = 0; w < warps; ++w) {
    if (w < warp) warp_base += s_warp[w];
    sum += s_warp[w];
  }
  __syncthreads();
  *total = sum;
  return warp_base + incl - v;
}

// A radix select's bucket search by a block of kBlockThreads threads in the
// histogram h of `bins` bins (a multiple of kBlockThreads): thread t holds
// the bins top, top - 1, ..., top - per + 1 (top = bins - 1 - t per, per =
// bins / kBlockThreads), the block scans their counts from the largest bin
// down, and the thread whose bins hold rank `rank` (1-based, from the
// largest) sets *bin to that bin and *above to the count of the bins
// above it; none does when rank exceeds the total. Returns the total to
// every thread. Every thread must call it (it has barriers); *bin and
// *above (shared memory) are read after a __syncthreads().
template <int kBlockThreads>
__device__ __forceinline__ int64_t FindRankBin(const uint32_t* h, int bins,
                                               int64_t rank, int* bin,
                                               int64_t* above) {
  const int per = bins / kBlockThreads;
  const int top = bins - 1 - static_cast<int>(threadIdx.x) * per;
  int64_t local = 0;
  for (int i = 0; i < per; ++i) local += h[top - i];
  int64_t total;
  int64_t before = BlockExclusiveScan<kBlockThreads>(local, &total);
  for (int i = 0; i < per; ++i) {
    const int64_t c = h[top - i];
    if (before < rank && rank <= before + c) {
      *bin = top - i;
      *above = before;
    }
    before += c;
  }
  return total;
}

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_BLOCK_H_
