// Copyright 2026 The tfgc Authors.
//
// The op kernel of Tfgc>TopKTwoSided, templated on the device: it validates
// k, has functor::TopKTwoSided (top_k_two_sided_kernels.h) plan both sides'
// selections, allocates the four outputs at their sizes and has it write
// them. Under GOOGLE_CUDA the GPU functor calls the launchers of
// top_k_two_sided_gpu.h.
//
// The CPU functor reads the input once for both sides (as TopKSample's
// trimmed mode does for one, top_k_sample_cpu.cc): a floor per side from
// the sample of TopKSample's selection (ForEachSampled: the lowest key of
// the top digit that holds the sampled lower bound of the side's k-th
// largest key, four standard deviations down), then one pass, in fixed
// blocks on the intra-op thread pool, that compacts every entry whose key
// on a side reaches that side's floor (an AVX2 loop, chosen at run time,
// skips sixteen entries at once when none reaches the lower floor). Each
// side's selection then comes from its candidates: all of them when they
// are at most min(k, entries), else the k-th largest key (KthLargestKey)
// and one pass over the candidates in index order. Only when the sample
// misleads (fewer than k candidates above a floor that hides entries) is
// the side compacted again, from every entry on it. The buffers stay with
// the kernel between calls (BufferCache), whose fresh pages would cost
// more than the pass.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/simd.h"
#include "custom_ops/cc/kernels/top_k_sample_cpu.h"
#include "custom_ops/cc/kernels/top_k_two_sided_common.h"
#include "custom_ops/cc/kernels/top_k_two_sided_kernels.h"

#if GOOGLE_CUDA
#include "custom_ops/cc/kernels/top_k_two_sided_gpu.h"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace {

// TopKSample's CPU selection (top_k_sample_cpu.h): its sample, the
// sampled bound of a rank, the order statistic of candidate keys and the
// buffers a kernel keeps.
using cpu::AddDigits;
using cpu::BufferCache;
using cpu::DigitHist;
using cpu::ForEachSampled;
using cpu::kMinSampled;
using cpu::kSampleRun;
using cpu::kSampleRuns;
using cpu::KthLargestKey;
using cpu::kTopShift;
using cpu::SampleRank;

// The float32 bits of an element (float16 and bfloat16 widen exactly).
template <typename T>
inline uint32_t ElementBits(T v) {
  return FloatBits(static_cast<float>(v));
}

// One side's candidates, in index order: their indices and keys.
struct SideCandidates {
  std::vector<int32_t> index;
  std::vector<uint32_t> key;

  int64_t size() const { return static_cast<int64_t>(index.size()); }
  void Clear() {
    index.clear();
    key.clear();
  }
  int64_t Bytes() const {
    return 4 * static_cast<int64_t>(index.capacity() + key.capacity());
  }
};

// What a kernel keeps between calls (BufferCache, up to kKeptBytes): the
// fresh pages of the buffers would cost more than the pass that fills
// them.
struct TwoSidedBuffers {
  std::vector<uint32_t> sample[kSides];  // the sampled keys on each side
  std::vector<SideCandidates> parts;     // [block * kSides + side]
  SideCandidates cand[kSides];
  std::vector<uint32_t> bucket;  // KthLargestKey's scratch
  std::vector<int32_t> selected[kSides];

  int64_t Bytes() const {
    int64_t bytes = 4 * static_cast<int64_t>(bucket.capacity());
    for (int s = 0; s < kSides; ++s) {
      bytes += 4 * static_cast<int64_t>(sample[s].capacity() +
                                        selected[s].capacity());
      bytes += cand[s].Bytes();
    }
    for (const SideCandidates& p : parts) bytes += p.Bytes();
    return bytes;
  }
};

// Appends entry i (float32 bits `bits`) to the candidates of each side on
// which its key reaches the side's floor (every floor is > 0, so an entry
// is never a candidate of a side it is not on).
inline void Offer(uint32_t bits, int64_t i, const uint32_t* floor,
                  SideCandidates* out) {
  for (int s = 0; s < kSides; ++s) {
    const uint32_t key = SideKey(bits, s);
    if (key >= floor[s]) {
      out[s].index.push_back(static_cast<int32_t>(i));
      out[s].key.push_back(key);
    }
  }
}

// The candidates of x[begin, end): `lowest` is the lower floor, which the
// magnitude bits of every candidate reach (a key is at most those bits).
template <typename T>
void ScanScalar(const T* x, int64_t begin, int64_t end, const uint32_t* floor,
                uint32_t lowest, SideCandidates* out) {
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t bits = ElementBits(x[i]);
    if ((bits & 0x7fffffffu) >= lowest) Offer(bits, i, floor, out);
  }
}

