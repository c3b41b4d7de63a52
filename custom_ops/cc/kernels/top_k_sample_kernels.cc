// Copyright 2026 The tfgc Authors.
//
// The op kernels of Tfgc>TopKSample, Tfgc>TopKSampleWithResidual and
// Tfgc>TopKRatioWithResidual, each a class template over the device: it validates the attributes and inputs,
// allocates the outputs and has functor::TopKSample<Device, T>
// (top_k_sample_kernels.h) plan and write the selection. The CPU functor
// runs the selection of top_k_sample_cpu.h; under GOOGLE_CUDA the GPU
// functor calls the typed launchers of top_k_sample_gpu.h. The segmented
// ops (Tfgc>TopKSampleSegments and ...WithResidual) follow the same pattern
// with functor::TopKSampleSegments<Device, T>: on the CPU one selection per
// segment in turn, on the GPU the segmented launchers (one plan, one
// output-size read and one write for every segment at once).

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/top_k_sample_common.h"
#include "custom_ops/cc/kernels/top_k_sample_cpu.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"

#if GOOGLE_CUDA
#include "custom_ops/cc/kernels/top_k_sample_gpu.h"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace functor {

// The CPU selection of top_k_sample_cpu.h, its passes on the intra-op
// thread pool.
template <typename T>
class TopKSample<CPUDevice, T> {
 public:
  using Cache = cpu::CandidateCache;  // the candidates' buffers

  explicit TopKSample(Cache* cache) : lease_(cache) {}

  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    int64_t k, TopKSampleMode mode, int rounds, int64_t seed,
                    int64_t* output_size) {
    plan_ = cpu::PlanSelection(ctx, in, k, mode, rounds, seed, lease_.get());
    *output_size = plan_.output_size;
    return absl::OkStatus();
  }

  absl::Status Write(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                     int64_t /*output_size*/, T* values, int32_t* indices) {
    return cpu::WriteSelection(ctx, in, plan_, lease_.get(), values, indices);
  }

 private:
  Cache::Lease lease_;  // the candidates the plan selects from
  SelectionPlan plan_;
};

// The segment `seg` of `in`, as the input of a single selection.
template <typename T>
TopKSampleInput<T> SegmentOf(const TopKSampleInput<T>& in,
                             const TopKSampleSegment& seg) {
  TopKSampleInput<T> part{in.x + seg.offset, nullptr, nullptr, seg.n};
  if (in.residual != nullptr) {
    part.residual = in.residual + seg.offset;
    part.acc = in.acc + seg.offset;
  }
  return part;
}

// One segment after another, each with the single selection of
// top_k_sample_cpu.h (whose passes use the intra-op thread pool) and the
// same candidates. The candidates hold one plan at a time, and threshold
// mode's sizes are known only once every segment is planned, so Plan
// writes each selection to buffers of its own and Write copies them (the
// selections are small next to the input they are read from).
template <typename T>
class TopKSampleSegments<CPUDevice, T> {
 public:
  using Cache = cpu::CandidateCache;

  explicit TopKSampleSegments(Cache* cache) : lease_(cache) {}

  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    const std::vector<TopKSampleSegment>& segments,
                    TopKSampleMode mode, int rounds, int64_t* sizes) {
    for (size_t s = 0; s < segments.size(); ++s) {
      const TopKSampleSegment& seg = segments[s];
      const TopKSampleInput<T> part = SegmentOf(in, seg);
      const SelectionPlan plan = cpu::PlanSelection(
          ctx, part, seg.k, mode, rounds, seg.seed, lease_.get());
      sizes[s] = plan.output_size;
      if (plan.output_size == 0) continue;
      const size_t at = values_.size();
      values_.resize(at + plan.output_size);
      indices_.resize(at + plan.output_size);
      TF_RETURN_IF_ERROR(cpu::WriteSelection(ctx, part, plan, lease_.get(),
                                             values_.data() + at,
                                             indices_.data() + at));
    }
    return absl::OkStatus();
  }

  absl::Status Write(OpKernelContext* /*ctx*/, const TopKSampleInput<T>& /*in*/,
                     const std::vector<TopKSampleSegment>& /*segments*/,
                     int64_t output_size, T* values, int32_t* indices) {
    if (output_size != static_cast<int64_t>(values_.size())) {
      return absl::InternalError(absl::StrCat(
          "TopKSampleSegments wrote ", values_.size(),
          " elements but planned ", output_size));
    }
    std::copy(values_.begin(), values_.end(), values);
    std::copy(indices_.begin(), indices_.end(), indices);
    return absl::OkStatus();
  }

 private:
  Cache::Lease lease_;  // the candidates, one segment at a time
  std::vector<T> values_;
  std::vector<int32_t> indices_;
};

