// Copyright 2026 The tfgc Authors.
//
// CUDA kernels of TopKSample. This file includes no TensorFlow header: the
// TF glue (top_k_sample_kernels.cc, GOOGLE_CUDA) and the standalone harness
// (custom_ops/cuda_harness/) both link it as is.
//
// The whole selection runs on the stream it is given, with no host
// synchronisation in mstopk and trimmed modes and one in threshold mode,
// whose output size depends on the data (TopKSampleOutputSize). Every
// intermediate result stays in the scratch buffer. Selections rest on
// order statistics (the header says why): trimmed top-k (and the threshold
// search's exact fallback) on the k-th largest key, the bisections of
// mstopk and threshold, which BisectByOrder runs on the device, on the
// (k+1)-th and 2k-th largest keys. Kernels, in stream order:
//   1. HistKernel, pass 0: the statistics (sum, max and count of the finite
//      keys, per block; not for trimmed top-k) and a histogram of the top
//      11 bits (30..20) of every key; SelectDigitKernel (one block) finds
//      the digit of every wanted rank (up to three: k, k + 1, 2k).
//   2. Passes 1 and 2 of the radix select: a histogram of bits 19..9, then
//      8..0, of the keys whose higher bits are those found for a rank
//      (ranks sharing a prefix share a histogram), each followed by
//      SelectDigitKernel. After them every rank's key is known exactly, and
//      how many keys are above it.
//   3. PlanKernel (one thread): the mean and max from the per-block
//      partials in block order (deterministic), BisectByOrder, and the
//      SelectionPlan's thresholds (MsTopKPlan, ThresholdPlan or ExactPlan).
//   4. TileCountKernel: per tile of 2048 elements, the number of keys above
//      the plan's thresholds and in its band (for mstopk and threshold
//      these are the counts at the bisection's final hi and lo thresholds),
//      and integer-atomic totals per chunk of 256 tiles.
//   5. FinalizeKernel (one block): scans the chunk totals and completes the
//      plan from the totals, in device memory.
//   6. TileScanKernel: every tile's offsets (chunk offset plus a block scan
//      inside the chunk).
//   7. WriteKernel: every selected element at its rank, in index order.
// So five passes over the input (1, two in 2, 4 and 7) and no floating-point
// atomics: every result is the same on every run. Keys are compared as
// integers (the header says why), so that neither -ftz=true device code nor
// a host thread that flushes denormals changes a result. Grid sizes come
// from the device's multiprocessor count and maximum grid size.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;
constexpr int kTile = kThreads * kItems;  // elements per tile of the write
constexpr int kChunk = kThreads;          // tiles per chunk of the scan
constexpr int kRanks = 3;                 // order statistics at most
constexpr int kPasses = 3;                // digits of the radix select
constexpr int kMaxBins = 2048;            // of a digit

// The radix select's digits of a (31-bit) key, most significant first:
// bits 30..20, 19..9 and 8..0.
__host__ __device__ constexpr int DigitShift(int pass) {
  return pass == 0 ? 20 : (pass == 1 ? 9 : 0);
}
__host__ __device__ constexpr int DigitBits(int pass) {
  return pass == 2 ? 9 : 11;
}
// The key bits above pass `pass`'s digit are key >> PrefixShift(pass).
__host__ __device__ constexpr int PrefixShift(int pass) {
  return pass == 0 ? 31 : DigitShift(pass - 1);
}

static_assert((1 << DigitBits(0)) == kMaxBins, "bins of the first pass");
static_assert(DigitShift(kPasses - 1) == 0 &&
                  DigitShift(0) + DigitBits(0) == 31,
              "the digits cover the 31 bits of a key");
static_assert((1 << DigitBits(2)) % kThreads == 0, "whole bins per thread");

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The key of an element (float16 and bfloat16 widen to float32 exactly).
template <typename T>
__device__ __forceinline__ uint32_t Key(T v) {
  return KeyOf(ToFloat(v));
}