#if TFGC_HAVE_AVX2_PATH
// ScanScalar sixteen entries a step: their magnitude bits against the lower
// floor (below 2^31, so signed compares order them; lowest >= 1), and
// Offer for the few that reach it. Prefetches 4 KiB ahead, as TopKSample's
// scan (top_k_sample_cpu_scan.cc says why).
template <typename T>
TFGC_AVX2 void ScanAvx2(const T* x, int64_t begin, int64_t end,
                        const uint32_t* floor, uint32_t lowest,
                        SideCandidates* out) {
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(lowest - 1));
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  alignas(32) uint32_t lanes[16];
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + 4096, _MM_HINT_T0);
    const __m256i a = _mm256_castps_si256(LoadFloat8(x + i));
    const __m256i b = _mm256_castps_si256(LoadFloat8(x + i + 8));
    const int low = _mm256_movemask_ps(_mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_and_si256(a, magnitude), below)));
    const int high = _mm256_movemask_ps(_mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_and_si256(b, magnitude), below)));
    int bits = low | high << 8;
    if (bits == 0) continue;
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 8), b);
    for (; bits != 0; bits &= bits - 1) {
      const int lane = __builtin_ctz(static_cast<unsigned>(bits));
      Offer(lanes[lane], i + lane, floor, out);
    }
  }
  ScanScalar(x, i, end, floor, lowest, out);
}
#endif  // TFGC_HAVE_AVX2_PATH

// Per side, a floor that the side's k-th largest key reaches with high
// probability, from the sampled entries on that side: the lowest key of
// the top digit (kTopShift) that holds their SampleRank-th largest key;
// kMinNormalKey, every entry of the side, when the sample holds too few of
// them to tell. `share[s]` gets the sampled share of entries that are
// candidates of side s. A histogram, not nth_element: a floor only needs
// to be low enough, and the pass over the input decides the rest.
template <typename T>
void SampleFloors(const T* x, int64_t n, int64_t k, TwoSidedBuffers* buf,
                  uint32_t* floor, double* share) {
  const int64_t m = n < kMinSampled ? n : kSampleRuns * kSampleRun;
  std::vector<uint32_t>* keys = buf->sample;
  int64_t count[kSides] = {0, 0};
  for (int s = 0; s < kSides; ++s) keys[s].resize(m);
  ForEachSampled(n, [&](int64_t i) {  // branch-free: signs are random
    const uint32_t bits = ElementBits(x[i]);
    for (int s = 0; s < kSides; ++s) {
      const uint32_t key = SideKey(bits, s);
      keys[s][count[s]] = key;
      count[s] += key != 0;
    }
  });
  const int64_t rank = SampleRank(n, m, k);
  for (int s = 0; s < kSides; ++s) {
    floor[s] = kMinNormalKey;
    int64_t passing = count[s];
    if (rank <= count[s]) {
      DigitHist top{};
      AddDigits(keys[s].data(), count[s], kTopShift, 0, &top);
      int digit = static_cast<int>(top.size()) - 1;
      for (passing = top[digit]; passing < rank; passing += top[digit]) {
        --digit;  // the counts add up to count[s] >= rank
      }
      floor[s] = std::max(kMinNormalKey,
                          static_cast<uint32_t>(digit) << kTopShift);
    }
    share[s] = static_cast<double>(passing) /
               static_cast<double>(std::max<int64_t>(1, m));
  }
}

// Each side's candidates at `floor` (kNoKey: none for that side) from one
// pass over x, in fixed blocks on the intra-op thread pool, into
// buf->cand[s] for every side with a floor below kNoKey.
template <typename T>
void Compact(OpKernelContext* ctx, const T* x, int64_t n,
             const uint32_t* floor, const double* share,
             TwoSidedBuffers* buf) {
  const uint32_t lowest = std::min(floor[0], floor[1]);
  const Blocks blocks(n, NumThreads(ctx));
  std::vector<SideCandidates>& parts = buf->parts;
  if (static_cast<int64_t>(parts.size()) < kSides * blocks.count()) {
    parts.resize(kSides * blocks.count());
  }
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    SideCandidates* part = parts.data() + kSides * b;
    const int64_t begin = blocks.begin(b), end = blocks.end(b);
    for (int s = 0; s < kSides; ++s) {
      part[s].Clear();
      if (floor[s] == kNoKey) continue;
      const auto want = static_cast<size_t>(
          1.25 * share[s] * static_cast<double>(end - begin) + 64);
      part[s].index.reserve(want);
      part[s].key.reserve(want);
    }
#if TFGC_HAVE_AVX2_PATH
    if (UseAvx2()) return ScanAvx2(x, begin, end, floor, lowest, part);
#endif
    ScanScalar(x, begin, end, floor, lowest, part);
  });
  for (int s = 0; s < kSides; ++s) {
    if (floor[s] == kNoKey) continue;
    SideCandidates& c = buf->cand[s];
    c.Clear();
    for (int64_t b = 0; b < blocks.count(); ++b) {
      const SideCandidates& p = parts[kSides * b + s];
      c.index.insert(c.index.end(), p.index.begin(), p.index.end());
      c.key.insert(c.key.end(), p.key.begin(), p.key.end());
    }
  }
}