#if GOOGLE_CUDA
// The typed launchers of top_k_sample_gpu.h, which plan and write the
// selection on the op's stream; the host waits for the device only in
// threshold mode, whose output size depends on the data
// (TopKSampleOutputSize).
template <typename T>
class TopKSample<GPUDevice, T> {
 public:
  struct Cache {};  // nothing is kept between calls

  explicit TopKSample(Cache* /*cache*/) {}

  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    int64_t k, TopKSampleMode mode, int rounds, int64_t seed,
                    int64_t* output_size) {
    void* stream = StreamOf(ctx);
    if (in.weights != nullptr) return PlanRatio(ctx, in, k, output_size);
    if (in.residual != nullptr) {
      TF_RETURN_IF_ERROR(CudaStatus(
          gpu::AddResidual(ToCuda(in.x), ToCuda(in.residual), ToCuda(in.acc),
                           in.n, stream),
          "AddResidual"));
    }
    TF_RETURN_IF_ERROR(
        AllocateScratch(ctx, gpu::TopKSampleScratchBytes(in.n), &scratch_));
    TF_RETURN_IF_ERROR(
        CudaStatus(gpu::TopKSamplePlan(ToCuda(in.data()), in.n, k, mode,
                                       rounds, seed, Scratch(), stream),
                   "TopKSamplePlan"));
    return CudaStatus(gpu::TopKSampleOutputSize(mode, in.n, k, Scratch(),
                                                stream, output_size),
                      "TopKSampleOutputSize");
  }

  absl::Status Write(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                     int64_t output_size, T* values, int32_t* indices) {
    if (in.weights != nullptr) {
      return CudaStatus(
          gpu::TopKRatio(ToCuda(in.x), ToCuda(in.residual), ToCuda(in.weights),
                         in.floor, in.n, output_size, ToCuda(in.acc),
                         ToCuda(values), indices, Scratch(), StreamOf(ctx)),
          "TopKRatio");
    }
    return CudaStatus(
        gpu::TopKSampleWrite(ToCuda(in.data()), in.n, output_size,
                             ToCuda(values), indices, ToCuda(in.acc),
                             Scratch(), StreamOf(ctx)),
        "TopKSampleWrite");
  }

 private:
  void* Scratch() { return scratch_.flat<int8_t>().data(); }

  // With weights (TopKRatioWithResidual), one launcher in Write, once the
  // outputs are allocated; here only acc when nothing is selected.
  absl::Status PlanRatio(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                         int64_t k, int64_t* output_size) {
    *output_size = in.n > 0 ? k : 0;
    if (k > 0) {
      return AllocateScratch(ctx, gpu::TopKRatioScratchBytes(in.n, k),
                             &scratch_);
    }
    return CudaStatus(gpu::AddResidual(ToCuda(in.x), ToCuda(in.residual),
                                       ToCuda(in.acc), in.n, StreamOf(ctx)),
                      "AddResidual");
  }

  Tensor scratch_;  // the plan, from Plan to Write
};

// The segmented launchers of top_k_sample_gpu.h: one plan, one read of the
// output sizes and one write for all segments, whatever their number. The
// host waits for the device only in threshold mode, for all the sizes at
// once.
template <typename T>
class TopKSampleSegments<GPUDevice, T> {
 public:
  struct Cache {};  // nothing is kept between calls

  explicit TopKSampleSegments(Cache* /*cache*/) {}

  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    const std::vector<TopKSampleSegment>& segments,
                    TopKSampleMode mode, int rounds, int64_t* sizes) {
    void* stream = StreamOf(ctx);
    if (in.residual != nullptr) {
      TF_RETURN_IF_ERROR(CudaStatus(
          gpu::AddResidual(ToCuda(in.x), ToCuda(in.residual), ToCuda(in.acc),
                           in.n, stream),
          "AddResidual"));
    }
    const int count = static_cast<int>(segments.size());
    const int64_t bytes =
        gpu::TopKSampleSegmentsScratchBytes(segments.data(), count);
    if (bytes < 0) {  // the op kernel validated the table
      return absl::InternalError("TopKSampleSegments: invalid segment table");
    }
    TF_RETURN_IF_ERROR(AllocateScratch(ctx, bytes, &scratch_));
    TF_RETURN_IF_ERROR(CudaStatus(
        gpu::TopKSampleSegmentsPlan(ToCuda(in.data()), segments.data(), count,
                                    mode, rounds, Scratch(), stream),
        "TopKSampleSegmentsPlan"));
    return CudaStatus(
        gpu::TopKSampleSegmentsOutputSizes(mode, segments.data(), count,
                                           Scratch(), stream, sizes),
        "TopKSampleSegmentsOutputSizes");
  }

  absl::Status Write(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                     const std::vector<TopKSampleSegment>& segments,
                     int64_t output_size, T* values, int32_t* indices) {
    return CudaStatus(
        gpu::TopKSampleSegmentsWrite(
            ToCuda(in.data()), segments.data(),
            static_cast<int>(segments.size()), output_size, ToCuda(values),
            indices, ToCuda(in.acc), Scratch(), StreamOf(ctx)),
        "TopKSampleSegmentsWrite");
  }

 private:
  void* Scratch() { return scratch_.flat<int8_t>().data(); }

  Tensor scratch_;  // the table and the plans, from Plan to Write
};
#endif  // GOOGLE_CUDA

}  // namespace functor

