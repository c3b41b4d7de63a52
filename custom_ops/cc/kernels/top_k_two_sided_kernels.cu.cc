// Copyright 2026 The tfgc Authors.
//
// CUDA kernels of TopKTwoSided and their typed launchers
// (top_k_two_sided_gpu.h), instantiated for float, __half and
// __nv_bfloat16. This file includes no TensorFlow header: the GPU functor
// (top_k_two_sided_kernels.cc, GOOGLE_CUDA) and the CUDA harness
// (custom_ops/cuda_harness/) both link it as is.
//
// Both sides are selected in the same launches, each element read once a
// pass for both (its keys on the two sides, top_k_two_sided_common.h). A
// side with at most k entries selects all of them; one with more selects
// every key above its k-th largest and, in index order, as many equal to
// it as complete k. Kernels, in stream order:
//   1. HistKernel, pass 0: per side, a histogram of the top 11 bits
//      (30..20) of the keys on it; SelectDigitKernel (one block per side)
//      counts the side's entries, sets its output size min(k, entries) and,
//      when it has more than k, finds the digit of its k-th largest key.
//   2. Passes 1 and 2 of the radix select, for the sides with more than k
//      entries: a histogram of bits 19..9, then 8..0, of the keys whose
//      higher bits are those found, each followed by SelectDigitKernel.
//      After them the k-th largest key is known exactly, and how many keys
//      are above it. (No side with more than k entries: no passes 1, 2.)
//   3. TileCountKernel: per tile of 2048 elements and per side, the keys
//      above the side's k-th largest and those equal to it.
//   4. TileScanKernel (one block per side and count): every tile's
//      exclusive offsets.
//   5. WriteKernel: every selected element at its rank, in index order:
//      the elements above before it plus the equal ones before it (at most
//      as many as the selection takes).
// So three to five passes over the input, integer atomics only (the
// histograms): every run gives the same result. The host waits once, in
// TopKTwoSidedOutputSizes, for the sizes; keys are compared as integers.

#include <algorithm>
#include <cstdint>

#include "custom_ops/cc/kernels/cuda_block.h"
#include "custom_ops/cc/kernels/cuda_float.h"
#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/top_k_two_sided_common.h"
#include "custom_ops/cc/kernels/top_k_two_sided_gpu.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;
constexpr int kTile = kThreads * kItems;  // elements per tile
constexpr int kPasses = 3;                // digits of the radix select
constexpr int kMaxBins = 2048;            // of a digit
// The digit of pass p of a 31-bit key, most significant first: bits
// 30..20, 19..9, 8..0 (key >> Shift(p), Bits(p) bits), and the bits above
// it (key >> Above(p); 31: none).
__host__ __device__ constexpr int Shift(int p) {
  return p == 0 ? 20 : (p == 1 ? 9 : 0);
}
__host__ __device__ constexpr int Bits(int p) { return p == 2 ? 9 : 11; }
__host__ __device__ constexpr int Above(int p) {
  return p == 0 ? 31 : Shift(p - 1);
}
// Where pass p's histograms start (both sides', one after the other).
__host__ __device__ constexpr int HistBegin(int p) {
  return p == 0 ? 0 : HistBegin(p - 1) + (kSides << Bits(p - 1));
}
constexpr int kHistWords = HistBegin(kPasses);
static_assert(Shift(kPasses - 1) == 0 && Shift(0) + Bits(0) == 31 &&
                  (1 << Bits(0)) == kMaxBins,
              "the digits cover the 31 bits of a key");
static_assert((1 << Bits(2)) % kThreads == 0, "whole bins per thread");

// Four counts of at most kTile each, 16 bits apiece: the elements above
// and equal to the k-th largest key, on each side.
constexpr int kCountBits = 16;
static_assert(kTile < (1 << kCountBits), "a tile's counts fit 16 bits");

// One side's selection, in device memory.
struct SideState {
  int64_t entries;    // on the side (pass 0's histogram total)
  int radix;          // the side has more than k entries
  int64_t remaining;  // the rank inside the bucket found so far
  int64_t greater;    // keys above that bucket
  uint32_t prefix;    // the key bits found so far
  // The selection: every key > kth, then the first `need` keys == kth.
  uint32_t kth;
  int64_t need;
};

struct State {
  SideState side[kSides];
  int64_t sizes[kSides];  // what TopKTwoSidedOutputSizes copies
};

int64_t Align(int64_t v) { return (v + 15) / 16 * 16; }
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch layout (bytes, 16-aligned pieces): the State, the histograms
// (zeroed), then per side the tiles' counts ([kind][tiles] int32: above,
// equal) and offsets ([kind][tiles] int64).
struct Layout {
  int64_t tiles;
  int64_t hist_off, count_off, offset_off, total;
};

