// Copyright 2026 The tfgc Authors.
//
// CUDA kernels of TopKSample and their typed launchers (top_k_sample_gpu.h),
// instantiated for float, __half and __nv_bfloat16. This file includes no
// TensorFlow header: the GPU functors (top_k_sample_kernels.cc, GOOGLE_CUDA)
// and the CUDA harness (custom_ops/cuda_harness/) both link it as is.
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
//   3. PlanKernel (a block per segment): the mean and max from the
//      per-block partials (a fixed reduction tree: deterministic), then on
//      one thread BisectByOrder and the SelectionPlan's thresholds
//      (MsTopKPlan, ThresholdPlan or ExactPlan).
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
//
// Segments: every kernel runs over a table of segments of one
// fused input, each with its own n, k and seed (mode and rounds shared),
// in the same launches; the single-tensor launchers are the case of one
// segment, passed by value instead of in a table. The stride kernels walk
// (segment, item) pairs numbered across the segments: HistKernel a
// segment's blocks (as many as a single-tensor launch of its n has, each
// reading the same elements, so the statistics are summed in the same
// order), TileCountKernel and WriteKernel its tiles, TileScanKernel its
// chunks; the one-block kernels (SelectDigitKernel, PlanKernel,
// FinalizeKernel) run once per segment. Histograms, states, plans,
// statistics, counts and offsets have a place per segment in the one
// scratch buffer (Layout). Outputs follow in segment order: k entries per
// segment in mstopk and trimmed modes, placed from the host's table; in
// threshold mode OutputOffsetsKernel (one block, after FinalizeKernel)
// scans the sizes on the device, and TopKSampleSegmentsOutputSizes copies
// all of them to the host at once. A segment with n = 0 or k = 0 has no
// blocks, tiles or ranks and selects nothing, as the single launchers.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "custom_ops/cc/kernels/cuda_block.h"
#include "custom_ops/cc/kernels/cuda_float.h"
#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/top_k_sample_common.h"
#include "custom_ops/cc/kernels/top_k_sample_gpu.h"

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

// Everything the plan needs after the passes, in device memory (one per
// segment).
struct DeviceState {
  RadixState radix;
  BisectionEnd end;
  int kind;
  SelectionPlan plan;
};

// What every segment shares.
struct PlanArgs {
  TopKSampleMode mode;
  int rounds;
};

// One segment of the (fused) input as the kernels see it. The work items
// of the stride kernels (HistKernel's blocks, tiles, chunks of tiles) are
// numbered across the segments, each segment's from its *_begin; an
// inactive segment (n = 0 or k = 0) has none and no ranks.
struct Segment {
  int64_t offset;  // its first element in x (and in zero_selected)
  int64_t n, k, seed;
  Ranks ranks;
  // HistKernel's blocks: the grid of a single-tensor launch for n, so that
  // the per-block statistics and their sum are those of that launch.
  int64_t block_begin, blocks;
  int64_t tile_begin, tiles;    // tiles of kTile elements
  int64_t chunk_begin, chunks;  // chunks of kChunk tiles
  int64_t out_begin;  // its first output entry (threshold mode: set on
                      // the device by OutputOffsetsKernel)
};

__host__ __device__ __forceinline__ bool Active(const Segment& g) {
  return g.n > 0 && g.k > 0;
}

// The segments of a launch, passed by value to every kernel: a table in
// the scratch (the segmented launchers), or the one segment itself (the
// single-tensor launchers, which so copy nothing to the device).
struct Segments {
  Segment* table;  // device memory; null: the single segment `one`
  Segment one;
  int count;
  int64_t blocks, tiles, chunks;  // totals of the numberings

  __device__ __forceinline__ Segment At(int s) const {
    return table == nullptr ? one : table[s];
  }
  // The segment holding item `v` of the numbering whose starts are
  // `kBegin`: the last segment starting at or before `v` (one without
  // items starts where the next one does, so it is never the last).
  template <int64_t Segment::*kBegin>
  __device__ __forceinline__ int Find(int64_t v) const {
    if (table == nullptr) return 0;
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table[mid].*kBegin <= v) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
};

// 32-bit words of one segment's histograms of pass `pass` (one per slot).
__host__ __device__ constexpr int HistWords(int pass) {
  return (pass == 0 ? 1 : kRanks) << DigitBits(pass);
}

int64_t Align(int64_t v) { return (v + 15) / 16 * 16; }
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The kernels' segments, on the host, with the totals of their numberings.
struct HostSegments {
  std::vector<Segment> segs;
  int64_t blocks = 0, tiles = 0, chunks = 0;
  bool any_ranks = false;  // a radix select to run (SetRanks)
};

