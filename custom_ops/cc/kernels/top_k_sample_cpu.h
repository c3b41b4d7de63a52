// Copyright 2026 The tfgc Authors.
//
// The CPU selection of TopKSample and TopKSampleWithResidual, which the CPU
// functor of top_k_sample_kernels.cc calls: the types its two files share
// and their entry points. top_k_sample_cpu_scan.cc holds the pass over the
// input (statistics and compaction, with AVX2 paths); top_k_sample_cpu.cc
// the order statistics, the plan and the writing of the selection (its file
// comment describes the algorithm). Their templates are instantiated there
// for float, Eigen::half and Eigen::bfloat16. Depends on TensorFlow, unlike
// top_k_sample_common.h.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_CPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_CPU_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/top_k_sample_common.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"

namespace tfgc {
namespace cpu {

// The key of the header of an element of type T (float16 and bfloat16
// convert to float32 exactly).
template <typename T>
inline uint32_t ElementKey(T x) {
  return KeyOf(static_cast<float>(x));
}

// Histogram of the top 11 bits of keys (keys <= 0x7f800000 < 2^31).
constexpr int kTopShift = 20;
using DigitHist = std::array<int64_t, 1 << 11>;

// Adds to `h`, for each of the keys whose bits above shift + 11 are `high`,
// one at its digit (key >> shift) & 0x7ff; high 0 and shift kTopShift count
// every key at its top digit. Four keys a step into four partial counts:
// candidates often share digits, and one counter would make every key wait
// for the previous increment. size < 2^32 (the partial counts are 32-bit).
inline void AddDigits(const uint32_t* keys, int64_t size, int shift,
                      uint32_t high, DigitHist* h) {
  constexpr int kWays = 4;
  std::array<std::array<uint32_t, 1 << 11>, kWays> part{};
  int64_t i = 0;
  for (; i + kWays <= size; i += kWays) {
    for (int w = 0; w < kWays; ++w) {
      const uint32_t u = keys[i + w] >> shift;
      part[w][u & 0x7ffu] += (u >> 11) == high;
    }
  }
  for (; i < size; ++i) {
    const uint32_t u = keys[i] >> shift;
    part[0][u & 0x7ffu] += (u >> 11) == high;
  }
  for (size_t d = 0; d < h->size(); ++d) {
    for (const auto& p : part) (*h)[d] += p[d];
  }
}

// The elements a selection samples to predict where to compact: all of
// them below kMinSampled elements, else kSampleRuns runs of kSampleRun
// consecutive ones (16 cache lines of float32, prefetched, read far faster
// than 64 Ki elements one cache line apart), spread evenly. fn(i) for each,
// in index order.
constexpr int64_t kSampleRuns = 256;
constexpr int64_t kSampleRun = 256;
constexpr int64_t kMinSampled = 4 * kSampleRuns * kSampleRun;

template <typename F>
void ForEachSampled(int64_t n, F&& fn) {
  if (n < kMinSampled) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int64_t stride = n / kSampleRuns;
  for (int64_t r = 0; r < kSampleRuns; ++r) {
    const int64_t begin = r * stride + (stride - kSampleRun) / 2;
    for (int64_t i = begin; i < begin + kSampleRun; ++i) fn(i);
  }
}

// The rank among m sampled keys (ForEachSampled) whose key the r-th largest
// of all n keys reaches with high probability: r when the sample is the
// whole input, else r m / n plus four standard deviations and 8, rounded
// up (possibly above m: the sample cannot tell).
int64_t SampleRank(int64_t n, int64_t m, int64_t r);

// The r-th largest (1 <= r <= keys.size()) of `keys`, whose top-digit
// histogram (AddDigits at kTopShift) is `top`: two 11-bit histogram levels
// (the second a pass over the keys in fixed blocks on the intra-op thread
// pool), then nth_element in the one small bucket, gathered into `bucket`.
uint32_t KthLargestKey(OpKernelContext* ctx, const std::vector<uint32_t>& keys,
                       const DigitHist& top, int64_t r,
                       std::vector<uint32_t>* bucket);

// Growable, uninitialised (value, index) storage for one block's candidates.
struct CandidateBuffer {
  std::unique_ptr<float[]> value;
  std::unique_ptr<int32_t[]> index;
  int64_t size = 0;
  int64_t capacity = 0;

  void Reserve(int64_t want) {
    if (want <= capacity) return;
    const int64_t cap = std::max(want, 2 * capacity);
    std::unique_ptr<float[]> v(new float[cap]);
    std::unique_ptr<int32_t[]> i(new int32_t[cap]);
    std::copy(value.get(), value.get() + size, v.get());
    std::copy(index.get(), index.get() + size, i.get());
    value = std::move(v);
    index = std::move(i);
    capacity = cap;
  }
};

// Candidates hold the element's value (as float, exactly) as well as its
// key, so that writing the selection reads the input again only for
// mstopk's band when it has no lower end (WriteWholeBand); with weights
// they hold its RatioScore instead, and the values are read from the
// input when the selection is written (k of them). The
// kernel keeps one Candidates between calls (the fresh pages of a few MB of
// candidates cost more than the pass that fills them), up to kKeptBytes.
struct Candidates {
  std::vector<float> value;
  std::vector<int32_t> index;
  std::vector<CandidateBuffer> parts;  // per-block output of the compaction
  int64_t parts_used = 0;              // parts[0, parts_used) hold it
  // Set by a compaction that leaves the candidates in `parts` (value,
  // index, keys and keys_top are then empty); WriteSelection takes them.
  bool in_parts = false;
  std::vector<uint32_t> keys;          // the candidates' keys
  DigitHist keys_top;                  // their top-digit histogram
  std::vector<uint32_t> sample;        // the sampled keys
  DigitHist sample_top;
  std::vector<uint32_t> bucket;        // KthLargest's scratch
  // Set by PlanSelection when mstopk's band reaches below the candidates
  // (a coarse bisection grid, as with one huge outlier): band_counts[s]
  // counts the band keys in span s (kSpan elements) of the input, from
  // which WriteSelection reads the band slice.
  bool band_in_input = false;
  std::vector<int64_t> band_counts;