namespace {

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

// The attributes `mode` and `rounds` of every TopKSample op.
absl::Status ReadModeAndRounds(OpKernelConstruction* ctx,
                               TopKSampleMode* mode, int* rounds) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("mode", &name));
  TF_RETURN_IF_ERROR(ParseMode(name, mode));
  TF_RETURN_IF_ERROR(ctx->GetAttr("rounds", rounds));
  if (*rounds < 1 || *rounds > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`rounds` must be in [1, 64]. Received: rounds=", *rounds));
  }
  return absl::OkStatus();
}

// Validates k against n and reads it.
template <typename Tk>
absl::Status ValidateK(int64_t n, const Tensor& k_t, int64_t* k) {
  TF_RETURN_IF_ERROR(CheckScalar(k_t, "k"));
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
  return absl::OkStatus();
}

// Validates k and seed against n and reads them.
template <typename Tk>
absl::Status ValidateArgs(int64_t n, const Tensor& k_t, const Tensor& seed_t,
                          int64_t* k, int64_t* seed) {
  TF_RETURN_IF_ERROR(ValidateK<Tk>(n, k_t, k));
  TF_RETURN_IF_ERROR(CheckScalar(seed_t, "seed"));
  *seed = seed_t.scalar<int64_t>()();
  return absl::OkStatus();
}

// "`gradient` and `other` must have the same shape".
absl::Status CheckSameShape(const Tensor& gradient, const Tensor& other,
                            const char* name = "residual") {
  if (gradient.shape() == other.shape()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "`gradient` and `", name, "` must have the same shape. "
      "Received: gradient.shape=",
      gradient.shape().DebugString(), ", ", name,
      ".shape=", other.shape().DebugString()));
}

// Plans the selection of `in`, allocates outputs 0 (values) and 1
// (indices) and writes them: the common part of the single-tensor ops.
template <typename Device, typename T>
absl::Status SelectInto(OpKernelContext* ctx,
                        typename functor::TopKSample<Device, T>::Cache* cache,
                        const TopKSampleInput<T>& in, int64_t k,
                        TopKSampleMode mode, int rounds, int64_t seed) {
  functor::TopKSample<Device, T> select(cache);
  int64_t size = 0;
  TF_RETURN_IF_ERROR(select.Plan(ctx, in, k, mode, rounds, seed, &size));
  Tensor* values = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({size}), &values));
  Tensor* indices = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({size}), &indices));
  if (size == 0) return absl::OkStatus();
  return select.Write(ctx, in, size, values->flat<T>().data(),
                      indices->flat<int32_t>().data());
}

// TopKSample (inputs x, k, seed) or, kWithResidual, TopKSampleWithResidual
// (inputs gradient, residual, k, seed; output 2 the new residual, which
// holds acc = gradient + residual until the selected entries are zeroed).
template <typename Device, typename T, typename Tk, bool kWithResidual>
class TopKSampleOp : public OpKernel {
 public:
  explicit TopKSampleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadModeAndRounds(ctx, &mode_, &rounds_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int extra = kWithResidual ? 1 : 0;
    const Tensor& x = ctx->input(0);
    if (kWithResidual) OP_REQUIRES_OK(ctx, CheckSameShape(x, ctx->input(1)));
    const int64_t n = x.NumElements();
    int64_t k = 0, seed = 0;
    OP_REQUIRES_OK(ctx, ValidateArgs<Tk>(n, ctx->input(1 + extra),
                                         ctx->input(2 + extra), &k, &seed));
    TopKSampleInput<T> in{x.flat<T>().data(), nullptr, nullptr, n};
    if (kWithResidual) {
      const Tensor& r = ctx->input(1);
      Tensor* acc = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              {1}, 2, r.shape(), &acc));
      in.residual = r.flat<T>().data();
      in.acc = acc->flat<T>().data();
    }
    OP_REQUIRES_OK(ctx, (SelectInto<Device, T>(ctx, &cache_, in, k, mode_,
                                               rounds_, seed)));
  }

 private:
  using Functor = functor::TopKSample<Device, T>;

  TopKSampleMode mode_;
  int rounds_;
  typename Functor::Cache cache_;
};