// Scratch layout (bytes, 16-aligned pieces): the DeviceStates first (so a
// single-tensor launch's is at the start), then, in a segmented launch, the
// segment table and the output sizes; then the rest, per segment at its
// block, tile or chunk numbers. Histograms (HistWords(p) words per segment
// and pass) and chunk totals are one zeroed region.
struct Layout {
  int64_t table_off = -1, size_off = -1;  // segmented launches only
  int64_t sum_off, max_off, fin_off;
  int64_t hist_off[kPasses];
  int64_t chunk_total_off, zero_bytes;
  int64_t chunk_off_off, count_off, tile_off_off, total;
};

Layout MakeLayout(const HostSegments& h, bool segmented) {
  const int64_t count = static_cast<int64_t>(h.segs.size());
  Layout l;
  int64_t off = Align(static_cast<int64_t>(sizeof(DeviceState)) * count);
  if (segmented) {
    l.table_off = off;
    off = Align(off + static_cast<int64_t>(sizeof(Segment)) * count);
    l.size_off = off;
    off = Align(off + 8 * count);
  }
  l.sum_off = off;
  l.max_off = Align(l.sum_off + 8 * h.blocks);
  l.fin_off = Align(l.max_off + 4 * h.blocks);
  off = Align(l.fin_off + 8 * h.blocks);
  const int64_t zero_begin = off;
  for (int p = 0; p < kPasses; ++p) {
    l.hist_off[p] = off;
    off = Align(off + int64_t{4} * HistWords(p) * count);
  }
  l.chunk_total_off = off;  // [chunks][2] uint64: above, band
  off = Align(off + 16 * h.chunks);
  l.zero_bytes = off - zero_begin;
  l.chunk_off_off = off;  // [chunks][2] int64
  l.count_off = Align(off + 16 * h.chunks);  // per segment [2][tiles] int32
  l.tile_off_off = Align(l.count_off + 8 * h.tiles);  // [2][tiles] int64
  l.total = Align(l.tile_off_off + 16 * h.tiles);
  return l;
}

// Grid of a grid-stride loop over `items` blocks of work.
int GridFor(int64_t items) {
  return StrideGridFor(items * kThreads, kThreads);
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  }
  return v;
}

// acc = g + r, with the CPU kernel's bits (subnormals flushed, as there).
template <typename T>
__global__ void AddKernel(const T* g, const T* r, T* acc, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(acc + i, AddFlushed(ToFloat(g[i]), ToFloat(r[i])));
  }
}

// acc = g + r as AddKernel writes it and scores = RatioScore(acc, w, floor)
// (top_k_sample_common.h), from acc rounded to T.
template <typename T>
__global__ void RatioKernel(const T* g, const T* r, const T* w, float floor,
                            T* acc, float* scores, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    T a;
    Store(&a, AddFlushed(ToFloat(g[i]), ToFloat(r[i])));
    acc[i] = a;
    scores[i] = RatioScore(ToFloat(a), ToFloat(w[i]), floor);
  }
}

// values[j] = acc[indices[j]], then that entry of acc zeroed (the indices
// are distinct).
template <typename T>
__global__ void GatherZeroKernel(const int32_t* indices, int64_t size,
                                 T* acc, T* values) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < size;
       j += int64_t{gridDim.x} * blockDim.x) {
    const int32_t i = indices[j];
    values[j] = acc[i];
    Store(acc + i, 0.0f);
  }
}