// The ranks (1 <= r <= n) whose keys the mode reads, and where they are.
struct Ranks {
  int64_t r[kRanks];
  int count;
  int k, k1, k2;  // the index of rank k, k + 1 and 2k in r; -1 if unused
};

// The radix select's progress, in device memory.
struct RadixState {
  int64_t remaining[kRanks];  // the rank inside the bucket found so far
  int64_t greater[kRanks];    // keys above that bucket
  uint32_t prefix[kRanks];    // the bucket: the key bits found so far
  int slot[kRanks];           // the histogram counting the rank's bucket
  uint32_t slot_prefix[kRanks];
  int slots;
};

// How FinalizeKernel completes the plan from the counts.
enum PlanKind : int { kMsTopKKind = 0, kThresholdKind = 1, kExactKind = 2 };

// Everything the plan needs after the passes, in device memory.
struct DeviceState {
  RadixState radix;
  BisectionEnd end;
  int kind;
  SelectionPlan plan;
};

struct PlanArgs {
  TopKSampleMode mode;
  int rounds;
  int64_t n, k, seed;
  int stats_blocks;
};

int64_t Align(int64_t v) { return (v + 15) / 16 * 16; }
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch layout (bytes, 16-aligned pieces): the DeviceState first, then
// the rest. Histograms and chunk totals are one zeroed region.
struct Layout {
  int64_t stats_blocks, tiles, chunks;
  int64_t sum_off, max_off, fin_off;
  int64_t hist_off[kPasses];
  int64_t chunk_total_off, zero_bytes;
  int64_t chunk_off_off, count_off, tile_off_off, total;
};

Layout MakeLayout(int64_t n) {
  Layout l;
  l.stats_blocks = StrideGridFor(n, kThreads);
  l.tiles = std::max<int64_t>(1, CeilDiv(n, kTile));
  l.chunks = CeilDiv(l.tiles, kChunk);
  l.sum_off = Align(sizeof(DeviceState));
  l.max_off = Align(l.sum_off + 8 * l.stats_blocks);
  l.fin_off = Align(l.max_off + 4 * l.stats_blocks);
  int64_t off = Align(l.fin_off + 8 * l.stats_blocks);
  const int64_t zero_begin = off;
  for (int p = 0; p < kPasses; ++p) {
    l.hist_off[p] = off;
    off = Align(off + (int64_t{4 * (p == 0 ? 1 : kRanks)} << DigitBits(p)));
  }
  l.chunk_total_off = off;  // [chunks][2] uint64: above, band
  off = Align(off + 16 * l.chunks);
  l.zero_bytes = off - zero_begin;
  l.chunk_off_off = off;  // [chunks][2] int64
  l.count_off = Align(off + 16 * l.chunks);  // [2][tiles] int32
  l.tile_off_off = Align(l.count_off + 8 * l.tiles);  // [2][tiles] int64
  l.total = Align(l.tile_off_off + 16 * l.tiles);
  return l;
}

// Grid of a grid-stride loop over `items` blocks of work.
int GridFor(int64_t items) {
  return StrideGridFor(items * kThreads, kThreads);
}

template <typename V>
__device__ __forceinline__ V WarpSum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  }
  return v;
}

// Exclusive scan of one value per thread of the block; *total gets the
// block's sum. Every thread must call it (it has barriers).
template <typename V>
__device__ __forceinline__ V BlockExclusiveScan(V v, V* total) {
  __shared__ V s_warp[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  V incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const V y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  V warp_base = 0, sum = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) warp_base += s_warp[w];
    sum += s_warp[w];
  }
  __syncthreads();
  *total = sum;
  return warp_base + incl - v;
}

template <typename T>
__global__ void AddKernel(const T* g, const T* r, T* acc, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    acc[i] = FromFloat<T>(ToFloat(g[i]) + ToFloat(r[i]));
  }
}

