// Copyright 2026 The tfgc Authors.
//
// CPU kernels of Tfgc>TopKSample and Tfgc>TopKSampleWithResidual (and the
// TensorFlow glue of their CUDA kernels when built with GOOGLE_CUDA).
//
// The CPU algorithm reads the input three times whatever `rounds` is:
//   1. statistics: sum, max and count of the finite keys (fused with
//      acc = gradient + residual in the residual variant);
//   2. a histogram of every key over the first min(rounds, 12) bisection
//      thresholds (a dyadic grid, or the five trimmed top-k ratios), which
//      answers those rounds exactly without reading the input again;
//   3. an ordered compaction of the candidates (keys at or above the lower
//      end of the bisection interval) into a small buffer;
// then the remaining rounds, and the final selection, run on the buffer.
// Every pass is split into fixed blocks run on the intra-op thread pool.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#include "unsupported/Eigen/CXX11/Tensor"
#endif

namespace tfgc {
namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;

constexpr int kMaxGridBits = 12;
constexpr float kMaxFloat = std::numeric_limits<float>::max();

template <typename T>
inline float Magnitude(T x) {
  return std::fabs(static_cast<float>(x));
}

// The key of the header: NaN maps to -1.
inline float KeyOf(float magnitude) {
  return std::isnan(magnitude) ? -1.0f : magnitude;
}

struct Stats {
  float mean = 0.0f;
  float max = 0.0f;
  float diff = 0.0f;
};

struct BlockStats {
  double sum = 0.0;
  float max = 0.0f;
  int64_t finite = 0;
};

template <typename T>
inline void Accumulate(const T* x, int64_t begin, int64_t end,
                       BlockStats* out) {
  double sum[4] = {0.0, 0.0, 0.0, 0.0};
  float mx = 0.0f;
  int64_t finite = 0;
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    for (int l = 0; l < 4; ++l) {
      const float a = Magnitude(x[i + l]);
      const bool ok = a <= kMaxFloat;
      sum[l] += ok ? a : 0.0f;
      mx = ok && a > mx ? a : mx;
      finite += ok;
    }
  }
  for (; i < end; ++i) {
    const float a = Magnitude(x[i]);
    const bool ok = a <= kMaxFloat;
    sum[0] += ok ? a : 0.0f;
    mx = ok && a > mx ? a : mx;
    finite += ok;
  }
  out->sum = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  out->max = mx;
  out->finite = finite;
}

Stats Combine(const std::vector<BlockStats>& parts) {
  double sum = 0.0;
  float mx = 0.0f;
  int64_t finite = 0;
  for (const BlockStats& p : parts) {
    sum += p.sum;
    mx = std::max(mx, p.max);
    finite += p.finite;
  }
  Stats s;
  if (finite > 0) {
    s.mean = static_cast<float>(sum / static_cast<double>(finite));
    s.max = mx;
  }
  s.diff = s.max - s.mean;
  return s;
}

template <typename T>
Stats ComputeStats(OpKernelContext* ctx, const T* x, int64_t n) {
  Blocks blocks(n, NumThreads(ctx));
  std::vector<BlockStats> parts(blocks.count());
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    Accumulate(x, blocks.begin(b), blocks.end(b), &parts[b]);
  });
  return Combine(parts);
}

// acc = gradient + residual (in T, as TensorFlow adds), then statistics.
template <typename T>
Stats AddAndComputeStats(OpKernelContext* ctx, const T* g, const T* r, T* acc,
                         int64_t n) {
  Blocks blocks(n, NumThreads(ctx));
  std::vector<BlockStats> parts(blocks.count());
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    const int64_t begin = blocks.begin(b);
    const int64_t end = blocks.end(b);
    // Add in chunks that stay in L1, then read them back for the stats.
    constexpr int64_t kChunk = 2048;
    BlockStats total;
    for (int64_t c = begin; c < end; c += kChunk) {
      const int64_t ce = std::min(end, c + kChunk);
      for (int64_t i = c; i < ce; ++i) acc[i] = static_cast<T>(g[i] + r[i]);
      BlockStats part;
      Accumulate(acc, c, ce, &part);
      total.sum += part.sum;
      total.max = std::max(total.max, part.max);
      total.finite += part.finite;
    }
    parts[b] = total;
  });
  return Combine(parts);
}