// One pass of the radix select over every segment: each segment's
// histogram (global, zeroed) += that of the digit of pass `pass` over its
// keys in the buckets of its state (pass 0: every key). With kStats, also
// the partial statistics (sum, max and count of the finite keys, a
// subnormal one as 0) of each of the segment's blocks at
// sums/maxs/finites[block]. A real block runs the segments' blocks in a
// grid-stride loop; segment block b reads the elements a block b of a
// single-tensor launch of its n reads, in the same order. Each thread adds
// runs of equal bins at once, so that mostly-zero or constant inputs do
// not serialise on one shared-memory counter.
template <typename T, bool kStats>
__global__ void HistKernel(const T* x, Segments segs, int pass,
                           const DeviceState* states, uint32_t* hist,
                           double* sums, float* maxs,
                           unsigned long long* finites) {
  __shared__ uint32_t s_hist[kRanks * kMaxBins];
  __shared__ double s_sum[kThreads / 32];
  __shared__ float s_max[kThreads / 32];
  __shared__ unsigned long long s_fin[kThreads / 32];
  const int bits = DigitBits(pass), shift = DigitShift(pass);
  const int prefix_shift = PrefixShift(pass);
  const uint32_t digit_mask = (1u << bits) - 1;
  for (int64_t block = blockIdx.x; block < segs.blocks; block += gridDim.x) {
    const int s = segs.Find<&Segment::block_begin>(block);
    const Segment g = segs.At(s);
    int slots = g.ranks.count > 0 ? 1 : 0;
    uint32_t slot_prefix[kRanks] = {0, 0, 0};  // pass 0: key >> 31 is 0
    if (pass > 0 && slots > 0) {
      const RadixState& r = states[s].radix;
      slots = r.slots;
      for (int j = 0; j < kRanks; ++j) slot_prefix[j] = r.slot_prefix[j];
    }
    if (!kStats && slots == 0) continue;  // the same in the whole block
    const T* xs = x + g.offset;
    uint32_t* h = hist + int64_t{s} * HistWords(pass);
    const int used = slots << bits;
    for (int b = threadIdx.x; b < used; b += kThreads) s_hist[b] = 0;
    __syncthreads();
    double sum = 0.0;
    float mx = 0.0f;
    unsigned long long fin = 0;
    int run_bin = -1;
    uint32_t run = 0;
    for (int64_t i = (block - g.block_begin) * kThreads + threadIdx.x;
         i < g.n; i += g.blocks * kThreads) {
      const uint32_t key = Key(xs[i]);
      if (kStats && key < kInfKey) {  // finite; a subnormal key counts as 0
        const float a = key < kMinNormalKey ? 0.0f : __uint_as_float(key);
        sum += a;
        mx = fmaxf(mx, a);
        ++fin;
      }
      // Slots have distinct prefixes: at most one matches.
      const uint32_t high = key >> prefix_shift;
      int bin = -1;
      for (int j = 0; j < kRanks; ++j) {
        if (j < slots && high == slot_prefix[j]) {
          bin = (j << bits) | static_cast<int>((key >> shift) & digit_mask);
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
      if (s_hist[b] != 0) atomicAdd(&h[b], s_hist[b]);
    }
    if (kStats) {
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
        sums[block] = ts;
        maxs[block] = tm;
        finites[block] = tf;
      }
    }
    __syncthreads();  // before the next block reuses the shared arrays
  }
}

// One block per segment (grid-stride), after HistKernel's pass `pass`: for
// every rank of the segment, the digit of its key (the bucket, counted
// from the largest digit down, holding the rank), then the histogram slots
// of the next pass (one per distinct prefix). Pass 0 starts the state from
// the segment's ranks.
__global__ void SelectDigitKernel(int pass, Segments segs,
                                  DeviceState* states, const uint32_t* hist) {
  __shared__ int s_digit;
  __shared__ int64_t s_above;
  const int bits = DigitBits(pass);
  const int bins = 1 << bits;
  for (int s = blockIdx.x; s < segs.count; s += gridDim.x) {
    const Ranks ranks = segs.At(s).ranks;
    RadixState* state = &states[s].radix;
    const uint32_t* seg_hist = hist + int64_t{s} * HistWords(pass);
    for (int j = 0; j < ranks.count; ++j) {
      const int64_t rem = pass == 0 ? ranks.r[j] : state->remaining[j];
      const uint32_t* h =
          seg_hist + ((pass == 0 ? 0 : state->slot[j]) << bits);
      if (threadIdx.x == 0) {
        s_digit = 0;
        s_above = 0;
      }
      FindRankBin<kThreads>(h, bins, rem, &s_digit, &s_above);
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
    if (threadIdx.x == 0 && ranks.count > 0) {
      int slots = 0;
      for (int j = 0; j < ranks.count; ++j) {
        int slot = -1;
        for (int t = 0; t < slots; ++t) {
          if (state->slot_prefix[t] == state->prefix[j]) slot = t;
        }
        if (slot < 0) {
          slot = slots++;
          state->slot_prefix[slot] = state->prefix[j];
        }
        state->slot[j] = slot;
      }
      state->slots = slots;
    }
  }
}

// The key of rank index j after the last pass (kNoRank when unused).
__device__ __forceinline__ int64_t RankKey(const RadixState& r, int j) {
  return j < 0 ? kNoRank : static_cast<int64_t>(r.prefix[j]);
}

// One thread per active segment: the statistics from its blocks' partials
// in block order, the bisection, and the plan's thresholds (its counts
// come later).
__global__ void PlanKernel(PlanArgs a, Segments segs, const double* sums,
                           const float* maxs,
                           const unsigned long long* finites,
                           DeviceState* states) {
  __shared__ double s_sum[kThreads];
  __shared__ float s_max[kThreads];
  __shared__ unsigned long long s_fin[kThreads];
  const int tid = threadIdx.x;
  for (int s = blockIdx.x; s < segs.count; s += gridDim.x) {
    const Segment g = segs.At(s);
    if (!Active(g)) continue;  // the same for the whole block
    if (a.mode != TopKSampleMode::kTrimmed) {
      // The partials of the segment's blocks, each thread those of every
      // kThreads-th block, then a tree in a fixed order: the same sum on
      // every run.
      double sum = 0.0;
      float mx = 0.0f;
      unsigned long long fin = 0;
      for (int64_t b = g.block_begin + tid; b < g.block_begin + g.blocks;
           b += kThreads) {
        sum += sums[b];
        mx = fmaxf(mx, maxs[b]);
        fin += finites[b];
      }
      s_sum[tid] = sum;
      s_max[tid] = mx;
      s_fin[tid] = fin;
      __syncthreads();
      for (int half = kThreads / 2; half > 0; half /= 2) {
        if (tid < half) {
          s_sum[tid] += s_sum[tid + half];
          s_max[tid] = fmaxf(s_max[tid], s_max[tid + half]);
          s_fin[tid] += s_fin[tid + half];
        }
        __syncthreads();
      }
    }
    if (tid == 0) {
      DeviceState* st = &states[s];
      const RadixState& r = st->radix;
      const Ranks& ranks = g.ranks;
      int kind = kExactKind;
      SelectionPlan plan;
      if (a.mode != TopKSampleMode::kTrimmed) {
        const float mean = Mean(s_sum[0], static_cast<int64_t>(s_fin[0]));
        const BisectionEnd e =
            BisectByOrder(a.mode, mean, Diff(s_max[0], mean), a.rounds,
                          RankKey(r, ranks.k1), RankKey(r, ranks.k2));
        st->end = e;
        if (a.mode == TopKSampleMode::kMsTopK) {
          kind = kMsTopKKind;
          plan = MsTopKPlan(e, 0, 0, g.n, g.k, g.seed);  // thresholds only
        } else if (e.has_lo) {
          kind = kThresholdKind;
          plan = ThresholdPlan(e, 0);
        }
      }
      if (kind == kExactKind) {
        plan = ExactPlan(r.prefix[ranks.k], r.greater[ranks.k], g.k);
      }
      st->kind = kind;
      st->plan = plan;
    }
    __syncthreads();  // s_* are reused by the block's next segment
  }
}

// 0: not selected; 1: in the plan's above set; 2: in its band.
__device__ __forceinline__ int Classify(const SelectionPlan& p, uint32_t a) {
  if (IsAbove(p, a)) return 1;
  if (!p.has_band_lo || a >= p.band_lo) return 2;
  return 0;
}

// Tile t of the numbering across the segments: its segment, that
// segment's plan, and its index inside the segment.
struct SegmentTile {
  Segment g;
  SelectionPlan plan;
  int64_t tile;
};

__device__ __forceinline__ SegmentTile TileAt(const Segments& segs,
                                              const DeviceState* states,
                                              int64_t t) {
  const int s = segs.Find<&Segment::tile_begin>(t);
  const Segment g = segs.At(s);
  return {g, states[s].plan, t - g.tile_begin};
}

// Per tile (of every segment), the keys above its segment's plan's
// thresholds and in its band; their totals per chunk of kChunk tiles
// (integer atomics, so deterministic). A segment's counts are
// [2][its tiles] from 2 * tile_begin.
template <typename T>
__global__ void TileCountKernel(const T* x, Segments segs,
                                const DeviceState* states, int32_t* counts,
                                unsigned long long* chunk_totals) {
  __shared__ int s_a[kThreads / 32], s_b[kThreads / 32];
  for (int64_t t = blockIdx.x; t < segs.tiles; t += gridDim.x) {
    const SegmentTile st = TileAt(segs, states, t);
    const Segment& g = st.g;
    const SelectionPlan& p = st.plan;
    const T* xs = x + g.offset;
    const int64_t tile = st.tile;
    int ca = 0, cb = 0;
    const int64_t base = tile * kTile;
    for (int j = 0; j < kItems; ++j) {  // coalesced: stride kThreads
      const int64_t i = base + j * kThreads + threadIdx.x;
      if (i < g.n) {
        const int c = Classify(p, Key(xs[i]));
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
      int32_t* seg_counts = counts + 2 * g.tile_begin;
      seg_counts[tile] = ta;
      seg_counts[g.tiles + tile] = tb;
      unsigned long long* chunk =
          chunk_totals + 2 * (g.chunk_begin + tile / kChunk);
      if (ta != 0) atomicAdd(&chunk[0], static_cast<unsigned long long>(ta));
      if (tb != 0) atomicAdd(&chunk[1], static_cast<unsigned long long>(tb));
    }
    __syncthreads();
  }
}

// One block per segment (grid-stride): exclusive offsets of its chunks,
// then its plan completed from the totals (the counts above the
// thresholds and in the band).
__global__ void FinalizeKernel(Segments segs,
                               const unsigned long long* chunk_totals,
                               int64_t* chunk_offsets, DeviceState* states) {
  for (int s = blockIdx.x; s < segs.count; s += gridDim.x) {
    const Segment g = segs.At(s);
    if (!Active(g)) continue;  // the same in the whole block
    const unsigned long long* totals = chunk_totals + 2 * g.chunk_begin;
    int64_t* offsets = chunk_offsets + 2 * g.chunk_begin;
    int64_t carry_a = 0, carry_b = 0;
    for (int64_t first = 0; first < g.chunks; first += kThreads) {
      const int64_t c = first + threadIdx.x;
      const int64_t va =
          c < g.chunks ? static_cast<int64_t>(totals[2 * c]) : 0;
      const int64_t vb =
          c < g.chunks ? static_cast<int64_t>(totals[2 * c + 1]) : 0;
      int64_t ta, tb;
      const int64_t ea = BlockExclusiveScan<kThreads>(va, &ta);
      const int64_t eb = BlockExclusiveScan<kThreads>(vb, &tb);
      if (c < g.chunks) {
        offsets[2 * c] = carry_a + ea;
        offsets[2 * c + 1] = carry_b + eb;
      }
      carry_a += ta;
      carry_b += tb;
    }
    if (threadIdx.x == 0) {
      DeviceState* st = &states[s];
      const int64_t above = carry_a, band = carry_b;
      if (st->kind == kMsTopKKind) {
        st->plan = MsTopKPlan(st->end, above, above + band, g.n, g.k, g.seed);
      } else if (st->kind == kThresholdKind) {
        st->plan = ThresholdPlan(st->end, above);
      }  // an ExactPlan is complete (`above` equals its above_count)
    }
  }
}

// One block, segmented threshold mode: every segment's output size (0 when
// inactive) to `sizes`, and their exclusive sums to the table's out_begin.
__global__ void OutputOffsetsKernel(Segments segs, const DeviceState* states,
                                    int64_t* sizes) {
  int64_t carry = 0;
  for (int64_t first = 0; first < segs.count; first += kThreads) {
    const int64_t s = first + threadIdx.x;
    int64_t size = 0;
    if (s < segs.count && Active(segs.table[s])) {
      size = states[s].plan.output_size;
    }
    int64_t total;
    const int64_t before = BlockExclusiveScan<kThreads>(size, &total);
    if (s < segs.count) {
      sizes[s] = size;
      segs.table[s].out_begin = carry + before;
    }
    carry += total;
  }
}

// Every tile's exclusive offsets: its chunk's plus a block scan of the
// chunk's tiles, one per thread (chunks of every segment).
__global__ void TileScanKernel(Segments segs, const int32_t* counts,
                               const int64_t* chunk_offsets,
                               int64_t* tile_offsets) {
  for (int64_t c = blockIdx.x; c < segs.chunks; c += gridDim.x) {
    const int s = segs.Find<&Segment::chunk_begin>(c);
    const Segment g = segs.At(s);
    const int32_t* seg_counts = counts + 2 * g.tile_begin;
    int64_t* seg_offsets = tile_offsets + 2 * g.tile_begin;
    const int64_t t = (c - g.chunk_begin) * kChunk + threadIdx.x;
    const int64_t a = t < g.tiles ? seg_counts[t] : 0;
    const int64_t b = t < g.tiles ? seg_counts[g.tiles + t] : 0;
    int64_t ta, tb;
    const int64_t ea = BlockExclusiveScan<kThreads>(a, &ta);
    const int64_t eb = BlockExclusiveScan<kThreads>(b, &tb);
    if (t < g.tiles) {
      seg_offsets[t] = chunk_offsets[2 * c] + ea;
      seg_offsets[g.tiles + t] = chunk_offsets[2 * c + 1] + eb;
    }
  }
}

// Writes every selected element of each tile (of every segment) at its
// output rank, from its segment's out_begin, below its plan's output size
// and `size`, the output's. Items are visited in index order: item j of
// the tile's row-major [kItems, kThreads] layout is element
// base + j * kThreads + thread, and ranks are scanned per row, so each
// segment's output stays in index order. Indices are the segment's own.
template <typename T>
__global__ void WriteKernel(const T* x, Segments segs,
                            const DeviceState* states,
                            const int64_t* tile_offsets, int64_t size,
                            T* values, int32_t* indices, T* zero) {
  for (int64_t t = blockIdx.x; t < segs.tiles; t += gridDim.x) {
    const SegmentTile st = TileAt(segs, states, t);
    const Segment& g = st.g;
    const SelectionPlan& p = st.plan;
    // The segment's output: from out_begin, below its size and `size`.
    const int64_t room = size - g.out_begin;
    const int64_t limit = p.output_size < room ? p.output_size : room;
    const T* xs = x + g.offset;
    const int64_t tile = st.tile;
    const int64_t* seg_offsets = tile_offsets + 2 * g.tile_begin;
    int64_t above_before = seg_offsets[tile];
    int64_t band_before = seg_offsets[g.tiles + tile];
    const int64_t base = tile * kTile;
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = base + j * kThreads + threadIdx.x;
      int c = 0;
      T v{};
      if (i < g.n) {
        v = xs[i];
        c = Classify(p, Key(v));
      }
      int total_a, total_b;
      const int ea =
          BlockExclusiveScan<kThreads>(static_cast<int>(c == 1), &total_a);
      const int eb =
          BlockExclusiveScan<kThreads>(static_cast<int>(c == 2), &total_b);
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
        if (pos >= 0 && pos < limit) {
          values[g.out_begin + pos] = v;
          indices[g.out_begin + pos] = static_cast<int32_t>(i);
          if (zero != nullptr) Store(zero + g.offset + i, 0.0f);
        }
      }
      above_before += total_a;
      band_before += total_b;
    }
  }
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

// Whether the segments are valid: 0 <= k <= n < 2^31 (int32 indices),
// offset >= 0.
bool ValidSegments(const TopKSampleSegment* in, int count) {
  if (count < 0 || (count > 0 && in == nullptr)) return false;
  for (int s = 0; s < count; ++s) {
    const TopKSampleSegment& g = in[s];
    if (g.offset < 0 || g.k < 0 || g.k > g.n ||
        g.n > std::numeric_limits<int32_t>::max()) {
      return false;
    }
  }
  return true;
}

// The kernels' segments of `count` input ones, with their numberings; the
// ranks are SetRanks's. Output entries follow in segment order, k per
// active segment (threshold mode: OutputOffsetsKernel's instead).
HostSegments Describe(const TopKSampleSegment* in, int count) {
  HostSegments h;
  h.segs.resize(count);
  int64_t out = 0;
  for (int s = 0; s < count; ++s) {
    Segment& g = h.segs[s];
    g = Segment{};
    g.offset = in[s].offset;
    g.n = in[s].n;
    g.k = in[s].k;
    g.seed = in[s].seed;
    g.ranks.k = g.ranks.k1 = g.ranks.k2 = -1;
    g.block_begin = h.blocks;
    g.tile_begin = h.tiles;
    g.chunk_begin = h.chunks;
    g.out_begin = out;
    if (Active(g)) {
      g.blocks = StrideGridFor(g.n, kThreads);
      g.tiles = CeilDiv(g.n, kTile);
      g.chunks = CeilDiv(g.tiles, kChunk);
      out += g.k;
    }
    h.blocks += g.blocks;
    h.tiles += g.tiles;
    h.chunks += g.chunks;
  }
  return h;
}

void SetRanks(TopKSampleMode mode, HostSegments* h) {
  for (Segment& g : h->segs) {
    if (!Active(g)) continue;
    g.ranks = WantedRanks(mode, g.n, g.k);
    h->any_ranks = h->any_ranks || g.ranks.count > 0;
  }
}

// The kernels' view of the segments: the table in the scratch (a
// segmented launch) or the one segment by value.
Segments View(const HostSegments& h, const Layout& l, char* scratch) {
  Segments v;
  v.table = l.table_off >= 0 ? reinterpret_cast<Segment*>(scratch + l.table_off)
                             : nullptr;
  v.one = h.segs.empty() ? Segment{} : h.segs[0];
  v.count = static_cast<int>(h.segs.size());
  v.blocks = h.blocks;
  v.tiles = h.tiles;
  v.chunks = h.chunks;
  return v;
}

// Grid of the kernels that run one block per segment.
int SegmentGrid(int count) { return GridFor(count); }

// The plan of every segment (at least one active), on the stream: in a
// segmented launch, first the segment table from the host (one
// asynchronous copy), last, in threshold mode, the output sizes and
// offsets. No host synchronisation.
template <typename T>
int Plan(const T* x, const HostSegments& h, const Layout& l,
         TopKSampleMode mode, int rounds, char* scratch, cudaStream_t s) {
  const Segments segs = View(h, l, scratch);
  auto* states = reinterpret_cast<DeviceState*>(scratch);
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
  const PlanArgs args{mode, rounds};

  cudaError_t err = cudaSuccess;
  if (segs.table != nullptr) {
    // From pageable host memory: CUDA stages the bytes and returns without
    // waiting for the stream.
    err = cudaMemcpyAsync(segs.table, h.segs.data(),
                          sizeof(Segment) * h.segs.size(),
                          cudaMemcpyHostToDevice, s);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  err = cudaMemsetAsync(scratch + l.hist_off[0], 0, l.zero_bytes, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int grid = GridFor(h.blocks);
  const int seg_grid = SegmentGrid(segs.count);
  const DeviceState* cstates = states;
  if (mode == TopKSampleMode::kTrimmed) {
    LaunchKernel(HistKernel<T, false>, grid, kThreads, 0, s, x, segs, 0,
                 cstates, hist[0], nullptr, nullptr, nullptr);
  } else {
    LaunchKernel(HistKernel<T, true>, grid, kThreads, 0, s, x, segs, 0,
                 cstates, hist[0], sums, maxs, fins);
  }
  if (h.any_ranks) {
    for (int p = 0; p < kPasses; ++p) {
      if (p > 0) {
        LaunchKernel(HistKernel<T, false>, grid, kThreads, 0, s, x, segs, p,
                     cstates, hist[p], nullptr, nullptr, nullptr);
      }
      LaunchKernel(SelectDigitKernel, seg_grid, kThreads, 0, s, p, segs,
                   states, hist[p]);
    }
  }
  LaunchKernel(PlanKernel, seg_grid, kThreads, 0, s, args, segs, sums, maxs,
               fins, states);
  LaunchKernel(TileCountKernel<T>, GridFor(h.tiles), kThreads, 0, s, x, segs,
               cstates, counts, chunk_totals);
  LaunchKernel(FinalizeKernel, seg_grid, kThreads, 0, s, segs, chunk_totals,
               chunk_offsets, states);
  if (segs.table != nullptr && mode == TopKSampleMode::kThreshold) {
    LaunchKernel(OutputOffsetsKernel, 1, kThreads, 0, s, segs, cstates,
                 reinterpret_cast<int64_t*>(scratch + l.size_off));
  }
  LaunchKernel(TileScanKernel, GridFor(h.chunks), kThreads, 0, s, segs,
               counts, chunk_offsets, tile_offsets);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int Write(const T* x, const HostSegments& h, const Layout& l, int64_t size,
          T* values, int32_t* indices, T* zero, char* scratch,
          cudaStream_t s) {
  if (h.tiles == 0 || size == 0) return 0;
  LaunchKernel(WriteKernel<T>, GridFor(h.tiles), kThreads, 0, s, x,
               View(h, l, scratch),
               reinterpret_cast<const DeviceState*>(scratch),
               reinterpret_cast<const int64_t*>(scratch + l.tile_off_off),
               size, values, indices, zero);
  return static_cast<int>(cudaGetLastError());
}

// A single-tensor launch: the one segment [0, n).
HostSegments Single(int64_t n, int64_t k, int64_t seed) {
  const TopKSampleSegment one{0, n, k, seed};
  return Describe(&one, 1);
}

// The one copy of data-dependent output sizes to the host, and the wait.
int CopySizesToHost(int64_t* sizes, const void* src, int count,
                    void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemcpyAsync(sizes, src, sizeof(int64_t) * count,
                                    cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return static_cast<int>(err);
}

}  // namespace

int64_t TopKSampleScratchBytes(int64_t n) {
  // The layout depends on n alone for any 0 < k <= n.
  return MakeLayout(Single(n, n, 0), false).total;
}

template <typename T>
int AddResidual(const T* gradient, const T* residual, T* acc, int64_t n,
                void* stream) {
  if (n == 0) return 0;
  LaunchKernel(AddKernel<T>, StrideGridFor(n, kThreads), kThreads, 0,
               static_cast<cudaStream_t>(stream), gradient, residual, acc, n);
  return static_cast<int>(cudaGetLastError());
}

int64_t TopKRatioScratchBytes(int64_t n, int64_t k) {
  return Align(TopKSampleScratchBytes(n)) + Align(4 * n) + Align(4 * k);
}

template <typename T>
int TopKRatio(const T* gradient, const T* residual, const T* weights,
              float floor, int64_t n, int64_t k, T* acc, T* values,
              int32_t* indices, void* scratch, void* stream) {
  if (n == 0) return 0;
  auto* plan = static_cast<char*>(scratch);
  auto* scores = reinterpret_cast<float*>(
      plan + Align(TopKSampleScratchBytes(n)));
  float* selected = scores + Align(4 * n) / 4;  // the scores selected
  const auto s = static_cast<cudaStream_t>(stream);
  LaunchKernel(RatioKernel<T>, StrideGridFor(n, kThreads), kThreads, 0, s,
               gradient, residual, weights, floor, acc, scores, n);
  int err = static_cast<int>(cudaGetLastError());
  if (err != 0 || k == 0) return err;
  const auto mode = TopKSampleMode::kTrimmed;
  err = TopKSamplePlan(static_cast<const float*>(scores), n, k, mode, 1, 0,
                       plan, stream);
  if (err != 0) return err;
  err = TopKSampleWrite(static_cast<const float*>(scores), n, k, selected,
                        indices, static_cast<float*>(nullptr), plan, stream);
  if (err != 0) return err;
  LaunchKernel(GatherZeroKernel<T>, StrideGridFor(k, kThreads), kThreads, 0,
               s, static_cast<const int32_t*>(indices), k, acc, values);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int TopKSamplePlan(const T* x, int64_t n, int64_t k, TopKSampleMode mode,
                   int rounds, int64_t seed, void* scratch, void* stream) {
  if (k <= 0 || n <= 0) return 0;
  HostSegments h = Single(n, k, seed);
  SetRanks(mode, &h);
  return Plan(x, h, MakeLayout(h, false), mode, rounds,
                   static_cast<char*>(scratch),
                   static_cast<cudaStream_t>(stream));
}

int TopKSampleOutputSize(TopKSampleMode mode, int64_t n, int64_t k,
                         const void* scratch, void* stream, int64_t* size) {
  *size = n > 0 ? k : 0;
  if (mode != TopKSampleMode::kThreshold || *size == 0) return 0;
  const auto* st = static_cast<const DeviceState*>(scratch);
  return CopySizesToHost(size, &st->plan.output_size, 1, stream);
}

template <typename T>
int TopKSampleWrite(const T* x, int64_t n, int64_t output_size, T* values,
                    int32_t* indices, T* zero_selected, void* scratch,
                    void* stream) {
  if (n == 0 || output_size == 0) return 0;
  const HostSegments h = Single(n, n, 0);  // tiles depend on n alone
  return Write(x, h, MakeLayout(h, false), output_size, values, indices,
                    zero_selected, static_cast<char*>(scratch),
                    static_cast<cudaStream_t>(stream));
}

int64_t TopKSampleSegmentsScratchBytes(const TopKSampleSegment* segments,
                                       int count) {
  if (!ValidSegments(segments, count)) return -1;
  return MakeLayout(Describe(segments, count), true).total;
}

template <typename T>
int TopKSampleSegmentsPlan(const T* x, const TopKSampleSegment* segments,
                           int count, TopKSampleMode mode, int rounds,
                           void* scratch, void* stream) {
  if (!ValidSegments(segments, count)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  HostSegments h = Describe(segments, count);
  if (h.tiles == 0) return 0;  // no active segment
  SetRanks(mode, &h);
  return Plan(x, h, MakeLayout(h, true), mode, rounds,
                   static_cast<char*>(scratch),
                   static_cast<cudaStream_t>(stream));
}

int TopKSampleSegmentsOutputSizes(TopKSampleMode mode,
                                  const TopKSampleSegment* segments,
                                  int count, const void* scratch,
                                  void* stream, int64_t* output_sizes) {
  if (!ValidSegments(segments, count)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  bool any = false;
  for (int s = 0; s < count; ++s) {
    const bool active = segments[s].n > 0 && segments[s].k > 0;
    output_sizes[s] = active ? segments[s].k : 0;
    any = any || active;
  }
  if (mode != TopKSampleMode::kThreshold || !any) return 0;
  const Layout l = MakeLayout(Describe(segments, count), true);
  return CopySizesToHost(output_sizes,
                         static_cast<const char*>(scratch) + l.size_off,
                         count, stream);
}

template <typename T>
int TopKSampleSegmentsWrite(const T* x, const TopKSampleSegment* segments,
                            int count, int64_t output_size, T* values,
                            int32_t* indices, T* zero_selected,
                            void* scratch, void* stream) {
  if (!ValidSegments(segments, count)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const HostSegments h = Describe(segments, count);
  return Write(x, h, MakeLayout(h, true), output_size, values, indices,
                    zero_selected, static_cast<char*>(scratch),
                    static_cast<cudaStream_t>(stream));
}

// The launchers of top_k_sample_gpu.h for each element type.
#define TFGC_INSTANTIATE_TOP_K_SAMPLE(T)                                      \
  template int AddResidual(const T*, const T*, T*, int64_t, void*);           \
  template int TopKRatio(const T*, const T*, const T*, float, int64_t,       \
                         int64_t, T*, T*, int32_t*, void*, void*);            \
  template int TopKSamplePlan(const T*, int64_t, int64_t, TopKSampleMode,     \
                              int, int64_t, void*, void*);                    \
  template int TopKSampleWrite(const T*, int64_t, int64_t, T*, int32_t*, T*,  \
                               void*, void*);                                 \
  template int TopKSampleSegmentsPlan(const T*, const TopKSampleSegment*,     \
                                      int, TopKSampleMode, int, void*,        \
                                      void*);                                 \
  template int TopKSampleSegmentsWrite(const T*, const TopKSampleSegment*,    \
                                       int, int64_t, T*, int32_t*, T*, void*, \
                                       void*);

TFGC_INSTANTIATE_TOP_K_SAMPLE(float)
TFGC_INSTANTIATE_TOP_K_SAMPLE(__half)
TFGC_INSTANTIATE_TOP_K_SAMPLE(__nv_bfloat16)

#undef TFGC_INSTANTIATE_TOP_K_SAMPLE

}  // namespace gpu
}  // namespace tfgc