// The r largest keys of side s's candidates (which hold every key of the
// side that reaches its r-th largest), the lower index first among equal
// keys: their indices, increasing, into buf->selected[s].
void SelectSide(OpKernelContext* ctx, int s, int64_t r,
                TwoSidedBuffers* buf) {
  const SideCandidates& c = buf->cand[s];
  std::vector<int32_t>& selected = buf->selected[s];
  if (c.size() <= r) {
    selected.assign(c.index.begin(), c.index.end());
    return;
  }
  DigitHist top{};
  AddDigits(c.key.data(), c.size(), kTopShift, 0, &top);
  const uint32_t kth = KthLargestKey(ctx, c.key, top, r, &buf->bucket);
  int64_t equal_left = r;  // after the keys above kth: how many equal to it
  for (uint32_t key : c.key) equal_left -= key > kth;
  selected.clear();
  for (int64_t j = 0; j < c.size(); ++j) {
    const uint32_t key = c.key[j];
    if (key > kth || (key == kth && equal_left-- > 0)) {
      selected.push_back(c.index[j]);
    }
  }
}

}  // namespace

namespace functor {

template <typename T>
class TopKTwoSided<CPUDevice, T> {
 public:
  using Cache = BufferCache<TwoSidedBuffers>;

  explicit TopKTwoSided(Cache* cache) : lease_(cache) {}

  absl::Status Plan(OpKernelContext* ctx, const T* x, int64_t n, int64_t k,
                    int64_t sizes[kSides]) {
    TwoSidedBuffers* buf = lease_.get();
    for (int s = 0; s < kSides; ++s) buf->selected[s].clear();
    if (n > 0 && k > 0) {
      uint32_t floor[kSides];
      double share[kSides];
      SampleFloors(x, n, k, buf, floor, share);
      Compact(ctx, x, n, floor, share, buf);
      for (int s = 0; s < kSides; ++s) {
        if (buf->cand[s].size() < k && floor[s] > kMinNormalKey) {
          // The sample misled: entries below the floor may be selected.
          uint32_t all[kSides] = {kNoKey, kNoKey};
          all[s] = kMinNormalKey;
          const double every[kSides] = {1.0, 1.0};
          Compact(ctx, x, n, all, every, buf);
        }
        SelectSide(ctx, s, std::min(k, buf->cand[s].size()), buf);
      }
    }
    for (int s = 0; s < kSides; ++s) {
      sizes[s] = static_cast<int64_t>(buf->selected[s].size());
    }
    return absl::OkStatus();
  }

  absl::Status Write(OpKernelContext* /*ctx*/, const T* x, int64_t /*n*/,
                     T* const values[kSides],
                     int32_t* const indices[kSides]) {
    for (int s = 0; s < kSides; ++s) {
      const std::vector<int32_t>& sel = lease_.get()->selected[s];
      for (size_t j = 0; j < sel.size(); ++j) {
        values[s][j] = SideValue(x[sel[j]], s);
        indices[s][j] = sel[j];
      }
    }
    return absl::OkStatus();
  }

 private:
  typename Cache::Lease lease_;  // the buffers, the selection from Plan
};

#if GOOGLE_CUDA
// The launchers of top_k_two_sided_gpu.h on the op's stream, with a scratch
// from TensorFlow's allocator; the host waits once, for the sizes.
template <typename T>
class TopKTwoSided<GPUDevice, T> {
 public:
  struct Cache {};  // nothing is kept between calls

  explicit TopKTwoSided(Cache* /*cache*/) {}

  absl::Status Plan(OpKernelContext* ctx, const T* x, int64_t n, int64_t k,
                    int64_t sizes[kSides]) {
    TF_RETURN_IF_ERROR(
        AllocateScratch(ctx, gpu::TopKTwoSidedScratchBytes(n), &scratch_));
    TF_RETURN_IF_ERROR(CudaStatus(
        gpu::TopKTwoSidedPlan(ToCuda(x), n, k, Scratch(), StreamOf(ctx)),
        "TopKTwoSidedPlan"));
    TF_RETURN_IF_ERROR(CudaStatus(
        gpu::TopKTwoSidedOutputSizes(n, k, Scratch(), StreamOf(ctx), sizes),
        "TopKTwoSidedOutputSizes"));
    for (int s = 0; s < kSides; ++s) sizes_[s] = sizes[s];
    return absl::OkStatus();
  }