// One pass of the radix select: `hist` (global, zeroed) += the histogram of
// the digit of pass `pass` over the keys in the buckets of `state` (pass 0:
// every key; no histogram when `hist` is null). With kStats, also this
// block's partial statistics (sum, max and count of the finite keys, a
// subnormal one as 0) at sums/maxs/finites[blockIdx.x]. Each thread adds
// runs of equal bins at once, so that mostly-zero or constant inputs do not
// serialise on one shared-memory counter.
template <typename T, bool kStats>
__global__ void HistKernel(const T* x, int64_t n, int pass,
                           const RadixState* state, uint32_t* hist,
                           double* sums, float* maxs,
                           unsigned long long* finites) {
  __shared__ uint32_t s_hist[kRanks * kMaxBins];
  const int bits = DigitBits(pass), shift = DigitShift(pass);
  const int prefix_shift = PrefixShift(pass);
  const uint32_t digit_mask = (1u << bits) - 1;
  int slots = hist == nullptr ? 0 : 1;
  uint32_t slot_prefix[kRanks] = {0, 0, 0};  // pass 0: key >> 31 is 0
  if (pass > 0 && hist != nullptr) {
    slots = state->slots;
    for (int s = 0; s < kRanks; ++s) slot_prefix[s] = state->slot_prefix[s];
  }
  const int used = slots << bits;
  for (int b = threadIdx.x; b < used; b += kThreads) s_hist[b] = 0;
  __syncthreads();
  double sum = 0.0;
  float mx = 0.0f;
  unsigned long long fin = 0;
  int run_bin = -1;
  uint32_t run = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t key = Key(x[i]);
    if (kStats && key < kInfKey) {  // finite; a subnormal key counts as 0
      const float a = key < kMinNormalKey ? 0.0f : __uint_as_float(key);
      sum += a;
      mx = fmaxf(mx, a);
      ++fin;
    }
    // Slots have distinct prefixes: at most one matches.
    const uint32_t high = key >> prefix_shift;
    int bin = -1;
    for (int s = 0; s < kRanks; ++s) {
      if (s < slots && high == slot_prefix[s]) {
        bin = (s << bits) | static_cast<int>((key >> shift) & digit_mask);
      }
    }
    if (bin != run_bin) {
      if (run != 0) atomicAdd(&s_hist[run_bin], run);
      run_bin = bin;
      run = 0;
    }
    run += bin >= 0;
  }
  if (run != 0) atomicAdd(&s_hist[run_bin], run);
  __syncthreads();
  for (int b = threadIdx.x; b < used; b += kThreads) {
    if (s_hist[b] != 0) atomicAdd(&hist[b], s_hist[b]);
  }
  if (!kStats) return;
  __shared__ double s_sum[kThreads / 32];
  __shared__ float s_max[kThreads / 32];
  __shared__ unsigned long long s_fin[kThreads / 32];
  sum = WarpSum(sum);
  mx = WarpMax(mx);
  fin = WarpSum(fin);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_sum[warp] = sum;
    s_max[warp] = mx;
    s_fin[warp] = fin;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double ts = 0.0;
    float tm = 0.0f;
    unsigned long long tf = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      ts += s_sum[w];
      tm = fmaxf(tm, s_max[w]);
      tf += s_fin[w];
    }
    sums[blockIdx.x] = ts;
    maxs[blockIdx.x] = tm;
    finites[blockIdx.x] = tf;
  }
}

