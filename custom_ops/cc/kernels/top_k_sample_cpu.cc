// Copyright 2026 The tfgc Authors.
//
// The CPU selection of Tfgc>TopKSample and Tfgc>TopKSampleWithResidual
// (top_k_sample_cpu.h), which reads the input once, whatever the data and
// `rounds` (PlanSelection says why this is exact): one pass
// (top_k_sample_cpu_scan.cc), in chunks that stay in L1, computes the
// statistics (sum, max and count of the finite keys; trimmed top-k needs
// none), writes acc = gradient + residual in the residual variant, and
// compacts every element whose key is at least a floor taken from a sample
// of 64 Ki keys (value and index, in index order). Then the order
// statistics come from the candidates (two 11-bit histogram levels, then
// nth_element in one small bucket), the bisection runs on them without
// touching the data, and the selection is written from the candidates.
// When mstopk's lo threshold lies below the floor (a coarse grid, as with
// one huge outlier), its band is counted per span in one more pass and the
// band slice read from the input; when threshold's lo does, the keys
// above lo, its selection, are compacted in one more pass; otherwise only
// when the sample misleads is the compaction repeated at a lower floor.
// Every full pass, and each pass over the candidates that the order
// statistics make, is split into fixed blocks run on the intra-op thread
// pool, and every result is exactly the one of the pure-TF reference.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/top_k_sample_cpu.h"
#include "custom_ops/cc/kernels/top_k_sample_common.h"

namespace tfgc {
namespace cpu {
namespace {

// Whether `key` passes threshold key `t`: key >= t, or key > t when kStrict.
template <bool kStrict>
inline bool Passes(uint32_t key, uint32_t t) {
  return kStrict ? key > t : key >= t;
}

// The digit of `h`, searched from the top, that holds the r-th largest
// count; `*r` becomes the rank inside it.
int FindDigit(const DigitHist& h, int64_t* r) {
  int d = static_cast<int>(h.size()) - 1;
  while (h[d] < *r) *r -= h[d--];  // the counts add up to at least r
  return d;
}

// The r-th largest (1 <= r <= keys.size()) of `keys`, whose top-digit
// histogram is `top`, for each r of `ranks`: the top digit from `top`, the
// next 11 bits from one histogram pass over the keys, then nth_element
// among the few keys that share both digits, gathered in one more pass per
// distinct digit pair. The histogram pass runs in fixed blocks on the
// intra-op thread pool.
template <size_t kRanks>
std::array<uint32_t, kRanks> KthLargest(OpKernelContext* ctx,
                                        const std::vector<uint32_t>& keys,
                                        const DigitHist& top,
                                        std::array<int64_t, kRanks> ranks,
                                        std::vector<uint32_t>* bucket) {
  constexpr int kNextShift = kTopShift - 11;
  const Blocks blocks(static_cast<int64_t>(keys.size()), NumThreads(ctx));
  std::array<uint32_t, kRanks> digit;
  for (size_t j = 0; j < kRanks; ++j) digit[j] = FindDigit(top, &ranks[j]);
  std::vector<std::array<DigitHist, kRanks>> block_next(blocks.count());
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    std::array<DigitHist, kRanks>& next = block_next[b];
    for (size_t j = 0; j < kRanks; ++j) {
      if (j > 0 && digit[j] == digit[j - 1]) {
        next[j] = next[j - 1];
        continue;
      }
      next[j].fill(0);
      AddDigits(keys.data() + blocks.begin(b), blocks.end(b) - blocks.begin(b),
                kNextShift, digit[j], &next[j]);
    }
  });
  std::array<uint32_t, kRanks> prefix;
  for (size_t j = 0; j < kRanks; ++j) {
    DigitHist next{};
    for (const auto& part : block_next) {
      for (size_t d = 0; d < next.size(); ++d) next[d] += part[j][d];
    }
    prefix[j] = digit[j] << 11 | FindDigit(next, &ranks[j]);
  }
  // The keys of each prefix, gathered serially into the kept bucket:
  // gathering in the blocks (each into a buffer of its own, or straight
  // into a bucket sized from the histograms) left 40-60 MB more with the
  // process after a call that made every element a candidate (glibc kept
  // it; test_candidates_are_not_kept_after_a_huge_call). Ranks increase,
  // so equal prefixes are adjacent, and a rank whose prefix is the one
  // before's reads the same bucket.
  std::array<uint32_t, kRanks> out;
  for (size_t j = 0; j < kRanks; ++j) {
    if (j == 0 || prefix[j] != prefix[j - 1]) {
      bucket->clear();
      for (uint32_t u : keys) {
        if ((u >> kNextShift) == prefix[j]) bucket->push_back(u);
      }
    }
    const auto nth = bucket->begin() + (ranks[j] - 1);
    std::nth_element(bucket->begin(), nth, bucket->end(),
                     [](uint32_t a, uint32_t b) { return a > b; });
    out[j] = *nth;
  }
  return out;
}

// The keys that predict where to compact (ForEachSampled).
template <typename T>
void DrawSample(const TopKSampleInput<T>& x, Candidates* cand) {
  std::vector<uint32_t>& sample = cand->sample;
  sample.clear();
  ForEachSampled(x.n, [&](int64_t i) { sample.push_back(KeyOf(x.Score(i))); });
  cand->sample_top.fill(0);
  AddDigits(sample.data(), static_cast<int64_t>(sample.size()), kTopShift, 0,
            &cand->sample_top);
}

// A key that the r-th largest key of the n-element input reaches, judged
// from the sample: the sample's key of rank SampleRank(n, m, r) (m sampled
// keys), so exact when the sample is the whole input and lower with high
// probability otherwise. 0 when the sample cannot tell; kNoRank when r > n.
int64_t LowerBoundOfRank(OpKernelContext* ctx, int64_t n, int64_t r,
                         Candidates* cand) {
  if (r > n) return kNoRank;
  const auto m = static_cast<int64_t>(cand->sample.size());
  const int64_t rank = SampleRank(n, m, r);
  if (rank > m) return 0;
  return KthLargest<1>(ctx, cand->sample, cand->sample_top, {rank},
                       &cand->bucket)[0];
}

// Numbers of candidate keys >= a (> a when strict) and >= b.
std::array<int64_t, 2> CountCandidates(const Candidates& cand, uint32_t a,
                                       bool strict, uint32_t b) {
  std::array<int64_t, 2> c = {0, 0};
  for (uint32_t u : cand.keys) {
    c[0] += strict ? u > a : u >= a;
    c[1] += u >= b;
  }
  return c;
}

// Keeps, in order, the candidates whose key is >= thr (> thr when kStrict).
template <bool kStrict>
void Prune(uint32_t thr, Candidates* cand) {
  const auto n = static_cast<int64_t>(cand->value.size());
  float* v = cand->value.data();
  int32_t* idx = cand->index.data();
  uint32_t* key = cand->keys.data();
  int64_t out = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = key[i];
    v[out] = v[i];
    idx[out] = idx[i];
    key[out] = a;
    out += Passes<kStrict>(a, thr);
  }
  cand->value.resize(out);
  cand->index.resize(out);
  cand->keys.resize(out);
}

