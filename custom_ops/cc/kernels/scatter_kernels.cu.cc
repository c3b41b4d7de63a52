// Copyright 2026 The tfgc Authors.
//
// CUDA kernel of ScatterAddSum. No TensorFlow header: the TF glue
// (scatter_kernels.cc, GOOGLE_CUDA) links it as is. The float32 sum is zeroed
// with a memset and every value is added with one float atomicAdd (half and
// bfloat16 into a float32 buffer that a second kernel rounds once), so
// values sent to the same index by several workers add up in an order the
// scheduler picks: the last bits may differ between runs, unlike the CPU
// kernel's input-order sums. An index outside [0, n) only raises a flag; the
// launcher then copies the indices to the host to name the first one.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/scatter_kernels.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;

int Grid(int64_t work) { return StrideGridFor(work, kThreads); }

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ void Store(__half* p, float v) {
  *p = __float2half_rn(v);
}
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

template <typename T>
__global__ void ScatterKernel(const T* values, const int32_t* indices,
                              int64_t m, int64_t n, float* sum,
                              unsigned* bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t j = indices[i];
    if (j < 0 || j >= n) {
      *bad = 1u;  // every writer stores the same value
    } else {
      atomicAdd(sum + j, ToFloat(values[i]));
    }
  }
}

template <typename T>
__global__ void RoundKernel(const float* sum, int64_t n, T* out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    Store(out + e, sum[e]);
  }
}

template <typename T>
cudaError_t Sum(const void* values, const int32_t* indices, int64_t m,
                int64_t n, void* out, float* acc, unsigned* bad,
                cudaStream_t s) {
  constexpr bool kFloat = std::is_same<T, float>::value;
  float* sum = kFloat ? static_cast<float*>(out) : acc;
  if (n > 0) {
    const cudaError_t err = cudaMemsetAsync(sum, 0, n * sizeof(float), s);
    if (err != cudaSuccess) return err;
  }
  if (m > 0) {
    LaunchKernel(ScatterKernel<T>, Grid(m), kThreads, 0, s,
                 static_cast<const T*>(values), indices, m, n, sum, bad);
  }
  if constexpr (!kFloat) {
    if (n > 0) {
      LaunchKernel(RoundKernel<T>, Grid(n), kThreads, 0, s,
                   static_cast<const float*>(acc), n, static_cast<T*>(out));
    }
  }
  return cudaGetLastError();
}

// Sets *position and *index to the first index outside [0, n).
cudaError_t FindBadIndex(const int32_t* indices, int64_t m, int64_t n,
                         cudaStream_t s, int64_t* position, int32_t* index) {
  std::vector<int32_t> host(m);
  cudaError_t err = cudaMemcpyAsync(host.data(), indices, m * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return err;
  for (int64_t i = 0; i < m; ++i) {
    if (host[i] < 0 || host[i] >= n) {
      *position = i;
      *index = host[i];
      break;
    }
  }
  return cudaSuccess;
}

}  // namespace

int ScatterAddSum(int dtype, const void* values, const int32_t* indices,
                  int64_t m, int64_t n, void* out, float* acc, void* scratch,
                  void* stream, int64_t* bad_position, int32_t* bad_index) {
  *bad_position = -1;
  auto s = static_cast<cudaStream_t>(stream);
  auto* bad = static_cast<unsigned*>(scratch);
  cudaError_t err = cudaMemsetAsync(bad, 0, sizeof(unsigned), s);
  if (err != cudaSuccess) return static_cast<int>(err);
  switch (dtype) {
    case 0:
      err = Sum<float>(values, indices, m, n, out, acc, bad, s);
      break;
    case 1:
      err = Sum<__half>(values, indices, m, n, out, acc, bad, s);
      break;
    case 2:
      err = Sum<__nv_bfloat16>(values, indices, m, n, out, acc, bad, s);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  if (err != cudaSuccess || m == 0) return static_cast<int>(err);
  // The op must fail on a bad index, so the host waits for the flag.
  unsigned host_bad = 0;
  err = cudaMemcpyAsync(&host_bad, bad, sizeof(host_bad),
                        cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err == cudaSuccess && host_bad != 0) {
    err = FindBadIndex(indices, m, n, s, bad_position, bad_index);
  }
  return static_cast<int>(err);
}

}  // namespace gpu
}  // namespace tfgc
