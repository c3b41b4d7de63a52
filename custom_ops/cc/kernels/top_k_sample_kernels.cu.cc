// Copyright 2026 The tfgc Authors.
//
// CUDA kernels of TopKSample. This file includes no TensorFlow header: the
// TF glue (top_k_sample_kernels.cc, GOOGLE_CUDA) and the standalone harness
// (custom_ops/cuda_harness/) both link it as is.
//
// Plan: statistics in one pass (per-block partials combined on the host in
// block order, so the mean is deterministic); the (k+1)-th and, for the
// threshold search, 2k-th largest keys by a bisection over the keys (one
// counting pass and one copy to the host per round); the bisection on ratio
// from those (BisectByOrder, no pass); the counts at its final thresholds;
// then one ordered write: per-tile counts, an exclusive scan on the host,
// and a kernel that writes every selected element at its rank. Trimmed
// top-k (and the threshold search's exact fallback) finds the k-th largest
// key the same way. Keys are compared as integers (the header says
// why), so that neither -ftz=true device code nor a host thread that
// flushes denormals changes a result. Grid sizes come from the device's
// multiprocessor count and maximum grid size.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;
constexpr int kTile = kThreads * kItems;

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

// The key of top_k_sample_kernels.h: the bits of |v| in float32, NaN's
// those of +inf.
template <typename T>
__device__ __forceinline__ uint32_t Key(T v) {
  const uint32_t bits = __float_as_uint(ToFloat(v)) & 0x7fffffffu;
  return bits < kInfKey ? bits : kInfKey;
}

struct DeviceLimits {
  int sms = 1;
  int max_grid = 65535;
};

DeviceLimits Limits() {
  DeviceLimits d;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return d;
  cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&d.max_grid, cudaDevAttrMaxGridDimX, dev);
  if (d.sms < 1) d.sms = 1;
  if (d.max_grid < 1) d.max_grid = 65535;
  return d;
}

// Grid for a grid-stride loop over n elements: a few blocks per SM.
int StrideGrid(int64_t n, const DeviceLimits& d) {
  const int64_t want = (n + kThreads - 1) / kThreads;
  const int64_t cap = std::min<int64_t>(int64_t{d.sms} * 8, d.max_grid);
  return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

int64_t NumTiles(int64_t n) { return (n + kTile - 1) / kTile; }

// Scratch layout (bytes, 16-aligned pieces).
struct Layout {
  int64_t stats_blocks;
  int64_t tiles;
  int64_t sum_off, max_off, fin_off, count_off, tile_off, total;
};

int64_t Align(int64_t v) { return (v + 15) / 16 * 16; }

Layout MakeLayout(int64_t n, const DeviceLimits& d) {
  Layout l;
  l.stats_blocks = StrideGrid(n, d);
  l.tiles = std::max<int64_t>(1, NumTiles(n));
  l.sum_off = 0;
  l.max_off = Align(l.sum_off + 8 * l.stats_blocks);
  l.fin_off = Align(l.max_off + 4 * l.stats_blocks);
  l.count_off = Align(l.fin_off + 8 * l.stats_blocks);
  l.tile_off = Align(l.count_off + 8);
  // Per tile: above count, band count (int32), then their exclusive offsets
  // (int64 each).
  l.total = Align(l.tile_off + l.tiles * (2 * 4 + 2 * 8));
  return l;
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

template <typename T>
__global__ void AddKernel(const T* g, const T* r, T* acc, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    acc[i] = FromFloat<T>(ToFloat(g[i]) + ToFloat(r[i]));
  }
}

template <typename T>
__global__ void StatsKernel(const T* x, int64_t n, double* sums, float* maxs,
                            unsigned long long* finites) {
  double sum = 0.0;
  float mx = 0.0f;
  unsigned long long fin = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t key = Key(x[i]);
    if (key < kInfKey) {  // finite; a subnormal key counts as 0
      const float a = key < kMinNormalKey ? 0.0f : __uint_as_float(key);
      sum += a;
      mx = fmaxf(mx, a);
      ++fin;
    }
  }
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

// count += number of keys >= thr (> thr when strict).
template <typename T>
__global__ void CountKernel(const T* x, int64_t n, uint32_t thr, bool strict,
                            unsigned long long* count) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t a = Key(x[i]);
    c += strict ? (a > thr) : (a >= thr);
  }
  c = WarpSum(c);
  if (threadIdx.x % 32 == 0 && c != 0) atomicAdd(count, c);
}