// Exact top-k of the candidates, which hold every key >= the k-th largest.
SelectionPlan ExactTopK(OpKernelContext* ctx, Candidates* cand, int64_t k) {
  const uint32_t v =
      KthLargest<1>(ctx, cand->keys, cand->keys_top, {k}, &cand->bucket)[0];
  return ExactPlan(v, CountCandidates(*cand, v, true, 0)[0], k);
}

// The share of the sampled keys that are >= floor.
double SampledShare(const Candidates& cand, int64_t floor) {
  int64_t passing = 0;
  for (uint32_t u : cand.sample) passing += u >= floor;
  return static_cast<double>(passing) /
         static_cast<double>(std::max<size_t>(1, cand.sample.size()));
}

}  // namespace

int64_t SampleRank(int64_t n, int64_t m, int64_t r) {
  if (m >= n) return r;
  const double expect = static_cast<double>(r) * m / n;
  return static_cast<int64_t>(
      std::ceil(expect + 4.0 * std::sqrt(expect) + 8.0));
}

uint32_t KthLargestKey(OpKernelContext* ctx, const std::vector<uint32_t>& keys,
                       const DigitHist& top, int64_t r,
                       std::vector<uint32_t>* bucket) {
  return KthLargest<1>(ctx, keys, top, {r}, bucket)[0];
}

