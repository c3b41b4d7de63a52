// Copyright 2026 The tfgc Authors.
//
// CUDA kernel of ScatterAddSum and its launcher (scatter_gpu.h),
// instantiated for float, __half and __nv_bfloat16. No TensorFlow header:
// the GPU functor (scatter_kernels.cc, GOOGLE_CUDA) and
// custom_ops/cuda_harness/ link it as is.
//
// Deterministic, with no floating-point atomics: values sent to the same
// element by several workers must add up to the same bits on every worker
// and every run, or the workers' weights drift apart. Each element is the
// float32 sum of its values in input order (worker order for all-gathered
// payloads), from +0 and left to right, then rounded once to half or
// bfloat16: the CPU kernel's arithmetic. TensorFlow runs CPU kernels with
// float32 subnormals flushed to zero (FTZ and DAZ), so every addend and
// every partial sum is flushed here too, and both give the same bits (a
// NaN may carry another payload).
//
// How: a stable LSD radix sort of (index, float32 value) pairs on 8-bit
// digits of the index (as many passes as n - 1 has digits, one to four)
// brings each element's values together in input order; the first thread
// of each run then adds the run up and writes the element. A run is summed
// by one thread because a left-to-right float32 sum cannot be split without
// changing its rounding. Each pass: a per-block digit histogram; one block
// per digit scanning that digit's counts over the blocks into offsets (a
// single block scanning all of them was most of the op's time on an H100);
// and a scatter in which every block adds the digits' bases (a scan of the
// 256 digit totals) and walks its contiguous share of the input row by
// row, ranking the rows' equal digits with warp ballots. The first pass
// also checks the indices; the host waits for that check, as the op must
// fail on a bad index.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "custom_ops/cc/kernels/cuda_block.h"
#include "custom_ops/cc/kernels/cuda_float.h"
#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/scatter_gpu.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRadixBits = 8;
constexpr int kDigits = 1 << kRadixBits;
// The sort's grid: each block sorts a contiguous share of the input and
// has kDigits counters, which one block then scans.
constexpr int64_t kMaxSortBlocks = 256;
constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kThreads == kDigits, "one thread per digit in the scans");
static_assert(kMaxSortBlocks <= kThreads, "one thread per block's count");

__device__ __forceinline__ int64_t Min(int64_t a, int64_t b) {
  return a < b ? a : b;
}

int64_t SortBlocks(int64_t m) {
  return std::min<int64_t>(StrideGridFor(m, kThreads), kMaxSortBlocks);
}

// Share of the input each of `blocks` blocks sorts.
int64_t PerBlock(int64_t m, int64_t blocks) {
  return (m + blocks - 1) / blocks;
}

// counts[d * gridDim.x + block] = keys of the block's share with digit d.
// With `bad`, also raises the flag for an index outside [0, n).
__global__ void HistogramKernel(const uint32_t* keys, int64_t m,
                                int64_t per_block, int shift, int64_t n,
                                unsigned* bad, int64_t* counts) {
  __shared__ unsigned s_count[kDigits];
  s_count[threadIdx.x] = 0;
  __syncthreads();
  const int64_t begin = blockIdx.x * per_block;
  const int64_t end = Min(m, begin + per_block);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const uint32_t key = keys[i];
    if (bad != nullptr) {
      const int32_t j = static_cast<int32_t>(key);
      if (j < 0 || j >= n) *bad = 1u;  // every writer stores the same value
    }
    atomicAdd(&s_count[(key >> shift) & (kDigits - 1)], 1u);
  }
  __syncthreads();
  counts[threadIdx.x * int64_t{gridDim.x} + blockIdx.x] =
      s_count[threadIdx.x];
}

// Each digit's row of counts (one block per digit, one block's count per
// thread) scanned in place into offsets inside the row, and the row's
// total in totals[digit]; ScatterPassKernel adds the digits' bases.
__global__ void RowOffsetsKernel(int64_t* counts, int64_t blocks,
                                 int64_t* totals) {
  for (int d = blockIdx.x; d < kDigits; d += gridDim.x) {
    const int64_t at = d * blocks + threadIdx.x;
    const bool live = threadIdx.x < blocks;
    const int64_t c = live ? counts[at] : 0;
    int64_t total;
    const int64_t before = BlockExclusiveScan<kThreads>(c, &total);
    if (live) counts[at] = before;
    if (threadIdx.x == 0) totals[d] = total;
  }
}