// One block, after HistKernel's pass `pass`: for every rank, the digit of
// its key (the bucket, counted from the largest digit down, holding the
// rank), then the histogram slots of the next pass (one per distinct
// prefix). Pass 0 starts the state from `ranks`.
__global__ void SelectDigitKernel(int pass, Ranks ranks, RadixState* state,
                                  const uint32_t* hist) {
  __shared__ int s_digit;
  __shared__ int64_t s_above;
  const int bits = DigitBits(pass);
  const int bins = 1 << bits;
  const int per = bins / kThreads;
  // Thread t holds the digits top, top - 1, ..., top - per + 1.
  const int top = bins - 1 - static_cast<int>(threadIdx.x) * per;
  for (int j = 0; j < ranks.count; ++j) {
    const int64_t rem = pass == 0 ? ranks.r[j] : state->remaining[j];
    const uint32_t* h = hist + ((pass == 0 ? 0 : state->slot[j]) << bits);
    if (threadIdx.x == 0) {
      s_digit = 0;
      s_above = 0;
    }
    int64_t local = 0;
    for (int i = 0; i < per; ++i) local += h[top - i];
    int64_t total;
    int64_t before = BlockExclusiveScan(local, &total);  // higher digits
    for (int i = 0; i < per; ++i) {
      const int64_t c = h[top - i];
      if (before < rem && rem <= before + c) {
        s_digit = top - i;
        s_above = before;
      }
      before += c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint32_t prefix = pass == 0 ? 0u : state->prefix[j];
      const int64_t greater = pass == 0 ? 0 : state->greater[j];
      state->prefix[j] = prefix << bits | static_cast<uint32_t>(s_digit);
      state->greater[j] = greater + s_above;
      state->remaining[j] = rem - s_above;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int slots = 0;
    for (int j = 0; j < ranks.count; ++j) {
      int s = -1;
      for (int t = 0; t < slots; ++t) {
        if (state->slot_prefix[t] == state->prefix[j]) s = t;
      }
      if (s < 0) {
        s = slots++;
        state->slot_prefix[s] = state->prefix[j];
      }
      state->slot[j] = s;
    }
    state->slots = slots;
  }
}

// The key of rank index j after the last pass (kNoRank when unused).
__device__ __forceinline__ int64_t RankKey(const RadixState& r, int j) {
  return j < 0 ? kNoRank : static_cast<int64_t>(r.prefix[j]);
}

// One thread: the statistics from the per-block partials in block order,
// the bisection, and the plan's thresholds (its counts come later).
__global__ void PlanKernel(PlanArgs a, Ranks ranks, const double* sums,
                           const float* maxs,
                           const unsigned long long* finites,
                           DeviceState* st) {
  const RadixState& r = st->radix;
  int kind = kExactKind;
  SelectionPlan plan;
  if (a.mode != TopKSampleMode::kTrimmed) {
    double sum = 0.0;
    float mx = 0.0f;
    unsigned long long fin = 0;
    for (int b = 0; b < a.stats_blocks; ++b) {
      sum += sums[b];
      mx = fmaxf(mx, maxs[b]);
      fin += finites[b];
    }
    const float mean = Mean(sum, static_cast<int64_t>(fin));
    const BisectionEnd e =
        BisectByOrder(a.mode, mean, Diff(mx, mean), a.rounds,
                      RankKey(r, ranks.k1), RankKey(r, ranks.k2));
    st->end = e;
    if (a.mode == TopKSampleMode::kMsTopK) {
      kind = kMsTopKKind;
      plan = MsTopKPlan(e, 0, 0, a.n, a.k, a.seed);  // thresholds only
    } else if (e.has_lo) {
      kind = kThresholdKind;
      plan = ThresholdPlan(e, 0);
    }
  }
  if (kind == kExactKind) {
    plan = ExactPlan(r.prefix[ranks.k], r.greater[ranks.k], a.k);
  }
  st->kind = kind;
  st->plan = plan;
}

// 0: not selected; 1: in the plan's above set; 2: in its band.
__device__ __forceinline__ int Classify(const SelectionPlan& p, uint32_t a) {
  if (IsAbove(p, a)) return 1;
  if (!p.has_band_lo || a >= p.band_lo) return 2;
  return 0;
}

// Per tile, the keys above the plan's thresholds and in its band; their
// totals per chunk of kChunk tiles (integer atomics, so deterministic).
template <typename T>
__global__ void TileCountKernel(const T* x, int64_t n, int64_t tiles,
                                const DeviceState* st, int32_t* counts,
                                unsigned long long* chunk_totals) {
  __shared__ int s_a[kThreads / 32], s_b[kThreads / 32];
  const SelectionPlan p = st->plan;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int ca = 0, cb = 0;
    const int64_t base = tile * kTile;
    for (int j = 0; j < kItems; ++j) {  // coalesced: stride kThreads
      const int64_t i = base + j * kThreads + threadIdx.x;
      if (i < n) {
        const int c = Classify(p, Key(x[i]));
        ca += c == 1;
        cb += c == 2;
      }
    }
    ca = WarpSum(ca);
    cb = WarpSum(cb);
    if (threadIdx.x % 32 == 0) {
      s_a[threadIdx.x / 32] = ca;
      s_b[threadIdx.x / 32] = cb;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int ta = 0, tb = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        ta += s_a[w];
        tb += s_b[w];
      }
      counts[tile] = ta;
      counts[tiles + tile] = tb;
      unsigned long long* chunk = chunk_totals + 2 * (tile / kChunk);
      if (ta != 0) atomicAdd(&chunk[0], static_cast<unsigned long long>(ta));
      if (tb != 0) atomicAdd(&chunk[1], static_cast<unsigned long long>(tb));
    }
    __syncthreads();
  }
}