// The selection of every mode rests on order statistics: trimmed top-k on
// the k-th largest key, and the bisections of mstopk and threshold, which
// BisectByOrder runs from the (k+1)-th and 2k-th largest keys, then on the
// counts at its final thresholds. So one pass over the input computes the
// statistics (not needed by trimmed top-k) and compacts every element whose
// key is at least a floor F, and the rest runs on the candidates:
//   - an order statistic of rank r is exact when at least r keys are
//     candidates; otherwise it is below F, which decides every comparison
//     with a threshold t >= F as well;
//   - the bisection's selection takes the keys >= its final lo threshold
//     (when mstopk has none, its band is every key below the hi threshold,
//     which WriteWholeBand reads straight from the input).
// F is the sample's lower bound of the largest rank the mode reads (but
// above 0: gradients may be mostly zeros). The lo threshold lies within one
// step of the bisection's grid, diff 2^-rounds, below the (k+1)-th key, so
// on most data the candidates hold it too. When mstopk's lo threshold lies
// below F (a coarse grid, as with one huge outlier), one counting pass per
// span of the input replaces a compaction of the band, and the band slice
// is read from the span where it starts (only `need` band keys are
// selected, however many the band holds). When threshold's lo lies below
// F, its selection, every key > lo, is compacted in one more pass. When the
// candidates cannot decide a comparison (a misleading sample), the
// compaction is repeated at a lower F, at worst 0 (every element).
template <typename T>
SelectionPlan PlanSelection(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                            int64_t k, TopKSampleMode mode, int rounds,
                            int64_t seed, Candidates* cand) {
  const int64_t n = in.n;
  if (k == 0) {
    if (in.residual != nullptr) {
      Compact(ctx, in, false, kNoKey, 0.0, /*gather=*/false, cand);
    }
    return SelectionPlan();
  }
  const bool trimmed = mode == TopKSampleMode::kTrimmed;
  const bool strict = mode == TopKSampleMode::kThreshold;
  cand->band_in_input = false;
  DrawSample(in, cand);
  // The largest rank the mode reads. Zeros are candidates only when the
  // selection turns out to need them.
  const int64_t top_rank =
      std::min(n, trimmed ? k : (strict && 2 * k <= n ? 2 * k : k + 1));
  int64_t floor =
      std::max<int64_t>(1, LowerBoundOfRank(ctx, n, top_rank, cand));
  const Stats st = Compact(ctx, in, !trimmed, static_cast<uint32_t>(floor),
                           SampledShare(*cand, floor), /*gather=*/true, cand);
  TopKSampleInput<T> data = in;  // acc, once written, with the weights
  data.x = in.data();
  data.residual = nullptr;
  data.acc = nullptr;
  for (;; Compact(ctx, data, false, static_cast<uint32_t>(floor),
                  SampledShare(*cand, floor), /*gather=*/true, cand)) {
    const auto size = static_cast<int64_t>(cand->keys.size());
    // Every rank <= n is a candidate at floor 0, so the loop ends there.
    if (trimmed) {
      if (size >= k) return ExactTopK(ctx, cand, k);
      floor = 0;
      continue;
    }
    // The (k+1)-th and 2k-th largest keys (mstopk reads only the first):
    // exact when candidates, kNoRank beyond n, else below the floor, which
    // floor - 1 stands for.
    const std::array<int64_t, 2> ranks = {k + 1, strict ? 2 * k : k + 1};
    std::array<int64_t, 2> v = {kNoRank, kNoRank};
    bool exact = true;
    if (size > 0) {
      const auto kth = KthLargest<2>(
          ctx, cand->keys, cand->keys_top,
          {std::min(ranks[0], size), std::min(ranks[1], size)}, &cand->bucket);
      for (int j = 0; j < 2; ++j) {
        if (ranks[j] <= size) v[j] = kth[j];
      }
    }
    for (int j = 0; j < 2; ++j) {
      if (ranks[j] <= n && ranks[j] > size) {
        v[j] = floor - 1;
        exact = false;
      }
    }
    if (!strict) v[1] = kNoRank;
    const BisectionEnd e =
        BisectByOrder(mode, st.mean, st.diff, rounds, v[0], v[1]);
    if (!exact && e.lowest < floor) {  // a comparison it could not decide
      floor = e.lowest;
      continue;
    }
    if (e.has_lo && e.lo < floor && !strict) {
      // mstopk's band reaches below the candidates. It selects only `need`
      // band keys, however many the band holds, so count the band per
      // span instead of compacting it; Write reads the slice from the span
      // where it starts. hi > v1 >= floor (v1 is exact here), so the
      // candidates hold every key above the band.
      const uint32_t hi = e.has_hi ? e.hi : kNoKey;
      CountKeysInRange(ctx, data.x, n, e.lo, hi, &cand->band_counts);
      int64_t band = 0;
      for (int64_t c : cand->band_counts) band += c;
      const int64_t above = CountCandidates(*cand, hi, false, 0)[0];
      cand->band_in_input = true;
      return MsTopKPlan(e, above, above + band, n, k, seed);
    }
    if (e.has_lo && e.lo < floor) {
      // threshold selects every key > lo. Its bisection is final: lo was
      // visited, so no rank was below the floor (see above). Compacting
      // those keys compacts the selection, which WriteSelection takes from
      // the compaction's blocks as it is.
      const uint32_t above_lo = e.lo + 1;
      Compact(ctx, data, false, above_lo, SampledShare(*cand, above_lo),
              /*gather=*/false, cand);
      return ThresholdPlan(e, cand->PartOffsets().back());
    }
    if (!e.has_lo && strict && size < k) {  // the exact top-k fallback
      floor = 0;
      continue;
    }
    if (strict) {
      if (!e.has_lo) return ExactTopK(ctx, cand, k);
      return ThresholdPlan(e, CountCandidates(*cand, e.lo, true, 0)[0]);
    }
    const auto c = CountCandidates(*cand, e.has_hi ? e.hi : kNoKey, false,
                                   e.has_lo ? e.lo : 0);
    return MsTopKPlan(e, c[0], e.has_lo ? c[1] : n, n, k, seed);
  }
}