// One stable pass: moves each (key, value) of the block's share to its
// digit's base (the totals of the smaller digits) plus
// offsets[digit * gridDim.x + block] plus its rank among the share's
// earlier keys with that digit. Rows of kThreads pairs in input order; in
// a row, the lanes of a warp with the same digit are found from one ballot
// per digit bit, and the warps' counts per digit go through shared memory
// (double-buffered by row parity: one barrier per row).
template <typename V>
__global__ void ScatterPassKernel(const uint32_t* keys, const V* values,
                                  int64_t m, int64_t per_block, int shift,
                                  const int64_t* offsets,
                                  const int64_t* totals, uint32_t* keys_out,
                                  float* values_out) {
  __shared__ int64_t s_base[2][kDigits];
  __shared__ unsigned s_warp_count[2][kWarps][kDigits];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t begin = blockIdx.x * per_block;
  const int64_t end = Min(m, begin + per_block);
  int64_t all;
  const int64_t digit_base = BlockExclusiveScan<kThreads>(totals[tid], &all);
  s_base[0][tid] =
      digit_base + offsets[tid * int64_t{gridDim.x} + blockIdx.x];
  int parity = 0;
  for (int64_t row = begin; row < end; row += kThreads, parity ^= 1) {
    const int64_t i = row + tid;
    const bool live = i < end;
    uint32_t key = 0;
    float value = 0.0f;
    if (live) {
      key = keys[i];
      value = ToFloat(values[i]);
    }
    const unsigned digit = (key >> shift) & (kDigits - 1);
    const unsigned live_lanes = __ballot_sync(kFullMask, live);
    unsigned bit_set[kRadixBits];
    for (int b = 0; b < kRadixBits; ++b) {
      bit_set[b] = __ballot_sync(kFullMask, (digit >> b) & 1u);
    }
    // The live lanes of this warp whose digit is d.
    auto lanes_with = [&](unsigned d) {
      unsigned lanes = live_lanes;
      for (int b = 0; b < kRadixBits; ++b) {
        lanes &= ((d >> b) & 1u) ? bit_set[b] : ~bit_set[b];
      }
      return lanes;
    };
    for (unsigned d = lane; d < kDigits; d += 32) {
      s_warp_count[parity][warp][d] = __popc(lanes_with(d));
    }
    __syncthreads();
    if (live) {
      int64_t pos = s_base[parity][digit] +
                    __popc(lanes_with(digit) & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) pos += s_warp_count[parity][w][digit];
      keys_out[pos] = key;
      values_out[pos] = value;
    }
    unsigned row_count = 0;
    for (int w = 0; w < kWarps; ++w) {
      row_count += s_warp_count[parity][w][tid];
    }
    s_base[parity ^ 1][tid] = s_base[parity][tid] + row_count;
  }
}

// Sorted by key: the first pair of each run sums the run and stores it.
template <typename T>
__global__ void SumRunsKernel(const uint32_t* keys, const float* values,
                              int64_t m, T* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t key = keys[i];
    if (i > 0 && keys[i - 1] == key) continue;
    float sum = 0.0f;
    for (int64_t j = i; j < m && keys[j] == key; ++j) {
      sum = AddFlushed(sum, values[j]);
    }
    Store(out + key, sum);
  }
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

// Where the parts of the scratch start.
struct Scratch {
  unsigned* bad;
  int64_t* counts;  // kDigits * blocks, then their offsets in the rows
  int64_t* totals;  // kDigits: each digit's count
  uint32_t* keys[2];
  float* values[2];
};

Scratch SplitScratch(void* scratch, int64_t m, int64_t blocks) {
  auto* p = static_cast<char*>(scratch);
  Scratch s;
  s.bad = reinterpret_cast<unsigned*>(p);
  s.counts = reinterpret_cast<int64_t*>(p + sizeof(int64_t));
  s.totals = s.counts + kDigits * blocks;
  auto* keys = reinterpret_cast<uint32_t*>(s.totals + kDigits);
  s.keys[0] = keys;
  s.keys[1] = keys + m;
  auto* values = reinterpret_cast<float*>(keys + 2 * m);
  s.values[0] = values;
  s.values[1] = values + m;
  return s;
}

