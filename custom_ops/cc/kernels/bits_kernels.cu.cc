// Copyright 2026 The tfgc Authors.
//
// CUDA kernels of the bit-packing ops and their launchers (bits_gpu.h), the
// reductions instantiated for float, __half and __nv_bfloat16. No
// TensorFlow header: the GPU functors (bits_kernels.cc, GOOGLE_CUDA) and
// custom_ops/cuda_harness/ link it as is.
// PackBits builds each word with one warp ballot (32 coalesced byte reads);
// the unpack kernels give one thread per output element. Grids come from the
// device's multiprocessor count and maximum grid size.

#include <algorithm>
#include <cstdint>

#include "custom_ops/cc/kernels/bits_gpu.h"
#include "custom_ops/cc/kernels/cuda_float.h"
#include "custom_ops/cc/kernels/cuda_launch.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;

int Grid(int64_t work) { return StrideGridFor(work, kThreads); }

__global__ void PackKernel(const bool* mask, int64_t n, int32_t* words) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t start = warp * 32; start < n; start += warps * 32) {
    const int64_t i = start + lane;
    const bool bit = i < n && mask[i];
    const unsigned word = __ballot_sync(0xffffffffu, bit);
    if (lane == 0) words[start / 32] = static_cast<int32_t>(word);
  }
}

__global__ void UnpackKernel(const int32_t* words, int64_t rows, int64_t n,
                             bool* mask) {
  const int64_t w = (n + 31) / 32;
  const int64_t total = rows * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / n, col = e - row * n;
    const uint32_t word = static_cast<uint32_t>(words[row * w + col / 32]);
    mask[e] = (word >> (col % 32)) & 1u;
  }
}

// out[e] = the sum over rows of +-scale (in row order, subnormals flushed
// as on the CPU), or the majority vote +-1 (a tie votes +1).
template <typename T, bool kVote>
__global__ void ReduceKernel(const int32_t* words, const T* scales,
                             int64_t p, int64_t n, T* out) {
  const int64_t w = (n + 31) / 32;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / 32;
    const int bit = static_cast<int>(e % 32);
    float acc = 0.0f;
    int64_t votes = 0;
    for (int64_t i = 0; i < p; ++i) {
      const bool set = (static_cast<uint32_t>(words[i * w + j]) >> bit) & 1u;
      if (kVote) {
        votes += set;
      } else {
        const float s = ToFloat(scales[i]);
        acc = AddFlushed(acc, set ? s : -s);
      }
    }
    Store(out + e, kVote ? (2 * votes >= p ? 1.0f : -1.0f) : acc);
  }
}

template <typename T, bool kVote>
int Reduce(const int32_t* words, const T* scales, int64_t p, int64_t n,
           T* out, void* stream) {
  if (n == 0) return 0;
  LaunchKernel(ReduceKernel<T, kVote>, Grid(n), kThreads, 0,
               static_cast<cudaStream_t>(stream), words, scales, p, n, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int PackBits(const bool* mask, int64_t n, int32_t* words, void* stream) {
  if (n == 0) return 0;
  LaunchKernel(PackKernel, Grid(n), kThreads, 0,
               static_cast<cudaStream_t>(stream), mask, n, words);
  return static_cast<int>(cudaGetLastError());
}

int UnpackBits(const int32_t* words, int64_t rows, int64_t n, bool* mask,
               void* stream) {
  if (rows * n == 0) return 0;
  LaunchKernel(UnpackKernel, Grid(rows * n), kThreads, 0,
               static_cast<cudaStream_t>(stream), words, rows, n, mask);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int UnpackBitsSum(const int32_t* words, const T* scales, int64_t p,
                  int64_t n, T* out, void* stream) {
  return Reduce<T, false>(words, scales, p, n, out, stream);
}

template <typename T>
int UnpackBitsVote(const int32_t* words, int64_t p, int64_t n, T* out,
                   void* stream) {
  return Reduce<T, true>(words, static_cast<const T*>(nullptr), p, n, out,
                         stream);
}

// The launchers of bits_gpu.h for each element type.
#define TFGC_INSTANTIATE_BITS(T)                                             \
  template int UnpackBitsSum(const int32_t*, const T*, int64_t, int64_t, T*, \
                             void*);                                         \
  template int UnpackBitsVote(const int32_t*, int64_t, int64_t, T*, void*);

TFGC_INSTANTIATE_BITS(float)
TFGC_INSTANTIATE_BITS(__half)
TFGC_INSTANTIATE_BITS(__nv_bfloat16)

#undef TFGC_INSTANTIATE_BITS

}  // namespace gpu
}  // namespace tfgc