// Bins keys by ascending thresholds t[0..m-1]: bin(a) is how many of them
// `a` passes (a >= t, or a > t when kStrict). `scale` and `offset` give an
// approximate bin (a - mean) / diff * scale + offset that is checked against
// the thresholds and corrected, so the result is exact.
template <bool kStrict>
class Binner {
 public:
  Binner(const std::vector<float>& t, float mean, float diff, float scale,
         float offset)
      : t_(t),
        m_(static_cast<int>(t.size())),
        mean_(mean),
        inv_(diff > 0.0f ? scale / diff : 0.0f),
        offset_(offset) {}

  static bool Pass(float a, float t) { return kStrict ? a > t : a >= t; }

  int Bin(float a) const {
    if (!Pass(a, t_[0])) return 0;  // also NaN
    if (Pass(a, t_[m_ - 1])) return m_;
    // Here 1 <= bin <= m - 1.
    float f = (a - mean_) * inv_ + offset_;
    int j = f >= 1.0f ? (f < static_cast<float>(m_ - 1) ? static_cast<int>(f)
                                                        : m_ - 1)
                      : 1;
    if (Pass(a, t_[j - 1]) && !Pass(a, t_[j])) return j;
    int lo = 1, hi = m_ - 1;  // smallest j with !Pass(a, t[j])
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (Pass(a, t_[mid])) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  int m() const { return m_; }

 private:
  const std::vector<float>& t_;
  int m_;
  float mean_;
  float inv_;
  float offset_;
};

// counts[j] = number of keys passing t[j], and per-block counts of keys
// passing t[j] for the compaction offsets.
struct Histogram {
  std::vector<int64_t> counts;               // size m
  std::vector<std::vector<int64_t>> blocks;  // [block][bin], bins 0..m
};

template <typename T, bool kStrict>
Histogram BuildHistogram(OpKernelContext* ctx, const T* x, int64_t n,
                         const Binner<kStrict>& binner,
                         const Blocks& blocks) {
  const int m = binner.m();
  Histogram h;
  h.blocks.assign(blocks.count(), std::vector<int64_t>(m + 1, 0));
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    std::vector<uint32_t> local(m + 1, 0);
    const int64_t end = blocks.end(b);
    for (int64_t i = blocks.begin(b); i < end; ++i) {
      ++local[binner.Bin(Magnitude(x[i]))];
    }
    for (int j = 0; j <= m; ++j) h.blocks[b][j] = local[j];
  });
  std::vector<int64_t> bins(m + 1, 0);
  for (const auto& blk : h.blocks) {
    for (int j = 0; j <= m; ++j) bins[j] += blk[j];
  }
  h.counts.assign(m, 0);
  int64_t above = 0;
  for (int j = m - 1; j >= 0; --j) {
    above += bins[j + 1];
    h.counts[j] = above;
  }
  return h;
}

struct Candidates {
  std::vector<float> key;
  std::vector<int32_t> index;
};

// Copies, in index order, every element whose bin exceeds `min_bin` (all of
// them when min_bin < 0): only `Pass(a, t[min_bin])` is evaluated.
template <typename T, bool kStrict>
void Compact(OpKernelContext* ctx, const T* x, const Histogram& h,
             const std::vector<float>& t, int min_bin, const Blocks& blocks,
             Candidates* out) {
  std::vector<int64_t> offsets(blocks.count() + 1, 0);
  for (int64_t b = 0; b < blocks.count(); ++b) {
    int64_t c = 0;
    const auto& blk = h.blocks[b];
    for (size_t j = min_bin + 1; j < blk.size(); ++j) c += blk[j];
    offsets[b + 1] = offsets[b] + c;
  }
  out->key.resize(offsets.back());
  out->index.resize(offsets.back());
  const float thr = min_bin >= 0 ? t[min_bin] : 0.0f;
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t o = offsets[b];
    const int64_t end = blocks.end(b);
    float* key = out->key.data();
    int32_t* index = out->index.data();
    if (min_bin < 0) {
      for (int64_t i = blocks.begin(b); i < end; ++i, ++o) {
        key[o] = KeyOf(Magnitude(x[i]));
        index[o] = static_cast<int32_t>(i);
      }
      return;
    }
    for (int64_t i = blocks.begin(b); i < end; ++i) {
      const float a = Magnitude(x[i]);
      if (Binner<kStrict>::Pass(a, thr)) {
        key[o] = a;
        index[o] = static_cast<int32_t>(i);
        ++o;
      }
    }
  });
}