struct DevicePlan {
  bool has_above;
  bool above_strict;
  uint32_t above;  // keys
  bool has_band_lo;
  uint32_t band_lo;
  int64_t start;
  int64_t need;
};

__device__ __forceinline__ int Classify(const DevicePlan& p, uint32_t a) {
  const bool above =
      p.has_above && (p.above_strict ? a > p.above : a >= p.above);
  if (above) return 1;
  if (!p.has_band_lo || a >= p.band_lo) return 2;
  return 0;
}

template <typename T>
__global__ void TileCountKernel(const T* x, int64_t n, DevicePlan p,
                                int64_t tiles, int32_t* above_counts,
                                int32_t* band_counts) {
  __shared__ int s_a[kThreads / 32], s_b[kThreads / 32];
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
      above_counts[tile] = ta;
      band_counts[tile] = tb;
    }
    __syncthreads();
  }
}

// Inclusive block scan of one int per thread; returns the exclusive prefix
// and the block total.
__device__ __forceinline__ int BlockExclusiveScan(int v, int* total) {
  __shared__ int s_warp[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  int warp_base = 0, sum = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) warp_base += s_warp[w];
    sum += s_warp[w];
  }
  __syncthreads();
  *total = sum;
  return warp_base + incl - v;
}

// Writes every selected element of each tile at its output rank. Items are
// visited in index order: item j of the tile's row-major [kItems, kThreads]
// layout is element base + j * kThreads + thread, and ranks are scanned per
// row, so the output stays in index order.
template <typename T>
__global__ void WriteKernel(const T* x, int64_t n, DevicePlan p,
                            int64_t tiles, const int64_t* above_offsets,
                            const int64_t* band_offsets, T* values,
                            int32_t* indices, T* zero) {
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int64_t above_before = above_offsets[tile];
    int64_t band_before = band_offsets[tile];
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
      const int ea = BlockExclusiveScan(c == 1, &total_a);
      const int eb = BlockExclusiveScan(c == 2, &total_b);
      if (c != 0) {
        const int64_t a_rank = above_before + ea;
        const int64_t b_rank = band_before + eb;
        int64_t pos = -1;
        if (c == 1) {
          const int64_t sel = b_rank < p.start
                                  ? 0
                                  : (b_rank - p.start < p.need
                                         ? b_rank - p.start
                                         : p.need);
          pos = a_rank + sel;
        } else if (b_rank >= p.start && b_rank < p.start + p.need) {
          pos = a_rank + (b_rank - p.start);
        }
        if (pos >= 0) {
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

template <typename T>
class Counter {
 public:
  Counter(const T* x, int64_t n, unsigned long long* dev, cudaStream_t s,
          const DeviceLimits& d)
      : x_(x), n_(n), dev_(dev), s_(s), grid_(StrideGrid(n, d)) {}

  // Number of keys >= thr (> thr when strict); -1 on a CUDA error.
  int64_t operator()(uint32_t thr, bool strict) {
    if (cudaMemsetAsync(dev_, 0, sizeof(*dev_), s_) != cudaSuccess) return -1;
    LaunchKernel(CountKernel<T>, grid_, kThreads, 0, s_, x_, n_, thr, strict,
                 dev_);
    unsigned long long host = 0;
    if (cudaMemcpyAsync(&host, dev_, sizeof(host), cudaMemcpyDeviceToHost,
                        s_) != cudaSuccess ||
        cudaStreamSynchronize(s_) != cudaSuccess) {
      return -1;
    }
    return static_cast<int64_t>(host);
  }

 private:
  const T* x_;
  int64_t n_;
  unsigned long long* dev_;
  cudaStream_t s_;
  int grid_;
};

// The r-th largest key (1 <= r <= n) by bisection over the keys (count(>=
// 0) = n >= r); -1 on a CUDA error.
template <typename T>
int64_t KthLargestKey(Counter<T>& count, int64_t r) {
  uint32_t lo = 0, hi = kInfKey;  // count(>= lo) >= r holds at lo = 0
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo + 1) / 2;
    const int64_t c = count(mid, false);
    if (c < 0) return -1;
    if (c >= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The r-th largest key, kNoRank when r > n; false on a CUDA error.
template <typename T>
bool RankKey(Counter<T>& count, int64_t n, int64_t r, int64_t* key) {
  *key = r > n ? kNoRank : KthLargestKey(count, r);
  return r > n || *key >= 0;
}

template <typename T>
int ExactPlanGpu(Counter<T>& count, int64_t k, SelectionPlan* plan) {
  const int64_t v = KthLargestKey(count, k);
  if (v < 0) return static_cast<int>(cudaErrorUnknown);
  const int64_t greater = count(static_cast<uint32_t>(v), true);
  if (greater < 0) return static_cast<int>(cudaErrorUnknown);
  *plan = ExactPlan(static_cast<uint32_t>(v), greater, k);
  return 0;
}

template <typename T>
int PlanTyped(const T* x, int64_t n, int64_t k, TopKSampleMode mode,
              int rounds, int64_t seed, char* scratch, cudaStream_t s,
              SelectionPlan* plan) {
  const DeviceLimits d = Limits();
  const Layout l = MakeLayout(n, d);
  auto* sums = reinterpret_cast<double*>(scratch + l.sum_off);
  auto* maxs = reinterpret_cast<float*>(scratch + l.max_off);
  auto* fins = reinterpret_cast<unsigned long long*>(scratch + l.fin_off);
  auto* counter =
      reinterpret_cast<unsigned long long*>(scratch + l.count_off);
  Counter<T> count(x, n, counter, s, d);
  if (mode == TopKSampleMode::kTrimmed) return ExactPlanGpu(count, k, plan);

  const int grid = static_cast<int>(l.stats_blocks);
  LaunchKernel(StatsKernel<T>, grid, kThreads, 0, s, x, n, sums, maxs, fins);
  std::vector<double> h_sum(grid);
  std::vector<float> h_max(grid);
  std::vector<unsigned long long> h_fin(grid);
  cudaMemcpyAsync(h_sum.data(), sums, 8 * grid, cudaMemcpyDeviceToHost, s);
  cudaMemcpyAsync(h_max.data(), maxs, 4 * grid, cudaMemcpyDeviceToHost, s);
  cudaMemcpyAsync(h_fin.data(), fins, 8 * grid, cudaMemcpyDeviceToHost, s);
  cudaError_t err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return static_cast<int>(err);
  double sum = 0.0;
  float mx = 0.0f;
  unsigned long long fin = 0;
  for (int b = 0; b < grid; ++b) {
    sum += h_sum[b];
    mx = std::max(mx, h_max[b]);
    fin += h_fin[b];
  }
  const float mean = Mean(sum, static_cast<int64_t>(fin));
  if (fin == 0) mx = 0.0f;
  const float diff = Diff(mx, mean);
  const bool strict = mode == TopKSampleMode::kThreshold;
  int64_t v1 = kNoRank, v2 = kNoRank;
  if (!RankKey(count, n, k + 1, &v1) ||
      (strict && !RankKey(count, n, 2 * k, &v2))) {
    return static_cast<int>(cudaErrorUnknown);
  }
  const BisectionEnd e = BisectByOrder(mode, mean, diff, rounds, v1, v2);
  const int64_t lo_count = e.has_lo ? count(e.lo, strict) : n;
  const int64_t hi_count = e.has_hi ? count(e.hi, strict) : 0;
  if (lo_count < 0 || hi_count < 0) return static_cast<int>(cudaErrorUnknown);
  if (mode == TopKSampleMode::kMsTopK) {
    *plan = MsTopKPlan(e, hi_count, lo_count, n, k, seed);
    return 0;
  }
  if (e.has_lo) {
    *plan = ThresholdPlan(e, lo_count);
    return 0;
  }
  return ExactPlanGpu(count, k, plan);
}

template <typename T>
int WriteTyped(const T* x, int64_t n, const SelectionPlan& plan, T* values,
               int32_t* indices, T* zero, char* scratch, cudaStream_t s) {
  const DeviceLimits d = Limits();
  const Layout l = MakeLayout(n, d);
  const int64_t tiles = NumTiles(n);
  if (tiles == 0 || plan.output_size == 0) return 0;
  auto* a_cnt = reinterpret_cast<int32_t*>(scratch + l.tile_off);
  auto* b_cnt = a_cnt + tiles;
  auto* a_off = reinterpret_cast<int64_t*>(
      scratch + l.tile_off + Align(2 * 4 * tiles));
  auto* b_off = a_off + tiles;
  DevicePlan p{plan.has_above, plan.above_strict, plan.above,
               plan.has_band_lo, plan.band_lo, plan.start, plan.need};
  const int grid =
      static_cast<int>(std::min<int64_t>(tiles, int64_t{d.max_grid}));
  LaunchKernel(TileCountKernel<T>, grid, kThreads, 0, s, x, n, p, tiles, a_cnt,
               b_cnt);
  std::vector<int32_t> h_cnt(2 * tiles);
  cudaMemcpyAsync(h_cnt.data(), a_cnt, 8 * tiles, cudaMemcpyDeviceToHost, s);
  cudaError_t err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return static_cast<int>(err);
  std::vector<int64_t> h_off(2 * tiles);
  int64_t ra = 0, rb = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    h_off[t] = ra;
    h_off[tiles + t] = rb;
    ra += h_cnt[t];
    rb += h_cnt[tiles + t];
  }
  cudaMemcpyAsync(a_off, h_off.data(), 16 * tiles, cudaMemcpyHostToDevice, s);
  LaunchKernel(WriteKernel<T>, grid, kThreads, 0, s, x, n, p, tiles, a_off,
               b_off, values, indices, zero);
  err = cudaStreamSynchronize(s);  // h_off must outlive the copy
  if (err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int64_t TopKSampleScratchBytes(int64_t n) {
  return MakeLayout(n, Limits()).total;
}

int AddResidual(DType dtype, const void* gradient, const void* residual,
                void* acc, int64_t n, void* stream) {
  if (n == 0) return 0;
  const int grid = StrideGrid(n, Limits());
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
                   void* scratch, void* stream, SelectionPlan* plan) {
  *plan = SelectionPlan();
  if (k <= 0 || n <= 0) return 0;
  return Dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return PlanTyped<T>(static_cast<const T*>(x), n, k, mode, rounds, seed,
                        static_cast<char*>(scratch),
                        static_cast<cudaStream_t>(stream), plan);
  });
}

int TopKSampleWrite(DType dtype, const void* x, int64_t n,
                    const SelectionPlan& plan, void* values, int32_t* indices,
                    void* zero_selected, void* scratch, void* stream) {
  return Dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return WriteTyped<T>(static_cast<const T*>(x), n, plan,
                         static_cast<T*>(values), indices,
                         static_cast<T*>(zero_selected),
                         static_cast<char*>(scratch),
                         static_cast<cudaStream_t>(stream));
  });
}

}  // namespace gpu
}  // namespace tfgc