// TopKRatioWithResidual (inputs gradient, residual, weights, floor, k;
// outputs values, indices and the new residual): the trimmed selection of
// TopKSampleWithResidual, ranked by RatioScore (top_k_sample_common.h)
// through TopKSampleInput's weights.
template <typename Device, typename T, typename Tk>
class TopKRatioOp : public OpKernel {
 public:
  explicit TopKRatioOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& r = ctx->input(1);
    const Tensor& w = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckSameShape(x, r));
    OP_REQUIRES_OK(ctx, CheckSameShape(x, w, "weights"));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(3), "floor"));
    const int64_t n = x.NumElements();
    int64_t k = 0;
    OP_REQUIRES_OK(ctx, ValidateK<Tk>(n, ctx->input(4), &k));
    Tensor* acc = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                            {1}, 2, r.shape(), &acc));
    TopKSampleInput<T> in{x.flat<T>().data(), r.flat<T>().data(),
                          acc->flat<T>().data(), n};
    in.weights = w.flat<T>().data();
    in.floor = ctx->input(3).scalar<float>()();
    OP_REQUIRES_OK(ctx, (SelectInto<Device, T>(ctx, &cache_, in, k,
                                               TopKSampleMode::kTrimmed,
                                               /*rounds=*/1, /*seed=*/0)));
  }

 private:
  using Functor = functor::TopKSample<Device, T>;

  typename Functor::Cache cache_;
};

// Validates the attribute `segment_sizes` and returns their sum.
absl::Status CheckSegmentSizes(const std::vector<int64_t>& sizes,
                               int64_t* total) {
  if (sizes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TopKSampleSegments supports at most 2^31 - 1 segments. Received: "
        "len(segment_sizes)=",
        sizes.size()));
  }
  *total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0 || sizes[i] > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`segment_sizes` must be in [0, 2^31 - 1] (int32 indices). "
          "Received: segment_sizes[",
          i, "]=", sizes[i]));
    }
    *total += sizes[i];
  }
  return absl::OkStatus();
}

// "`name` must be a vector with one entry per segment".
absl::Status CheckPerSegment(const Tensor& t, const char* name,
                             int64_t count) {
  if (TensorShapeUtils::IsVector(t.shape()) && t.NumElements() == count) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "`", name, "` must be a vector with one entry per segment. Received: ",
      name, ".shape=", t.shape().DebugString(),
      ", len(segment_sizes)=", count));
}

// The segment table of `sizes` (contiguous from 0) with the vectors k and
// seeds, one entry per segment, each k[i] in [0, sizes[i]].
template <typename Tk>
absl::Status ReadSegments(const std::vector<int64_t>& sizes,
                          const Tensor& k_t, const Tensor& seeds_t,
                          std::vector<TopKSampleSegment>* segments) {
  const auto count = static_cast<int64_t>(sizes.size());
  TF_RETURN_IF_ERROR(CheckPerSegment(k_t, "k", count));
  TF_RETURN_IF_ERROR(CheckPerSegment(seeds_t, "seeds", count));
  const auto k = k_t.vec<Tk>();
  const auto seeds = seeds_t.vec<int64_t>();
  segments->resize(count);
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    TopKSampleSegment& seg = (*segments)[i];
    seg.offset = offset;
    seg.n = sizes[i];
    seg.k = static_cast<int64_t>(k(i));
    seg.seed = seeds(i);
    if (seg.k < 0 || seg.k > seg.n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`k[i]` must be in [0, segment_sizes[i]]. Received: k[", i,
          "]=", seg.k, ", segment_sizes[", i, "]=", seg.n));
    }
    offset += seg.n;
  }
  return absl::OkStatus();
}