  int64_t Bytes() const {
    int64_t bytes = 4 * static_cast<int64_t>(value.capacity() +
                                             index.capacity() +
                                             keys.capacity() +
                                             sample.capacity() +
                                             bucket.capacity()) +
                    8 * static_cast<int64_t>(band_counts.capacity());
    for (const CandidateBuffer& p : parts) bytes += 8 * p.capacity;
    return bytes;
  }
  // Where each used part's candidates start when laid end to end, and
  // (last) how many candidates the parts hold.
  std::vector<int64_t> PartOffsets() const {
    std::vector<int64_t> offsets(parts_used + 1, 0);
    for (int64_t b = 0; b < parts_used; ++b) {
      offsets[b + 1] = offsets[b] + parts[b].size;
    }
    return offsets;
  }
};

// What a kernel keeps between calls: after one call on a huge or
// unfriendly input, more is released rather than kept for good.
constexpr int64_t kKeptBytes = int64_t{64} << 20;

// The buffers an op kernel keeps between calls: Candidates here, or
// another selection's (with a Bytes() of what they hold).
template <typename Buffers>
class BufferCache {
 public:
  // Lends the kept buffers for one selection (a concurrent one gets fresh
  // ones) and takes them back with their capacity, or fresh ones when they
  // hold more than kKeptBytes.
  class Lease {
   public:
    explicit Lease(BufferCache* cache) : cache_(cache) {
      std::lock_guard<std::mutex> lock(cache_->mu_);
      buffers_ = std::move(cache_->kept_);
      if (buffers_ == nullptr) buffers_ = std::make_unique<Buffers>();
    }
    ~Lease() {
      if (buffers_->Bytes() > kKeptBytes) {
        buffers_ = std::make_unique<Buffers>();
      }
      std::lock_guard<std::mutex> lock(cache_->mu_);
      cache_->kept_ = std::move(buffers_);
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    Buffers* get() { return buffers_.get(); }

   private:
    BufferCache* cache_;
    std::unique_ptr<Buffers> buffers_;
  };

 private:
  std::mutex mu_;
  std::unique_ptr<Buffers> kept_;
};

// The Candidates an op kernel keeps between calls.
using CandidateCache = BufferCache<Candidates>;

// The statistics of the definitions in top_k_sample_common.h.
struct Stats {
  float mean = 0.0f;
  float max = 0.0f;
  float diff = 0.0f;
};

// One pass over the input (top_k_sample_cpu_scan.cc): with a residual,
// acc = gradient + residual is written; with `stats`, the statistics are
// returned; every element whose key is >= s goes, in index order, into
// `cand`: with `gather`, into its value, index, keys and the keys'
// top-digit histogram, else they stay in its parts (Candidates::in_parts).
// With `in.weights`, keys and candidates are those of the RatioScores.
// It runs in chunks that stay in L1, so each chunk is read from memory once
// whatever it does. `fraction` estimates the share that passes, to size
// the per-block buffers.
template <typename T>
Stats Compact(OpKernelContext* ctx, const TopKSampleInput<T>& in, bool stats,
              uint32_t s, double fraction, bool gather, Candidates* cand);

// Elements per span of Candidates::band_counts.
constexpr int64_t kSpan = int64_t{1} << 16;

// Counts, per span of kSpan elements of x[0, n), the elements whose key
// is in [lo, hi), into `counts` (top_k_sample_cpu_scan.cc).
template <typename T>
void CountKeysInRange(OpKernelContext* ctx, const T* x, int64_t n,
                      uint32_t lo, uint32_t hi, std::vector<int64_t>* counts);

// The indices of the elements of x[begin, n) whose key is in [lo, hi),
// in index order, after the first `skip` of them: `take` of them, or as
// many as there are (top_k_sample_cpu_scan.cc).
template <typename T>
void RangeSlice(const T* x, int64_t begin, int64_t n, uint32_t lo,
                uint32_t hi, int64_t skip, int64_t take,
                std::vector<int32_t>* slice);

// The plan of the selection of k elements of `in` (output_size elements in
// threshold mode), 0 <= k <= n; writes acc with a residual. Leaves in
// `cand` what WriteSelection reads (top_k_sample_cpu.cc).
template <typename T>
SelectionPlan PlanSelection(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                            int64_t k, TopKSampleMode mode, int rounds,
                            int64_t seed, Candidates* cand);

// Writes the plan's selection (plan.output_size > 0 entries) in index
// order: values and int32 indices, and zeroes those positions of acc with a
// residual. An internal error if it selected another number of elements.
template <typename T>
absl::Status WriteSelection(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                            const SelectionPlan& plan, Candidates* cand,
                            T* values, int32_t* indices);

}  // namespace cpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_SAMPLE_CPU_H_
