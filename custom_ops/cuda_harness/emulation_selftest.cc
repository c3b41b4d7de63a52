// Copyright 2026 The tfgc Authors.
//
// Checks of the CUDA emulation itself (cuda_emulation.h), so that a kernel
// passing on it means something: warp intrinsics, indices and atomics give
// what CUDA specifies, a missing barrier changes results, and misuse
// (a barrier not every thread reaches, divergent barriers, partial warp
// masks, out-of-bounds accesses, host pointers, endless loops) aborts with a
// message. tests/ops/test_cuda_emulation.py builds it with
//   g++ -x c++ -std=c++17 -pthread -DTFGC_CUDA_EMULATION -I<repo> ...
// and runs `emulation_selftest SCENARIO`; the scenarios that check a
// result print "ok" and exit 0, the others abort. The kernels below launch
// through cuda_launch.h's LaunchKernel, as the kernel sources do.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// The CUDA API first: cuda_launch.h includes the CUDA headers only under
// nvcc (the harness build force-includes the emulation instead).
#include "custom_ops/cuda_harness/cuda_emulation.h"

#include "custom_ops/cc/kernels/cuda_launch.h"

namespace {

using tfgc::gpu::LaunchKernel;

constexpr unsigned kFull = 0xffffffffu;

// out[4 * t + i]: shfl_down by 1 and 5, shfl_up by 3 within 8-lane
// segments, and the ballot of lane % 3 == 0 (thread t of one block).
__global__ void WarpKernel(int* out) {
  const int t = threadIdx.x;
  const int v = 100 * t + 7;
  out[4 * t] = __shfl_down_sync(kFull, v, 1);
  out[4 * t + 1] = __shfl_down_sync(kFull, v, 5);
  out[4 * t + 2] = __shfl_up_sync(kFull, v, 3, 8);
  out[4 * t + 3] = static_cast<int>(__ballot_sync(kFull, t % 3 == 0));
}

bool CheckWarp() {
  const int threads = 64;
  int* d_out;
  cudaMalloc(reinterpret_cast<void**>(&d_out), 4 * threads * sizeof(int));
  LaunchKernel(WarpKernel, 1, threads, 0, nullptr, d_out);
  std::vector<int> out(4 * threads);
  cudaMemcpy(out.data(), d_out, out.size() * sizeof(int),
             cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  for (int t = 0; t < threads; ++t) {
    const int lane = t % 32, warp = t / 32;
    auto value = [&](int l) { return 100 * (32 * warp + l) + 7; };
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l) ballot |= ((32 * warp + l) % 3 == 0) << l;
    const int want[4] = {
        value(lane + 1 < 32 ? lane + 1 : lane),
        value(lane + 5 < 32 ? lane + 5 : lane),
        value(lane % 8 >= 3 ? lane - 3 : lane),
        static_cast<int>(ballot),
    };
    for (int i = 0; i < 4; ++i) {
      if (out[4 * t + i] != want[i]) {
        std::printf("warp: thread %d item %d is %d, want %d\n", t, i,
                    out[4 * t + i], want[i]);
        return false;
      }
    }
  }
  return true;
}

// Every thread of a 3-D grid of 3-D blocks writes its coordinates.
__global__ void IndexKernel(int* out) {
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y *
                                                               blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y *
                                                                   threadIdx.z);
  const int id = block * blockDim.x * blockDim.y * blockDim.z + thread;
  out[id] = (((blockIdx.z * 4 + blockIdx.y) * 4 + blockIdx.x) * 8 +
             threadIdx.z) * 64 + threadIdx.y * 16 + threadIdx.x;
}