// Number of candidate keys >= thr (> thr when kStrict).
template <bool kStrict>
int64_t CountPassing(OpKernelContext* ctx, const std::vector<float>& key,
                     float thr) {
  const int64_t n = static_cast<int64_t>(key.size());
  Blocks blocks(n, NumThreads(ctx), int64_t{1} << 16);
  std::vector<int64_t> part(blocks.count(), 0);
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t c = 0;
    const int64_t end = blocks.end(b);
    for (int64_t i = blocks.begin(b); i < end; ++i) {
      c += Binner<kStrict>::Pass(key[i], thr);
    }
    part[b] = c;
  });
  int64_t total = 0;
  for (int64_t c : part) total += c;
  return total;
}

// Exact top-k of the candidates (which hold every key >= the k-th largest).
SelectionPlan ExactTopK(const Candidates& cand, int64_t k) {
  std::vector<float> keys(cand.key);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(),
                   [](float a, float b) { return a > b; });
  const float v = keys[k - 1];
  int64_t greater = 0;
  for (float a : cand.key) greater += a > v;
  return ExactPlan(v, greater, k);
}

// Bisection over the dyadic grid of the first min(rounds, 12) rounds, then on
// the candidates. Returns the plan; `cand` holds the candidates.
template <typename T, bool kStrict>
SelectionPlan BisectionPlan(OpKernelContext* ctx, const T* x, int64_t n,
                            int64_t k, TopKSampleMode mode, int rounds,
                            int64_t seed, const Stats& st, Candidates* cand) {
  const int bits = std::min(rounds, kMaxGridBits);
  const int grid = 1 << bits;
  std::vector<float> t(grid - 1);
  for (int j = 0; j < grid - 1; ++j) {
    t[j] = Threshold(st.mean, st.diff,
                     static_cast<float>(j + 1) / static_cast<float>(grid));
  }
  Binner<kStrict> binner(t, st.mean, st.diff, static_cast<float>(grid), 0.0f);
  Blocks blocks(n, NumThreads(ctx));
  Histogram h = BuildHistogram<T, kStrict>(ctx, x, n, binner, blocks);

  Bisection bis(mode, k, st.mean, st.diff);
  int round = 0;
  for (; round < bits && !bis.accepted(); ++round) {
    const int j = static_cast<int>(bis.NextRatio() * grid) - 1;
    bis.Update(h.counts[j]);
  }
  const int min_bin = bis.lo_ratio() > 0.0f
                          ? static_cast<int>(bis.lo_ratio() * grid) - 1
                          : -1;
  Compact<T, kStrict>(ctx, x, h, t, min_bin, blocks, cand);
  for (; round < rounds && !bis.accepted(); ++round) {
    const float thr = bis.NextThreshold();
    bis.Update(CountPassing<kStrict>(ctx, cand->key, thr));
  }
  if (mode == TopKSampleMode::kMsTopK) return MsTopKPlan(bis, n, k, seed);
  if (bis.has_lo()) return ThresholdPlan(bis);
  return ExactTopK(*cand, k);  // no count above k: candidates are everything
}