// One block: exclusive offsets of the chunks, then the plan completed from
// the totals (the counts above the thresholds and in the band).
__global__ void FinalizeKernel(PlanArgs a, int64_t chunks,
                               const unsigned long long* chunk_totals,
                               int64_t* chunk_offsets, DeviceState* st) {
  int64_t carry_a = 0, carry_b = 0;
  for (int64_t first = 0; first < chunks; first += kThreads) {
    const int64_t c = first + threadIdx.x;
    const int64_t va =
        c < chunks ? static_cast<int64_t>(chunk_totals[2 * c]) : 0;
    const int64_t vb =
        c < chunks ? static_cast<int64_t>(chunk_totals[2 * c + 1]) : 0;
    int64_t ta, tb;
    const int64_t ea = BlockExclusiveScan(va, &ta);
    const int64_t eb = BlockExclusiveScan(vb, &tb);
    if (c < chunks) {
      chunk_offsets[2 * c] = carry_a + ea;
      chunk_offsets[2 * c + 1] = carry_b + eb;
    }
    carry_a += ta;
    carry_b += tb;
  }
  if (threadIdx.x == 0) {
    const int64_t above = carry_a, band = carry_b;
    if (st->kind == kMsTopKKind) {
      st->plan = MsTopKPlan(st->end, above, above + band, a.n, a.k, a.seed);
    } else if (st->kind == kThresholdKind) {
      st->plan = ThresholdPlan(st->end, above);
    }  // an ExactPlan is complete (`above` equals its above_count)
  }
}

// Every tile's exclusive offsets: its chunk's plus a block scan of the
// chunk's tiles, one per thread.
__global__ void TileScanKernel(int64_t tiles, int64_t chunks,
                               const int32_t* counts,
                               const int64_t* chunk_offsets,
                               int64_t* tile_offsets) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t t = c * kChunk + threadIdx.x;
    const int64_t a = t < tiles ? counts[t] : 0;
    const int64_t b = t < tiles ? counts[tiles + t] : 0;
    int64_t ta, tb;
    const int64_t ea = BlockExclusiveScan(a, &ta);
    const int64_t eb = BlockExclusiveScan(b, &tb);
    if (t < tiles) {
      tile_offsets[t] = chunk_offsets[2 * c] + ea;
      tile_offsets[tiles + t] = chunk_offsets[2 * c + 1] + eb;
    }
  }
}