bool CheckIndices() {
  const dim3 grid(3, 2, 2), block(16, 4, 2);
  const int total = 3 * 2 * 2 * 16 * 4 * 2;
  int* d_out;
  cudaMalloc(reinterpret_cast<void**>(&d_out), total * sizeof(int));
  LaunchKernel(IndexKernel, grid, block, 0, nullptr, d_out);
  std::vector<int> out(total);
  cudaMemcpy(out.data(), d_out, total * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  int id = 0;
  for (unsigned bz = 0; bz < 2; ++bz) {
    for (unsigned by = 0; by < 2; ++by) {
      for (unsigned bx = 0; bx < 3; ++bx) {
        for (unsigned tz = 0; tz < 2; ++tz) {
          for (unsigned ty = 0; ty < 4; ++ty) {
            for (unsigned tx = 0; tx < 16; ++tx, ++id) {
              const int want =
                  (((bz * 4 + by) * 4 + bx) * 8 + tz) * 64 + ty * 16 + tx;
              if (out[id] != want) {
                std::printf("indices: element %d is %d, want %d\n", id,
                            out[id], want);
                return false;
              }
            }
          }
        }
      }
    }
  }
  return true;
}

__global__ void AtomicKernel(unsigned long long* count, float* sum) {
  atomicAdd(count, 1ull);
  atomicAdd(sum, 0.5f);
}

bool CheckAtomics() {
  unsigned long long* d_count;
  float* d_sum;
  cudaMalloc(reinterpret_cast<void**>(&d_count), sizeof(*d_count));
  cudaMalloc(reinterpret_cast<void**>(&d_sum), sizeof(*d_sum));
  cudaMemsetAsync(d_count, 0, sizeof(*d_count));
  cudaMemsetAsync(d_sum, 0, sizeof(*d_sum));
  LaunchKernel(AtomicKernel, 4, 96, 0, nullptr, d_count, d_sum);
  unsigned long long count = 0;
  float sum = 0;
  cudaMemcpy(&count, d_count, sizeof(count), cudaMemcpyDeviceToHost);
  cudaMemcpy(&sum, d_sum, sizeof(sum), cudaMemcpyDeviceToHost);
  cudaFree(d_count);
  cudaFree(d_sum);
  if (count != 384 || sum != 192.0f) {
    std::printf("atomics: count %llu sum %g, want 384 and 192\n", count,
                sum);
    return false;
  }
  return true;
}

// out[t] = in[t + 1] written by another thread of the block through shared
// memory: correct only with the barrier.
template <bool kBarrier>
__global__ void NeighbourKernel(int* out) {
  __shared__ int s[128];
  const int t = threadIdx.x;
  s[t] = t + blockIdx.x * 1000;
  if (kBarrier) __syncthreads();
  out[blockIdx.x * 128 + t] = s[(t + 1) % 128];
  if (kBarrier) __syncthreads();  // s is rewritten by the next block
}

// 0 when every value is right.
template <bool kBarrier>
int NeighbourErrors() {
  const int blocks = 3;
  int* d_out;
  cudaMalloc(reinterpret_cast<void**>(&d_out), blocks * 128 * sizeof(int));
  LaunchKernel(NeighbourKernel<kBarrier>, blocks, 128, 0, nullptr, d_out);
  std::vector<int> out(blocks * 128);
  cudaMemcpy(out.data(), d_out, out.size() * sizeof(int),
             cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  int errors = 0;
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < 128; ++t) {
      errors += out[b * 128 + t] != (t + 1) % 128 + b * 1000;
    }
  }
  return errors;
}

// Under every schedule the barrier version is right and the one without it
// is not.
bool CheckRace() {
  for (int schedule = 0; schedule < 3; ++schedule) {
    tfgc::emu::Config config = tfgc::emu::GetConfig();
    config.schedule = static_cast<tfgc::emu::Schedule>(schedule);
    config.seed = 5;
    tfgc::emu::Configure(config);
    const int with = NeighbourErrors<true>();
    const int without = NeighbourErrors<false>();
    if (with != 0 || without == 0) {
      std::printf("race: schedule %d: %d errors with the barrier, %d "
                  "without\n",
                  schedule, with, without);
      return false;
    }
  }
  return true;
}