namespace {

// Where the selection goes, in index order.
template <typename T>
struct Output {
  const T* x;
  T* values;
  int32_t* indices;
  T* zero;  // where selected entries are zeroed, if anywhere
  bool scored;  // candidates hold scores, not values: values come from x
  int64_t size = 0;

  // Element i, whose value (or, `scored`, score) is v (float holds every T
  // value exactly; not always a NaN's payload), as output entry `at`.
  void Put(int64_t at, int64_t i, float v) {
    values[at] = scored || std::isnan(v) ? x[i] : static_cast<T>(v);
    indices[at] = static_cast<int32_t>(i);
    if (zero != nullptr) zero[i] = static_cast<T>(0.0f);
  }
  void Take(int64_t i, float v) { Put(size++, i, v); }
  void Take(int64_t i) { Take(i, static_cast<float>(x[i])); }
  absl::Status Check(const SelectionPlan& p, int64_t candidates) const {
    if (size == p.output_size) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(
        "TopKSample selected ", size, " elements but planned ",
        p.output_size, " (candidates=", candidates, ", need=", p.need,
        ", start=", p.start, ")"));
  }
};

// Writes mstopk's selection when its band has no lower end (no count was
// above k): the candidates above the plan, which hold every key >= `above`,
// and the band slice, ranks [start, start + need) of the elements below
// `above` in index order. Between two elements above, the band is a run of
// consecutive indices, so the slice is read straight from the input.
template <typename T>
absl::Status WriteWholeBand(int64_t n, const SelectionPlan& p,
                            const Candidates& cand, Output<T>* out) {
  const int64_t band_end = p.start + p.need;
  const auto size = static_cast<int64_t>(cand.keys.size());
  int64_t band_rank = 0;  // of element `next`
  int64_t next = 0;       // the first index not yet passed
  for (int64_t c = 0; c <= size; ++c) {
    if (c < size && !IsAbove(p, cand.keys[c])) continue;
    const int64_t above = c < size ? cand.index[c] : n;
    const int64_t run_end = band_rank + (above - next);
    for (int64_t r = std::max(band_rank, p.start);
         r < std::min(run_end, band_end); ++r) {
      out->Take(next + (r - band_rank));
    }
    band_rank = run_end;
    if (c < size) out->Take(above, cand.value[c]);
    next = above + 1;
  }
  return out->Check(p, size);
}

// Writes mstopk's selection when its band reaches below the candidates
// (Candidates::band_in_input): the candidates above the band and the band
// slice, ranks [start, start + need) of the keys in [band_lo, above) in
// index order, read from the input from the span where rank `start` lies;
// the two merged in index order.
template <typename T>
absl::Status WriteBandSlice(int64_t n, const SelectionPlan& p,
                            const Candidates& cand, Output<T>* out) {
  const uint32_t hi = p.has_above ? p.above : kNoKey;
  int64_t span = 0;
  int64_t rank = 0;  // of the first band key of span `span`
  const auto spans = static_cast<int64_t>(cand.band_counts.size());
  while (span < spans && rank + cand.band_counts[span] <= p.start) {
    rank += cand.band_counts[span++];
  }
  std::vector<int32_t> slice;  // the band slice's indices, increasing
  RangeSlice(out->x, span * kSpan, n, p.band_lo, hi, p.start - rank, p.need,
             &slice);
  const auto size = static_cast<int64_t>(cand.keys.size());
  int64_t c = 0;
  for (const int32_t i : slice) {
    for (; c < size && cand.index[c] < i; ++c) {
      if (IsAbove(p, cand.keys[c])) out->Take(cand.index[c], cand.value[c]);
    }
    out->Take(i);
  }
  for (; c < size; ++c) {
    if (IsAbove(p, cand.keys[c])) out->Take(cand.index[c], cand.value[c]);
  }
  return out->Check(p, size);
}