// Writes every selected element of each tile at its output rank (below
// `size`, the plan's output size). Items are visited in index order: item j
// of the tile's row-major [kItems, kThreads] layout is element
// base + j * kThreads + thread, and ranks are scanned per row, so the output
// stays in index order.
template <typename T>
__global__ void WriteKernel(const T* x, int64_t n, int64_t tiles,
                            const DeviceState* st,
                            const int64_t* tile_offsets, int64_t size,
                            T* values, int32_t* indices, T* zero) {
  const SelectionPlan p = st->plan;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int64_t above_before = tile_offsets[tile];
    int64_t band_before = tile_offsets[tiles + tile];
    const int64_t base = tile * kTile;
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = base + j * kThreads + threadIdx.x;
      int c = 0;
      T v{};
      if (i < n) {
        v = x[i];
        c = Classify(p, Key(v));
      }
      int total_a, total_b;
      const int ea = BlockExclusiveScan(static_cast<int>(c == 1), &total_a);
      const int eb = BlockExclusiveScan(static_cast<int>(c == 2), &total_b);
      if (c != 0) {
        const int64_t a_rank = above_before + ea;
        const int64_t b_rank = band_before + eb;
        int64_t pos = -1;
        if (c == 1) {  // after the band elements taken before it
          const int64_t sel = b_rank < p.start
                                  ? 0
                                  : (b_rank - p.start < p.need
                                         ? b_rank - p.start
                                         : p.need);
          pos = a_rank + sel;
        } else if (b_rank >= p.start && b_rank < p.start + p.need) {
          pos = a_rank + (b_rank - p.start);
        }
        if (pos >= 0 && pos < size) {
          values[pos] = v;
          indices[pos] = static_cast<int32_t>(i);
          if (zero != nullptr) zero[i] = FromFloat<T>(0.0f);
        }
      }
      above_before += total_a;
      band_before += total_b;
    }
  }
}

