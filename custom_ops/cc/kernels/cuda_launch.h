// Copyright 2026 The tfgc Authors.
//
// The CUDA headers and the kernel launch of the *.cu.cc kernels, so that one
// kernel source compiles with nvcc (real launches) and, with
// -DTFGC_CUDA_EMULATION, as plain C++ against the CPU emulation in
// custom_ops/cuda_harness/cuda_emulation.h, which runs the kernels in tests
// on machines without a GPU. Only *.cu.cc files include this header.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_LAUNCH_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_LAUNCH_H_

#if defined(TFGC_CUDA_EMULATION) && defined(__CUDACC__)
#error "TFGC_CUDA_EMULATION is for host compilers (g++ -x c++), not nvcc"
#elif defined(TFGC_CUDA_EMULATION)
#include "custom_ops/cuda_harness/cuda_emulation.h"
#elif defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#else
#error "cuda_launch.h needs nvcc or -DTFGC_CUDA_EMULATION"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tfgc {
namespace gpu {

// kernel<<<grid, block, shmem, stream>>>(args...), spelled as a function so
// that it is C++ too. The arguments convert to the kernel's parameter types
// as in a launch; check cudaGetLastError() afterwards, as after <<<>>>.
template <typename... Params, typename... Args>
void LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                  size_t shmem, cudaStream_t stream, Args... args) {
#if defined(TFGC_CUDA_EMULATION)
  emu::Launch(kernel, grid, block, shmem, stream, args...);
#else
  kernel<<<grid, block, shmem, stream>>>(args...);
#endif
}

// Blocks of `threads` for a grid-stride kernel over `work` items: enough to
// cover them, at most 16 per multiprocessor and the device's limit.
inline int StrideGridFor(int64_t work, int threads) {
  int dev = 0, sms = 1, max_grid = 65535;
  if (cudaGetDevice(&dev) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&max_grid, cudaDevAttrMaxGridDimX, dev);
  }
  const int64_t want = (work + threads - 1) / threads;
  const int64_t cap = std::min<int64_t>(int64_t{std::max(sms, 1)} * 16,
                                        std::max(max_grid, 1));
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_LAUNCH_H_