// Trimmed top-k: the highest of the ratios 0.8, 0.6, ..., 0 whose threshold
// more than k keys exceed bounds the candidates; exact top-k among them.
template <typename T>
SelectionPlan TrimmedPlan(OpKernelContext* ctx, const T* x, int64_t n,
                          int64_t k, const Stats& st, Candidates* cand) {
  std::vector<float> t(kTrimmedSteps);
  for (int j = 0; j < kTrimmedSteps; ++j) {
    t[j] = Threshold(st.mean, st.diff, kTrimmedRatios[kTrimmedSteps - 1 - j]);
  }
  Binner<true> binner(t, st.mean, st.diff, 5.0f, 1.0f);
  Blocks blocks(n, NumThreads(ctx));
  Histogram h = BuildHistogram<T, true>(ctx, x, n, binner, blocks);
  int min_bin = -1;
  for (int j = kTrimmedSteps - 1; j >= 0; --j) {
    if (h.counts[j] >= k) {
      min_bin = j;
      break;
    }
  }
  Compact<T, true>(ctx, x, h, t, min_bin, blocks, cand);
  return ExactTopK(*cand, k);
}

template <typename T>
SelectionPlan PlanCpu(OpKernelContext* ctx, const T* x, int64_t n, int64_t k,
                      TopKSampleMode mode, int rounds, int64_t seed,
                      const Stats& st, Candidates* cand) {
  switch (mode) {
    case TopKSampleMode::kMsTopK:
      return BisectionPlan<T, false>(ctx, x, n, k, mode, rounds, seed, st,
                                     cand);
    case TopKSampleMode::kThreshold:
      return BisectionPlan<T, true>(ctx, x, n, k, mode, rounds, seed, st,
                                    cand);
    case TopKSampleMode::kTrimmed:
      return TrimmedPlan<T>(ctx, x, n, k, st, cand);
  }
  return SelectionPlan();
}