  absl::Status Write(OpKernelContext* ctx, const T* x, int64_t n,
                     T* const values[kSides],
                     int32_t* const indices[kSides]) {
    return CudaStatus(
        gpu::TopKTwoSidedWrite(
            ToCuda(x), n, sizes_, ToCuda(values[kPositiveSide]),
            indices[kPositiveSide], ToCuda(values[kNegativeSide]),
            indices[kNegativeSide], Scratch(), StreamOf(ctx)),
        "TopKTwoSidedWrite");
  }

 private:
  void* Scratch() { return scratch_.flat<int8_t>().data(); }

  Tensor scratch_;  // the plan, from Plan to Write
  int64_t sizes_[kSides] = {0, 0};
};
#endif  // GOOGLE_CUDA

}  // namespace functor

namespace {

// TopKTwoSided (inputs x, k; outputs the positive side's values and
// indices, then the negative side's).
template <typename Device, typename T, typename Tk>
class TopKTwoSidedOp : public OpKernel {
 public:
  explicit TopKTwoSidedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& k_t = ctx->input(1);
    const int64_t n = x.NumElements();
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(k_t.shape()),
                absl::InvalidArgumentError(
                    absl::StrCat("`k` must be a scalar. Received: k.shape=",
                                 k_t.shape().DebugString())));
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                absl::InvalidArgumentError(absl::StrCat(
                    "TopKTwoSided supports at most 2^31 - 1 elements (int32 "
                    "indices). Received: n=",
                    n)));
    const auto k = static_cast<int64_t>(k_t.scalar<Tk>()());
    OP_REQUIRES(ctx, k >= 0 && k <= n,
                absl::InvalidArgumentError(absl::StrCat(
                    "`k` must be in [0, n]. Received: k=", k, ", n=", n)));
    const T* data = x.flat<T>().data();
    Functor select(&cache_);
    int64_t sizes[kSides] = {0, 0};
    OP_REQUIRES_OK(ctx, select.Plan(ctx, data, n, k, sizes));
    T* values[kSides];
    int32_t* indices[kSides];
    for (int s = 0; s < kSides; ++s) {
      Tensor* v = nullptr;
      Tensor* i = nullptr;
      OP_REQUIRES_OK(ctx,
                     ctx->allocate_output(2 * s, TensorShape({sizes[s]}), &v));
      OP_REQUIRES_OK(
          ctx, ctx->allocate_output(2 * s + 1, TensorShape({sizes[s]}), &i));
      values[s] = v->flat<T>().data();
      indices[s] = i->flat<int32_t>().data();
    }
    if (sizes[kPositiveSide] + sizes[kNegativeSide] == 0) return;
    OP_REQUIRES_OK(ctx, select.Write(ctx, data, n, values, indices));
  }

 private:
  using Functor = functor::TopKTwoSided<Device, T>;

  typename Functor::Cache cache_;
};

#define REGISTER_CPU(T, Tk)                                     \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKTwoSided")             \
                              .Device(DEVICE_CPU)               \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<Tk>("Tk"),        \
                          TopKTwoSidedOp<CPUDevice, T, Tk>);

#define REGISTER_CPU_ALL_K(T) \
  REGISTER_CPU(T, int32_t)    \
  REGISTER_CPU(T, int64_t)

REGISTER_CPU_ALL_K(float)
REGISTER_CPU_ALL_K(Eigen::half)
REGISTER_CPU_ALL_K(Eigen::bfloat16)

#undef REGISTER_CPU_ALL_K
#undef REGISTER_CPU

#if GOOGLE_CUDA
// k lives in host memory.
#define REGISTER_GPU(T, Tk)                                     \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKTwoSided")             \
                              .Device(tensorflow::DEVICE_GPU)   \
                              .HostMemory("k")                  \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<Tk>("Tk"),        \
                          TopKTwoSidedOp<GPUDevice, T, Tk>);

#define REGISTER_GPU_ALL_K(T) \
  REGISTER_GPU(T, int32_t)    \
  REGISTER_GPU(T, int64_t)

REGISTER_GPU_ALL_K(float)
REGISTER_GPU_ALL_K(Eigen::half)
REGISTER_GPU_ALL_K(Eigen::bfloat16)

#undef REGISTER_GPU_ALL_K
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