// Sorts the pairs by index (the indices are valid) and writes the sums.
template <typename T>
cudaError_t Sum(const T* values, const int32_t* indices, int64_t m,
                int64_t n, T* out, const Scratch& scr, int64_t blocks,
                cudaStream_t s) {
  const int64_t per_block = PerBlock(m, blocks);
  const int grid = static_cast<int>(blocks);
  // Valid indices are below min(n, 2^31): that many bits to sort.
  const int64_t top = std::min<int64_t>(n, int64_t{1} << 31);
  int bits = 0;
  while ((int64_t{1} << bits) < top) ++bits;
  const int passes = std::max(1, (bits + kRadixBits - 1) / kRadixBits);
  const auto* keys = reinterpret_cast<const uint32_t*>(indices);
  for (int p = 0; p < passes; ++p) {
    const int shift = p * kRadixBits;
    // Pass 0's histogram ran with the index check.
    if (p > 0) {
      LaunchKernel(HistogramKernel, grid, kThreads, 0, s, keys, m, per_block,
                   shift, n, static_cast<unsigned*>(nullptr), scr.counts);
    }
    LaunchKernel(RowOffsetsKernel, StrideGridFor(kDigits * kThreads, kThreads),
                 kThreads, 0, s, scr.counts, blocks, scr.totals);
    if (p == 0) {
      LaunchKernel(ScatterPassKernel<T>, grid, kThreads, 0, s, keys, values,
                   m, per_block, shift,
                   static_cast<const int64_t*>(scr.counts),
                   static_cast<const int64_t*>(scr.totals), scr.keys[0],
                   scr.values[0]);
    } else {
      LaunchKernel(ScatterPassKernel<float>, grid, kThreads, 0, s, keys,
                   static_cast<const float*>(scr.values[(p - 1) % 2]), m,
                   per_block, shift, static_cast<const int64_t*>(scr.counts),
                   static_cast<const int64_t*>(scr.totals), scr.keys[p % 2],
                   scr.values[p % 2]);
    }
    keys = scr.keys[p % 2];
  }
  LaunchKernel(SumRunsKernel<T>, StrideGridFor(m, kThreads), kThreads, 0, s,
               keys, static_cast<const float*>(scr.values[(passes - 1) % 2]),
               m, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Run(const T* values, const int32_t* indices, int64_t m,
                int64_t n, T* out, void* scratch, cudaStream_t s,
                int64_t* bad_position, int32_t* bad_index) {
  // Elements no index points to are +0 (zero bits in all three types).
  cudaError_t err = cudaSuccess;
  if (n > 0) err = cudaMemsetAsync(out, 0, n * sizeof(T), s);
  if (err != cudaSuccess || m == 0) return err;
  const int64_t blocks = SortBlocks(m);
  const Scratch scr = SplitScratch(scratch, m, blocks);
  err = cudaMemsetAsync(scr.bad, 0, sizeof(unsigned), s);
  if (err != cudaSuccess) return err;
  LaunchKernel(HistogramKernel, static_cast<int>(blocks), kThreads, 0, s,
               reinterpret_cast<const uint32_t*>(indices), m,
               PerBlock(m, blocks), 0, n, scr.bad, scr.counts);
  err = cudaGetLastError();
  // The op must fail on a bad index, so the host waits for the flag.
  unsigned host_bad = 0;
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(&host_bad, scr.bad, sizeof(host_bad),
                          cudaMemcpyDeviceToHost, s);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return err;
  if (host_bad != 0) {
    return FindBadIndex(indices, m, n, s, bad_position, bad_index);
  }
  return Sum(values, indices, m, n, out, scr, blocks, s);
}

}  // namespace

int64_t ScatterAddSumScratchBytes(int64_t m) {
  if (m <= 0) return 0;
  // The flag (padded), the counts of at most this many blocks, the
  // digits' totals, and two (key, float32 value) buffers the passes
  // alternate between.
  const int64_t blocks =
      std::min<int64_t>((m + kThreads - 1) / kThreads, kMaxSortBlocks);
  return static_cast<int64_t>(sizeof(int64_t)) *
             (1 + kDigits * blocks + kDigits) +
         2 * m * static_cast<int64_t>(sizeof(uint32_t) + sizeof(float));
}

template <typename T>
int ScatterAddSum(const T* values, const int32_t* indices, int64_t m,
                  int64_t n, T* out, void* scratch, void* stream,
                  int64_t* bad_position, int32_t* bad_index) {
  *bad_position = -1;
  return static_cast<int>(Run(values, indices, m, n, out, scratch,
                              static_cast<cudaStream_t>(stream),
                              bad_position, bad_index));
}

// The launcher of scatter_gpu.h for each element type.
#define TFGC_INSTANTIATE_SCATTER(T)                                         \
  template int ScatterAddSum(const T*, const int32_t*, int64_t, int64_t, T*, \
                             void*, void*, int64_t*, int32_t*);

TFGC_INSTANTIATE_SCATTER(float)
TFGC_INSTANTIATE_SCATTER(__half)
TFGC_INSTANTIATE_SCATTER(__nv_bfloat16)

#undef TFGC_INSTANTIATE_SCATTER

}  // namespace gpu
}  // namespace tfgc
