// Copyright 2026 The tfgc Authors.
//
// The CUDA headers and the kernel launch of the *.cu.cc kernels. Only
// *.cu.cc files include this header; the TensorFlow glue and the CPU code
// never do.
//
// Under nvcc this header includes the CUDA headers and LaunchKernel is
// kernel<<<grid, block, shmem, stream>>>(args...). A host compiler cannot
// parse <<<>>>: there LaunchKernel goes through the runtime API's
// cudaLaunchKernel, as TensorFlow's GpuLaunchKernel does, and the CUDA API
// must already be declared when this header is read. No production build
// compiles the kernels that way; the test harness in custom_ops/cuda_harness
// does, force-including its CPU emulation of CUDA (which defines
// TFGC_CUDA_EMULATION) before each source.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_LAUNCH_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_CUDA_LAUNCH_H_

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#elif !defined(TFGC_CUDA_EMULATION)
#error "the *.cu.cc kernels compile with nvcc (or on a CUDA emulation)"
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace tfgc {
namespace gpu {

// kernel<<<grid, block, shmem, stream>>>(args...), spelled as a function so
// that it is C++ too. The arguments convert to the kernel's parameter types
// as in a launch; check cudaGetLastError() afterwards, as after <<<>>>.
template <typename... Params, typename... Args>
void LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                  size_t shmem, cudaStream_t stream, Args... args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "kernel launched with the wrong number of arguments");
#if defined(__CUDACC__)
  kernel<<<grid, block, shmem, stream>>>(args...);
#else
  // The parameters' values, converted once, and a pointer to each.
  std::tuple<std::decay_t<Params>...> values(args...);
  std::apply(
      [&](auto&... value) {
        std::array<void*, sizeof...(Params)> pointers = {
            static_cast<void*>(&value)...};
        // Its result is also cudaGetLastError()'s.
        (void)cudaLaunchKernel(kernel, grid, block, pointers.data(), shmem,
                               stream);
      },
      values);
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