bool CheckLaunchErrors() {
  int* d_out;
  cudaMalloc(reinterpret_cast<void**>(&d_out), 4 * 64 * sizeof(int));
  const int max_grid = tfgc::emu::GetConfig().max_grid_x;
  LaunchKernel(WarpKernel, max_grid + 1, 64, 0, nullptr, d_out);
  const cudaError_t too_many_blocks = cudaGetLastError();
  LaunchKernel(WarpKernel, 1, 2048, 0, nullptr, d_out);
  const cudaError_t too_many_threads = cudaGetLastError();
  const cudaError_t cleared = cudaGetLastError();
  cudaFree(d_out);
  if (too_many_blocks != cudaErrorInvalidConfiguration ||
      too_many_threads != cudaErrorInvalidConfiguration ||
      cleared != cudaSuccess) {
    std::printf("launch errors: %d %d %d\n", too_many_blocks,
                too_many_threads, cleared);
    return false;
  }
  return true;
}

// Kernels that misuse CUDA: each run aborts the process.
__global__ void EarlyReturnKernel() {
  if (threadIdx.x == 5) return;
  __syncthreads();
}

__global__ void DivergentBarrierKernel() {
  if (threadIdx.x < 64) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

__global__ void DivergentWarpKernel(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x % 32 == 3) {
    v = __shfl_down_sync(kFull, v, 1);
  } else {
    v = __shfl_down_sync(kFull, v, 2);
  }
  out[threadIdx.x] = v;
}

__global__ void PartialMaskKernel(int* out) {
  out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, 1, 1);
}

__global__ void ReadPastEndKernel(const float* x, int n, float* out) {
  const int i = threadIdx.x;
  if (i <= n) out[0] = x[i];  // off by one
}

__global__ void EndlessKernel(int* flag) {
  while (*flag == 0) {
  }
}

int* DeviceInts(int n) {
  int* p;
  cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(int));
  cudaMemsetAsync(p, 0, n * sizeof(int));
  return p;
}

int Run(const std::string& scenario) {
  bool ok = true;
  if (scenario == "warp") {
    ok = CheckWarp();
  } else if (scenario == "indices") {
    ok = CheckIndices();
  } else if (scenario == "atomics") {
    ok = CheckAtomics();
  } else if (scenario == "race") {
    ok = CheckRace();
  } else if (scenario == "launch-errors") {
    ok = CheckLaunchErrors();
  } else if (scenario == "early-return") {
    LaunchKernel(EarlyReturnKernel, 1, 128, 0, nullptr);
  } else if (scenario == "divergent-barrier") {
    LaunchKernel(DivergentBarrierKernel, 1, 128, 0, nullptr);
  } else if (scenario == "divergent-warp") {
    LaunchKernel(DivergentWarpKernel, 1, 64, 0, nullptr, DeviceInts(64));
  } else if (scenario == "partial-mask") {
    LaunchKernel(PartialMaskKernel, 1, 32, 0, nullptr, DeviceInts(32));
  } else if (scenario == "read-past-end") {
    const int n = 37;
    float* x;
    cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(float));
    LaunchKernel(ReadPastEndKernel, 1, 64, 0, nullptr, x, n, x);
  } else if (scenario == "host-pointer") {
    int host[32];
    LaunchKernel(PartialMaskKernel, 1, 32, 0, nullptr, host);
  } else if (scenario == "copy-to-host-memory") {
    int host[4] = {}, other[4] = {};
    cudaMemcpy(other, host, sizeof(host), cudaMemcpyHostToDevice);
  } else if (scenario == "copy-past-end") {
    int host[8] = {};
    cudaMemcpy(DeviceInts(7), host, sizeof(host), cudaMemcpyHostToDevice);
  } else if (scenario == "endless") {
    tfgc::emu::Config config = tfgc::emu::GetConfig();
    config.launch_timeout_s = 1;
    tfgc::emu::Configure(config);
    LaunchKernel(EndlessKernel, 1, 32, 0, nullptr, DeviceInts(1));
  } else {
    std::printf("unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  std::printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
    return 2;
  }
  return Run(argv[1]);
}