// Runs `body` with the element type of `dtype`.
template <typename F>
int Dispatch(DType dtype, F&& body) {
  switch (dtype) {
    case DType::kFloat:
      return body(static_cast<float*>(nullptr));
    case DType::kHalf:
      return body(static_cast<__half*>(nullptr));
    case DType::kBfloat16:
      return body(static_cast<__nv_bfloat16*>(nullptr));
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

// The ranks `mode` reads (those <= n): trimmed top-k the k-th largest key;
// mstopk the (k+1)-th; the threshold search the (k+1)-th, the 2k-th and,
// for its exact fallback, the k-th.
Ranks WantedRanks(TopKSampleMode mode, int64_t n, int64_t k) {
  Ranks ranks{};
  ranks.k = ranks.k1 = ranks.k2 = -1;
  auto want = [&](int64_t r, int* index) {
    if (r > n) return;
    *index = ranks.count;
    ranks.r[ranks.count++] = r;
  };
  if (mode != TopKSampleMode::kTrimmed) want(k + 1, &ranks.k1);
  if (mode == TopKSampleMode::kThreshold) want(2 * k, &ranks.k2);
  if (mode != TopKSampleMode::kMsTopK) want(k, &ranks.k);
  return ranks;
}

template <typename T>
int PlanTyped(const T* x, int64_t n, int64_t k, TopKSampleMode mode,
              int rounds, int64_t seed, char* scratch, cudaStream_t s) {
  const Layout l = MakeLayout(n);
  auto* st = reinterpret_cast<DeviceState*>(scratch);
  auto* sums = reinterpret_cast<double*>(scratch + l.sum_off);
  auto* maxs = reinterpret_cast<float*>(scratch + l.max_off);
  auto* fins = reinterpret_cast<unsigned long long*>(scratch + l.fin_off);
  uint32_t* hist[kPasses];
  for (int p = 0; p < kPasses; ++p) {
    hist[p] = reinterpret_cast<uint32_t*>(scratch + l.hist_off[p]);
  }
  auto* chunk_totals =
      reinterpret_cast<unsigned long long*>(scratch + l.chunk_total_off);
  auto* chunk_offsets = reinterpret_cast<int64_t*>(scratch + l.chunk_off_off);
  auto* counts = reinterpret_cast<int32_t*>(scratch + l.count_off);
  auto* tile_offsets = reinterpret_cast<int64_t*>(scratch + l.tile_off_off);
  const Ranks ranks = WantedRanks(mode, n, k);
  const PlanArgs args{mode, rounds, n, k, seed,
                      static_cast<int>(l.stats_blocks)};

  cudaError_t err =
      cudaMemsetAsync(scratch + l.hist_off[0], 0, l.zero_bytes, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int grid = static_cast<int>(l.stats_blocks);
  RadixState* radix = &st->radix;
  uint32_t* hist0 = ranks.count > 0 ? hist[0] : nullptr;
  if (mode == TopKSampleMode::kTrimmed) {
    LaunchKernel(HistKernel<T, false>, grid, kThreads, 0, s, x, n, 0, radix,
                 hist0, nullptr, nullptr, nullptr);
  } else {
    LaunchKernel(HistKernel<T, true>, grid, kThreads, 0, s, x, n, 0, radix,
                 hist0, sums, maxs, fins);
  }
  if (ranks.count > 0) {
    for (int p = 0; p < kPasses; ++p) {
      if (p > 0) {
        LaunchKernel(HistKernel<T, false>, grid, kThreads, 0, s, x, n, p,
                     radix, hist[p], nullptr, nullptr, nullptr);
      }
      LaunchKernel(SelectDigitKernel, 1, kThreads, 0, s, p, ranks, radix,
                   hist[p]);
    }
  }
  LaunchKernel(PlanKernel, 1, 1, 0, s, args, ranks, sums, maxs, fins, st);
  LaunchKernel(TileCountKernel<T>, GridFor(l.tiles), kThreads, 0, s, x, n,
               l.tiles, st, counts, chunk_totals);
  LaunchKernel(FinalizeKernel, 1, kThreads, 0, s, args, l.chunks,
               chunk_totals, chunk_offsets, st);
  LaunchKernel(TileScanKernel, GridFor(l.chunks), kThreads, 0, s, l.tiles,
               l.chunks, counts, chunk_offsets, tile_offsets);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int WriteTyped(const T* x, int64_t n, int64_t size, T* values,
               int32_t* indices, T* zero, char* scratch, cudaStream_t s) {
  if (n == 0 || size == 0) return 0;
  const Layout l = MakeLayout(n);
  LaunchKernel(WriteKernel<T>, GridFor(l.tiles), kThreads, 0, s, x, n,
               l.tiles, reinterpret_cast<const DeviceState*>(scratch),
               reinterpret_cast<const int64_t*>(scratch + l.tile_off_off),
               size, values, indices, zero);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int64_t TopKSampleScratchBytes(int64_t n) { return MakeLayout(n).total; }

int AddResidual(DType dtype, const void* gradient, const void* residual,
                void* acc, int64_t n, void* stream) {
  if (n == 0) return 0;
  const int grid = StrideGridFor(n, kThreads);
  auto s = static_cast<cudaStream_t>(stream);
  return Dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LaunchKernel(AddKernel<T>, grid, kThreads, 0, s,
                 static_cast<const T*>(gradient),
                 static_cast<const T*>(residual), static_cast<T*>(acc), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int TopKSamplePlan(DType dtype, const void* x, int64_t n, int64_t k,
                   TopKSampleMode mode, int rounds, int64_t seed,
                   void* scratch, void* stream) {
  if (k <= 0 || n <= 0) return 0;
  return Dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return PlanTyped<T>(static_cast<const T*>(x), n, k, mode, rounds, seed,
                        static_cast<char*>(scratch),
                        static_cast<cudaStream_t>(stream));
  });
}

int TopKSampleOutputSize(TopKSampleMode mode, int64_t n, int64_t k,
                         const void* scratch, void* stream, int64_t* size) {
  *size = n > 0 ? k : 0;
  if (mode != TopKSampleMode::kThreshold || *size == 0) return 0;
  const auto* st = static_cast<const DeviceState*>(scratch);
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err =
      cudaMemcpyAsync(size, &st->plan.output_size, sizeof(*size),
                      cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return static_cast<int>(err);
}

int TopKSampleWrite(DType dtype, const void* x, int64_t n,
                    int64_t output_size, void* values, int32_t* indices,
                    void* zero_selected, void* scratch, void* stream) {
  return Dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return WriteTyped<T>(static_cast<const T*>(x), n, output_size,
                         static_cast<T*>(values), indices,
                         static_cast<T*>(zero_selected),
                         static_cast<char*>(scratch),
                         static_cast<cudaStream_t>(stream));
  });
}

}  // namespace gpu
}  // namespace tfgc