Layout MakeLayout(int64_t n) {
  Layout l;
  l.tiles = CeilDiv(n, kTile);
  l.hist_off = Align(sizeof(State));
  l.count_off = Align(l.hist_off + 4 * int64_t{kHistWords});
  l.offset_off = Align(l.count_off + 4 * 2 * kSides * l.tiles);
  l.total = Align(l.offset_off + 8 * 2 * kSides * l.tiles);
  return l;
}

// Grid of a grid-stride loop over `items` blocks of work.
int GridFor(int64_t items) {
  return StrideGridFor(items * kThreads, kThreads);
}

// The keys of element v on both sides.
template <typename T>
__device__ __forceinline__ void Keys(T v, uint32_t* key) {
  const uint32_t bits = __float_as_uint(ToFloat(v));
  for (int s = 0; s < kSides; ++s) key[s] = SideKey(bits, s);
}

// Pass `pass` of the radix select: each side's histogram (global, zeroed)
// += that of the digit of the keys it counts: every key on it in pass 0,
// those in the bucket found so far in the later passes of a side that
// needs them (none: the kernel returns at once). Each thread adds runs of
// equal bins at once, so that a constant input does not serialise on one
// shared-memory counter.
template <typename T>
__global__ void HistKernel(const T* x, int64_t n, int pass,
                           const State* state, uint32_t* hist) {
  __shared__ uint32_t s_hist[kSides * kMaxBins];
  bool counts[kSides] = {true, true};
  uint32_t prefix[kSides] = {0, 0};  // pass 0: key >> 31 is 0
  if (pass > 0) {  // the state exists once pass 0 is selected
    for (int s = 0; s < kSides; ++s) {
      counts[s] = state->side[s].radix != 0;
      prefix[s] = state->side[s].prefix;
    }
    if (!counts[0] && !counts[1]) return;  // the same in the whole grid
  }
  const int bins = 1 << Bits(pass);
  const uint32_t mask = static_cast<uint32_t>(bins) - 1;
  for (int b = threadIdx.x; b < kSides * bins; b += kThreads) s_hist[b] = 0;
  __syncthreads();
  int run_bin[kSides] = {-1, -1};
  uint32_t run[kSides] = {0, 0};
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    uint32_t key[kSides];
    Keys(x[i], key);
    for (int s = 0; s < kSides; ++s) {
      if (!counts[s] || key[s] == 0 || (key[s] >> Above(pass)) != prefix[s]) {
        continue;
      }
      const int bin = s * bins + static_cast<int>((key[s] >> Shift(pass)) &
                                                   mask);
      if (bin != run_bin[s]) {
        if (run[s] != 0) atomicAdd(&s_hist[run_bin[s]], run[s]);
        run_bin[s] = bin;
        run[s] = 0;
      }
      ++run[s];
    }
  }
  for (int s = 0; s < kSides; ++s) {
    if (run[s] != 0) atomicAdd(&s_hist[run_bin[s]], run[s]);
  }
  __syncthreads();
  uint32_t* h = hist + HistBegin(pass);
  for (int b = threadIdx.x; b < kSides * bins; b += kThreads) {
    if (s_hist[b] != 0) atomicAdd(&h[b], s_hist[b]);
  }
}

// One block per side (grid-stride), after HistKernel's pass `pass`. Pass
// 0 counts the side's entries, sets its size min(k, entries) and whether
// it needs the radix select (more than k entries: rank k); then, for a
// side that needs it, the digit of the bucket holding the rank (counted
// from the largest digit down), and after the last pass the selection's
// kth and need. A side that needs no radix select takes every key above
// 0, its entries.
__global__ void SelectDigitKernel(int pass, int64_t k, State* state,
                                  const uint32_t* hist) {
  __shared__ int s_digit;
  __shared__ int64_t s_above;
  const int bits = Bits(pass);
  const int bins = 1 << bits;
  for (int s = blockIdx.x; s < kSides; s += gridDim.x) {
    SideState* side = &state->side[s];
    if (pass > 0 && !side->radix) continue;  // the same in the whole block
    const int64_t rank = pass == 0 ? k : side->remaining;
    const int64_t total = FindRankBin<kThreads>(
        hist + HistBegin(pass) + s * bins, bins, rank, &s_digit, &s_above);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (pass == 0) {
        side->entries = total;
        side->radix = total > k;
        side->greater = 0;
        side->prefix = 0;
        side->kth = 0;  // every key on the side
        side->need = 0;
        state->sizes[s] = total > k ? k : total;
      }
      if (side->radix) {  // the rank's digit was found
        side->prefix = side->prefix << bits | static_cast<uint32_t>(s_digit);
        side->greater += s_above;
        side->remaining = rank - s_above;
        if (pass == kPasses - 1) {
          side->kth = side->prefix;
          side->need = k - side->greater;
        }
      }
    }
    __syncthreads();  // before the next side writes the shared digit
  }
}