// Writes every candidate, left in the compaction's blocks
// (Candidates::in_parts): each block's at its offset, blocks in parallel.
template <typename T>
absl::Status WriteParts(OpKernelContext* ctx, const SelectionPlan& p,
                        const Candidates& cand, Output<T>* out) {
  const std::vector<int64_t> offsets = cand.PartOffsets();
  out->size = offsets.back();
  if (out->size != p.output_size) return out->Check(p, out->size);
  const Blocks blocks(cand.parts_used, NumThreads(ctx), /*min_block=*/1);
  ForEachBlock(ctx, blocks, [&](int64_t bb) {
    for (int64_t b = blocks.begin(bb); b < blocks.end(bb); ++b) {
      const CandidateBuffer& part = cand.parts[b];
      for (int64_t c = 0; c < part.size; ++c) {
        out->Put(offsets[b] + c, part.index[c], part.value[c]);
      }
    }
  });
  return absl::OkStatus();
}

// Writes the plan's selection from the candidates, in index order.
template <typename T>
absl::Status Write(OpKernelContext* ctx, int64_t n, const SelectionPlan& p,
                   Candidates* cand_p, Output<T>* out) {
  if (cand_p->in_parts) return WriteParts(ctx, p, *cand_p, out);
  if (cand_p->band_in_input) return WriteBandSlice(n, p, *cand_p, out);
  if (!p.has_band_lo && p.need > 0) {
    return WriteWholeBand(n, p, *cand_p, out);
  }
  if (static_cast<int64_t>(cand_p->keys.size()) == p.output_size) {
    // The candidates hold the selection, so they are the selection.
    const Candidates& cand = *cand_p;
    for (int64_t c = 0; c < p.output_size; ++c) {
      out->Take(cand.index[c], cand.value[c]);
    }
    return out->Check(p, p.output_size);
  }
  // Everything selected lies in the band or above it (strictly above
  // `above` when the band is empty): drop the rest first, branch-free.
  if (p.has_band_lo) {
    Prune<false>(p.band_lo, cand_p);
  } else if (p.above_strict) {
    Prune<true>(p.above, cand_p);
  } else {
    Prune<false>(p.above, cand_p);
  }
  const Candidates& cand = *cand_p;
  int64_t band_rank = 0;
  const int64_t band_end = p.start + p.need;
  const auto size = static_cast<int64_t>(cand.keys.size());
  for (int64_t c = 0; c < size && out->size < p.output_size; ++c) {
    bool take = IsAbove(p, cand.keys[c]);
    if (!take) {  // in the band
      take = band_rank >= p.start && band_rank < band_end;
      ++band_rank;
    }
    if (take) out->Take(cand.index[c], cand.value[c]);
  }
  return out->Check(p, size);
}

}  // namespace

template <typename T>
absl::Status WriteSelection(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                            const SelectionPlan& plan, Candidates* cand,
                            T* values, int32_t* indices) {
  Output<T> out{in.data(), values, indices, in.acc, in.weights != nullptr};
  return Write(ctx, in.n, plan, cand, &out);
}

#define TFGC_INSTANTIATE(T)                                                  \
  template SelectionPlan PlanSelection(OpKernelContext*,                     \
                                       const TopKSampleInput<T>&, int64_t,   \
                                       TopKSampleMode, int, int64_t,         \
                                       Candidates*);                         \
  template absl::Status WriteSelection(                                      \
      OpKernelContext*, const TopKSampleInput<T>&, const SelectionPlan&,     \
      Candidates*, T*, int32_t*);

TFGC_INSTANTIATE(float)
TFGC_INSTANTIATE(Eigen::half)
TFGC_INSTANTIATE(Eigen::bfloat16)

#undef TFGC_INSTANTIATE

}  // namespace cpu
}  // namespace tfgc