// TopKSampleSegments (inputs x, k, seeds; outputs values, indices, sizes)
// or, kWithResidual, TopKSampleSegmentsWithResidual (inputs gradient,
// residual, k, seeds; output 3 the new residual).
template <typename Device, typename T, typename Tk, bool kWithResidual>
class TopKSampleSegmentsOp : public OpKernel {
 public:
  explicit TopKSampleSegmentsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadModeAndRounds(ctx, &mode_, &rounds_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment_sizes", &segment_sizes_));
    OP_REQUIRES_OK(ctx, CheckSegmentSizes(segment_sizes_, &total_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int extra = kWithResidual ? 1 : 0;
    const Tensor& x = ctx->input(0);
    if (kWithResidual) OP_REQUIRES_OK(ctx, CheckSameShape(x, ctx->input(1)));
    const int64_t n = x.NumElements();
    OP_REQUIRES(ctx, n == total_,
                absl::InvalidArgumentError(absl::StrCat(
                    "`segment_sizes` must add up to the number of elements "
                    "of `x`. Received: sum(segment_sizes)=",
                    total_, ", x.shape=", x.shape().DebugString())));
    std::vector<TopKSampleSegment> segments;
    OP_REQUIRES_OK(ctx, ReadSegments<Tk>(segment_sizes_,
                                         ctx->input(1 + extra),
                                         ctx->input(2 + extra), &segments));
    TopKSampleInput<T> in{x.flat<T>().data(), nullptr, nullptr, n};
    if (kWithResidual) {
      const Tensor& r = ctx->input(1);
      Tensor* acc = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              {1}, 3, r.shape(), &acc));
      in.residual = r.flat<T>().data();
      in.acc = acc->flat<T>().data();
    }
    const auto count = static_cast<int64_t>(segments.size());
    Tensor* sizes = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, TensorShape({count}), &sizes));
    int64_t* size = sizes->flat<int64_t>().data();
    std::fill(size, size + count, int64_t{0});
    Functor select(&cache_);
    if (count > 0) {
      OP_REQUIRES_OK(ctx,
                     select.Plan(ctx, in, segments, mode_, rounds_, size));
    }
    int64_t total = 0;
    for (int64_t i = 0; i < count; ++i) total += size[i];
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({total}), &values));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, TensorShape({total}), &indices));
    if (total == 0) return;
    OP_REQUIRES_OK(ctx, select.Write(ctx, in, segments, total,
                                     values->flat<T>().data(),
                                     indices->flat<int32_t>().data()));
  }

 private:
  using Functor = functor::TopKSampleSegments<Device, T>;

  TopKSampleMode mode_;
  int rounds_;
  std::vector<int64_t> segment_sizes_;
  int64_t total_ = 0;  // their sum
  typename Functor::Cache cache_;
};

#define REGISTER_CPU(T, Tk)                                               \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSample")                         \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleOp<CPUDevice, T, Tk, false>);         \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleWithResidual")             \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleOp<CPUDevice, T, Tk, true>);          \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKRatioWithResidual")              \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKRatioOp<CPUDevice, T, Tk>);                 \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleSegments")                 \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleSegmentsOp<CPUDevice, T, Tk, false>); \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleSegmentsWithResidual")     \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleSegmentsOp<CPUDevice, T, Tk, true>);

#define REGISTER_CPU_ALL_K(T) \
  REGISTER_CPU(T, int32_t)    \
  REGISTER_CPU(T, int64_t)

REGISTER_CPU_ALL_K(float)
REGISTER_CPU_ALL_K(Eigen::half)
REGISTER_CPU_ALL_K(Eigen::bfloat16)

#undef REGISTER_CPU_ALL_K
#undef REGISTER_CPU

#if GOOGLE_CUDA
// k, seed(s) and the segments' sizes live in host memory.
#define REGISTER_GPU(T, Tk)                                               \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSample")                         \
                              .Device(tensorflow::DEVICE_GPU)             \
                              .HostMemory("k")                            \
                              .HostMemory("seed")                         \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleOp<GPUDevice, T, Tk, false>);         \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleWithResidual")             \
                              .Device(tensorflow::DEVICE_GPU)             \
                              .HostMemory("k")                            \
                              .HostMemory("seed")                         \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleOp<GPUDevice, T, Tk, true>);          \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKRatioWithResidual")              \
                              .Device(tensorflow::DEVICE_GPU)             \
                              .HostMemory("floor")                        \
                              .HostMemory("k")                            \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKRatioOp<GPUDevice, T, Tk>);                 \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleSegments")                 \
                              .Device(tensorflow::DEVICE_GPU)             \
                              .HostMemory("k")                            \
                              .HostMemory("seeds")                        \
                              .HostMemory("sizes")                        \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleSegmentsOp<GPUDevice, T, Tk, false>); \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleSegmentsWithResidual")     \
                              .Device(tensorflow::DEVICE_GPU)             \
                              .HostMemory("k")                            \
                              .HostMemory("seeds")                        \
                              .HostMemory("sizes")                        \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Tk>("Tk"),                  \
                          TopKSampleSegmentsOp<GPUDevice, T, Tk, true>);

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