// Writes the plan's selection from the candidates, in index order.
template <typename T>
absl::Status Extract(const T* x, const Candidates& cand,
                     const SelectionPlan& p, T* values, int32_t* indices,
                     T* zero) {
  int64_t out = 0;
  int64_t band_rank = 0;
  const int64_t band_end = p.start + p.need;
  const int64_t size = static_cast<int64_t>(cand.key.size());
  for (int64_t c = 0; c < size; ++c) {
    const float a = cand.key[c];
    bool take;
    if (IsAbove(p, a)) {
      take = true;
    } else if (!p.has_band_lo || a >= p.band_lo) {
      take = band_rank >= p.start && band_rank < band_end;
      ++band_rank;
    } else {
      take = false;
    }
    if (take) {
      if (out >= p.output_size) break;
      const int32_t i = cand.index[c];
      values[out] = x[i];
      indices[out] = i;
      if (zero != nullptr) zero[i] = static_cast<T>(0.0f);
      ++out;
    }
  }
  if (out != p.output_size) {
    return absl::InternalError(absl::StrCat(
        "TopKSample selected ", out, " elements but planned ", p.output_size,
        " (candidates=", size, ", need=", p.need, ", start=", p.start, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseMode(const std::string& s, TopKSampleMode* mode) {
  if (s == "mstopk") {
    *mode = TopKSampleMode::kMsTopK;
  } else if (s == "threshold") {
    *mode = TopKSampleMode::kThreshold;
  } else if (s == "trimmed") {
    *mode = TopKSampleMode::kTrimmed;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "`mode` must be one of mstopk, threshold, trimmed. Received: mode=",
        s));
  }
  return absl::OkStatus();
}

// Validates k and seed against n and reads them.
template <typename Tk>
absl::Status ValidateArgs(int64_t n, const Tensor& k_t, const Tensor& seed_t,
                          int64_t* k, int64_t* seed) {
  if (!TensorShapeUtils::IsScalar(k_t.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`k` must be a scalar. Received: shape=", k_t.shape().DebugString()));
  }
  if (!TensorShapeUtils::IsScalar(seed_t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("`seed` must be a scalar. Received: shape=",
                     seed_t.shape().DebugString()));
  }
  if (n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TopKSample supports at most 2^31 - 1 elements (int32 indices). "
        "Received: n=",
        n));
  }
  *k = static_cast<int64_t>(k_t.scalar<Tk>()());
  if (*k < 0 || *k > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`k` must be in [0, n]. Received: k=", *k, ", n=", n));
  }
  *seed = seed_t.scalar<int64_t>()();
  return absl::OkStatus();
}

template <typename T, typename Tk>
class TopKSampleOp : public OpKernel {
 public:
  explicit TopKSampleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string mode;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mode", &mode));
    OP_REQUIRES_OK(ctx, ParseMode(mode, &mode_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounds", &rounds_));
    OP_REQUIRES(ctx, rounds_ >= 1 && rounds_ <= 64,
                absl::InvalidArgumentError(absl::StrCat(
                    "`rounds` must be in [1, 64]. Received: rounds=",
                    rounds_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const int64_t n = x.NumElements();
    int64_t k = 0, seed = 0;
    OP_REQUIRES_OK(ctx, ValidateArgs<Tk>(n, ctx->input(1), ctx->input(2), &k,
                                         &seed));
    const T* xp = x.flat<T>().data();
    Candidates cand;
    SelectionPlan plan;
    if (k > 0) {
      const Stats st = ComputeStats(ctx, xp, n);
      plan = PlanCpu(ctx, xp, n, k, mode_, rounds_, seed, st, &cand);
    }
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({plan.output_size}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({plan.output_size}), &indices));
    if (plan.output_size == 0) return;
    OP_REQUIRES_OK(ctx, Extract(xp, cand, plan, values->flat<T>().data(),
                                indices->flat<int32_t>().data(),
                                static_cast<T*>(nullptr)));
  }

 private:
  TopKSampleMode mode_;
  int rounds_;
};

template <typename T, typename Tk>
class TopKSampleWithResidualOp : public OpKernel {
 public:
  explicit TopKSampleWithResidualOp(OpKernelConstruction* ctx)
      : OpKernel(ctx) {
    std::string mode;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mode", &mode));
    OP_REQUIRES_OK(ctx, ParseMode(mode, &mode_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounds", &rounds_));
    OP_REQUIRES(ctx, rounds_ >= 1 && rounds_ <= 64,
                absl::InvalidArgumentError(absl::StrCat(
                    "`rounds` must be in [1, 64]. Received: rounds=",
                    rounds_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& g = ctx->input(0);
    const Tensor& r = ctx->input(1);
    OP_REQUIRES(ctx, g.shape() == r.shape(),
                absl::InvalidArgumentError(absl::StrCat(
                    "`gradient` and `residual` must have the same shape. "
                    "Received: gradient.shape=",
                    g.shape().DebugString(),
                    ", residual.shape=", r.shape().DebugString())));
    const int64_t n = g.NumElements();
    int64_t k = 0, seed = 0;
    OP_REQUIRES_OK(ctx, ValidateArgs<Tk>(n, ctx->input(2), ctx->input(3), &k,
                                         &seed));
    Tensor* acc = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->forward_input_or_allocate_output({1}, 2, r.shape(), &acc));
    T* accp = acc->flat<T>().data();
    const Stats st = AddAndComputeStats(ctx, g.flat<T>().data(),
                                        r.flat<T>().data(), accp, n);
    Candidates cand;
    SelectionPlan plan;
    if (k > 0) plan = PlanCpu(ctx, accp, n, k, mode_, rounds_, seed, st, &cand);
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({plan.output_size}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({plan.output_size}), &indices));
    if (plan.output_size == 0) return;
    OP_REQUIRES_OK(ctx, Extract(accp, cand, plan, values->flat<T>().data(),
                                indices->flat<int32_t>().data(), accp));
  }

 private:
  TopKSampleMode mode_;
  int rounds_;
};

#define REGISTER_CPU(T, Tk)                                        \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSample")                  \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tk>("Tk"),           \
                          TopKSampleOp<T, Tk>);                    \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleWithResidual")      \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tk>("Tk"),           \
                          TopKSampleWithResidualOp<T, Tk>);

#define REGISTER_CPU_ALL_K(T) \
  REGISTER_CPU(T, int32_t)    \
  REGISTER_CPU(T, int64_t)

REGISTER_CPU_ALL_K(float)
REGISTER_CPU_ALL_K(Eigen::half)
REGISTER_CPU_ALL_K(Eigen::bfloat16)

#undef REGISTER_CPU_ALL_K
#undef REGISTER_CPU

}  // namespace
}  // namespace tfgc
