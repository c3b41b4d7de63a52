// Copyright 2026 The tfgc Authors.
//
// The CUDA launchers of the bit-packing ops (bits_kernels.cu.cc), the
// reductions typed on the element type T: float, __half or __nv_bfloat16,
// the types they are instantiated for. The GPU functors of bits_kernels.cc
// and the CUDA harness call them. No TensorFlow or CUDA header here
// (kernel_utils.h says why). Device pointers; `stream` is a cudaStream_t;
// the result is a cudaError_t value (0 is success). The bit layout is
// bits_kernels.h's.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_BITS_GPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_BITS_GPU_H_

#include <cstdint>

namespace tfgc {
namespace gpu {

// mask[n] into words[ceil(n / 32)].
int PackBits(const bool* mask, int64_t n, int32_t* words, void* stream);

// words[rows, ceil(n / 32)] into mask[rows, n].
int UnpackBits(const int32_t* words, int64_t rows, int64_t n, bool* mask,
               void* stream);

// out[i] = the sum over the p rows of words[p, ceil(n / 32)] of +scales[r]
// or -scales[r] as bit i of row r is set or not (in row order, subnormals
// flushed as on the CPU).
template <typename T>
int UnpackBitsSum(const int32_t* words, const T* scales, int64_t p,
                  int64_t n, T* out, void* stream);

// out[i] = +1 when at least half of the p rows set bit i, else -1.
template <typename T>
int UnpackBitsVote(const int32_t* words, int64_t p, int64_t n, T* out,
                   void* stream);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_BITS_GPU_H_