// The counts of one element as the tiles add them: above and equal to
// each side's kth (of the keys on the side), 16 bits apiece.
__device__ __forceinline__ uint64_t Flags(const State& st,
                                          const uint32_t* key) {
  uint64_t f = 0;
  for (int s = 0; s < kSides; ++s) {
    const uint32_t kth = st.side[s].kth;
    const bool above = key[s] > kth;
    const bool equal = key[s] == kth && st.side[s].need > 0;
    f |= static_cast<uint64_t>(above) << (kCountBits * (2 * s));
    f |= static_cast<uint64_t>(equal) << (kCountBits * (2 * s + 1));
  }
  return f;
}

__device__ __forceinline__ int64_t Field(uint64_t packed, int j) {
  return static_cast<int64_t>((packed >> (kCountBits * j)) &
                              ((uint64_t{1} << kCountBits) - 1));
}

// Per tile and side, the keys above the side's kth and equal to it:
// counts[s][kind][tile] (kind 0 above, 1 equal), from 2 * s * tiles.
template <typename T>
__global__ void TileCountKernel(const T* x, int64_t n, int64_t tiles,
                                const State* state, int32_t* counts) {
  __shared__ uint64_t s_warp[kThreads / 32];
  const State st = *state;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    uint64_t f = 0;
    for (int j = 0; j < kItems; ++j) {  // coalesced: stride kThreads
      const int64_t i = t * kTile + j * kThreads + threadIdx.x;
      if (i < n) {
        uint32_t key[kSides];
        Keys(x[i], key);
        f += Flags(st, key);
      }
    }
    f = WarpSum(f);
    if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = f;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t sum = 0;
      for (int w = 0; w < kThreads / 32; ++w) sum += s_warp[w];
      for (int j = 0; j < 2 * kSides; ++j) {
        counts[j * tiles + t] = static_cast<int32_t>(Field(sum, j));
      }
    }
    __syncthreads();
  }
}

// One block per side and kind (grid-stride): the exclusive offsets of its
// tiles' counts. Thread j sums a run of consecutive tiles, the block scans
// the runs, and each thread writes its run's offsets.
__global__ void TileScanKernel(int64_t tiles, const int32_t* counts,
                               int64_t* offsets) {
  const int64_t per = (tiles + kThreads - 1) / kThreads;
  const int64_t first = threadIdx.x * per;
  const int64_t begin = first < tiles ? first : tiles;
  const int64_t end = begin + per < tiles ? begin + per : tiles;
  for (int j = blockIdx.x; j < 2 * kSides; j += gridDim.x) {
    const int32_t* c = counts + j * tiles;
    int64_t* o = offsets + j * tiles;
    int64_t sum = 0;
    for (int64_t t = begin; t < end; ++t) sum += c[t];
    int64_t total;
    int64_t at = BlockExclusiveScan<kThreads>(sum, &total);
    for (int64_t t = begin; t < end; ++t) {
      o[t] = at;
      at += c[t];
    }
  }
}

// Every selected element at its place in index order (tiles in a
// grid-stride loop, each tile's rows of kThreads elements in turn): on
// side s, the elements above kth before it plus the equal ones before it,
// of which at most `need` are selected.
template <typename T>
__global__ void WriteKernel(const T* x, int64_t n, int64_t tiles,
                            const State* state, const int64_t* offsets,
                            T* pos_values, int32_t* pos_indices,
                            T* neg_values, int32_t* neg_indices) {
  const State st = *state;
  T* values[kSides] = {pos_values, neg_values};
  int32_t* indices[kSides] = {pos_indices, neg_indices};
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    int64_t before[2 * kSides];  // above, equal of each side
    for (int j = 0; j < 2 * kSides; ++j) before[j] = offsets[j * tiles + t];
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = t * kTile + j * kThreads + threadIdx.x;
      uint32_t key[kSides] = {0, 0};
      T v{};
      if (i < n) {
        v = x[i];
        Keys(v, key);
      }
      const uint64_t f = i < n ? Flags(st, key) : 0;
      uint64_t row;
      const uint64_t rank = BlockExclusiveScan<kThreads>(f, &row);
      for (int s = 0; s < kSides; ++s) {
        const int64_t above = before[2 * s] + Field(rank, 2 * s);
        const int64_t equal = before[2 * s + 1] + Field(rank, 2 * s + 1);
        const int64_t need = st.side[s].need;
        int64_t at = -1;
        if (Field(f, 2 * s) != 0) {
          at = above + (equal < need ? equal : need);
        } else if (Field(f, 2 * s + 1) != 0 && equal < need) {
          at = above + equal;
        }
        if (at >= 0 && at < st.sizes[s]) {
          values[s][at] = SideValue(v, s);
          indices[s][at] = static_cast<int32_t>(i);
        }
        before[2 * s] += Field(row, 2 * s);
        before[2 * s + 1] += Field(row, 2 * s + 1);
      }
    }
  }
}

}  // namespace

int64_t TopKTwoSidedScratchBytes(int64_t n) { return MakeLayout(n).total; }

template <typename T>
int TopKTwoSidedPlan(const T* x, int64_t n, int64_t k, void* scratch,
                     void* stream) {
  if (n <= 0 || k <= 0) return 0;
  const Layout l = MakeLayout(n);
  auto* base = static_cast<char*>(scratch);
  auto* state = reinterpret_cast<State*>(base);
  auto* hist = reinterpret_cast<uint32_t*>(base + l.hist_off);
  auto* counts = reinterpret_cast<int32_t*>(base + l.count_off);
  auto* offsets = reinterpret_cast<int64_t*>(base + l.offset_off);
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err =
      cudaMemsetAsync(hist, 0, sizeof(uint32_t) * kHistWords, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int grid = StrideGridFor(n, kThreads);
  const State* cstate = state;
  for (int p = 0; p < kPasses; ++p) {
    // Passes 1 and 2 return at once when no side needs them, which only
    // the device knows.
    LaunchKernel(HistKernel<T>, grid, kThreads, 0, s, x, n, p, cstate, hist);
    LaunchKernel(SelectDigitKernel, GridFor(kSides), kThreads, 0, s, p, k,
                 state, static_cast<const uint32_t*>(hist));
  }
  LaunchKernel(TileCountKernel<T>, GridFor(l.tiles), kThreads, 0, s, x, n,
               l.tiles, cstate, counts);
  LaunchKernel(TileScanKernel, GridFor(2 * kSides), kThreads, 0, s, l.tiles,
               static_cast<const int32_t*>(counts), offsets);
  return static_cast<int>(cudaGetLastError());
}

int TopKTwoSidedOutputSizes(int64_t n, int64_t k, const void* scratch,
                            void* stream, int64_t* sizes) {
  sizes[kPositiveSide] = sizes[kNegativeSide] = 0;
  if (n <= 0 || k <= 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* state = static_cast<const State*>(scratch);
  cudaError_t err = cudaMemcpyAsync(sizes, state->sizes,
                                    sizeof(int64_t) * kSides,
                                    cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return static_cast<int>(err);
}

template <typename T>
int TopKTwoSidedWrite(const T* x, int64_t n, const int64_t* sizes,
                      T* pos_values, int32_t* pos_indices, T* neg_values,
                      int32_t* neg_indices, void* scratch, void* stream) {
  if (n <= 0 || sizes[kPositiveSide] + sizes[kNegativeSide] == 0) return 0;
  const Layout l = MakeLayout(n);
  auto* base = static_cast<char*>(scratch);
  LaunchKernel(WriteKernel<T>, GridFor(l.tiles), kThreads, 0,
               static_cast<cudaStream_t>(stream), x, n, l.tiles,
               reinterpret_cast<const State*>(base),
               reinterpret_cast<const int64_t*>(base + l.offset_off),
               pos_values, pos_indices, neg_values, neg_indices);
  return static_cast<int>(cudaGetLastError());
}

// The launchers of top_k_two_sided_gpu.h for each element type.
#define TFGC_INSTANTIATE_TOP_K_TWO_SIDED(T)                                  \
  template int TopKTwoSidedPlan(const T*, int64_t, int64_t, void*, void*);   \
  template int TopKTwoSidedWrite(const T*, int64_t, const int64_t*, T*,      \
                                 int32_t*, T*, int32_t*, void*, void*);

TFGC_INSTANTIATE_TOP_K_TWO_SIDED(float)
TFGC_INSTANTIATE_TOP_K_TWO_SIDED(__half)
TFGC_INSTANTIATE_TOP_K_TWO_SIDED(__nv_bfloat16)

#undef TFGC_INSTANTIATE_TOP_K_TWO_SIDED

}  // namespace gpu
}  // namespace tfgc
