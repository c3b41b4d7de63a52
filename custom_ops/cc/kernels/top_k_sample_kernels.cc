// Copyright 2026 The tfgc Authors.
//
// The op kernels of Tfgc>TopKSample and Tfgc>TopKSampleWithResidual, one
// class template over the device: it validates the attributes and inputs,
// allocates the outputs and has functor::TopKSampleFunctor<Device, T> plan
// and write the selection. The CPU functor runs the selection of
// top_k_sample_cpu.h; under GOOGLE_CUDA the GPU functor calls the launchers
// of top_k_sample_kernels.cu.cc.

#define EIGEN_USE_THREADS

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/top_k_sample_cpu.h"
#include "custom_ops/cc/kernels/top_k_sample_kernels.h"

namespace tfgc {
namespace functor {

// A selection in two steps, so that the kernel can allocate the outputs in
// between: Plan selects from `in` (0 <= k <= n; with a residual it first
// writes acc = gradient + residual) and returns the number of selected
// elements: k in mstopk and trimmed modes, data-dependent in threshold
// mode. Write writes them (output_size > 0), values and int32 indices in
// index order, and zeroes them in acc with a residual. The plan goes from
// one step to the other in the functor object, one per Compute; `Cache` is
// what the op kernel keeps for the functor between calls.
template <typename Device, typename T>
class TopKSampleFunctor;

template <typename T>
class TopKSampleFunctor<CPUDevice, T> {
 public:
  using Cache = cpu::CandidateCache;  // the candidates' buffers

  explicit TopKSampleFunctor(Cache* cache) : lease_(cache) {}

  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    int64_t k, TopKSampleMode mode, int rounds, int64_t seed,
                    int64_t* output_size) {
    plan_ = cpu::PlanSelection(ctx, in, k, mode, rounds, seed, lease_.get());
    *output_size = plan_.output_size;
    return absl::OkStatus();
  }

  absl::Status Write(OpKernelContext* /*ctx*/, const TopKSampleInput<T>& in,
                     int64_t /*output_size*/, T* values, int32_t* indices) {
    return cpu::WriteSelection(in, plan_, lease_.get(), values, indices);
  }

 private:
  Cache::Lease lease_;  // the candidates the plan selects from
  SelectionPlan plan_;
};

#if GOOGLE_CUDA
// The GPU functor lives here, in the TensorFlow glue, not in a .cu.cc file
// as in TensorFlow: top_k_sample_kernels.cu.cc is compiled without
// TensorFlow headers (custom_ops/cuda_harness builds it alone), so it
// exports plain launchers. They plan and write the selection on the op's
// stream; the host waits for the device only in threshold mode, whose
// output size depends on the data (TopKSampleOutputSize).
template <typename T>
class TopKSampleFunctor<GPUDevice, T> {
 public:
  struct Cache {};  // nothing is kept between calls

  explicit TopKSampleFunctor(Cache* /*cache*/) {}

  absl::Status Plan(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                    int64_t k, TopKSampleMode mode, int rounds, int64_t seed,
                    int64_t* output_size) {
    void* stream = StreamOf(ctx);
    if (in.residual != nullptr) {
      TF_RETURN_IF_ERROR(CudaStatus(
          gpu::AddResidual(kDType, in.x, in.residual, in.acc, in.n, stream),
          "AddResidual"));
    }
    TF_RETURN_IF_ERROR(
        AllocateScratch(ctx, gpu::TopKSampleScratchBytes(in.n), &scratch_));
    TF_RETURN_IF_ERROR(CudaStatus(
        gpu::TopKSamplePlan(kDType, in.data(), in.n, k, mode, rounds, seed,
                            Scratch(), stream),
        "TopKSamplePlan"));
    return CudaStatus(gpu::TopKSampleOutputSize(mode, in.n, k, Scratch(),
                                                stream, output_size),
                      "TopKSampleOutputSize");
  }

  absl::Status Write(OpKernelContext* ctx, const TopKSampleInput<T>& in,
                     int64_t output_size, T* values, int32_t* indices) {
    return CudaStatus(
        gpu::TopKSampleWrite(kDType, in.data(), in.n, output_size, values,
                             indices, in.acc, Scratch(), StreamOf(ctx)),
        "TopKSampleWrite");
  }

 private:
  static constexpr gpu::DType kDType = static_cast<gpu::DType>(GpuDType<T>());
  void* Scratch() { return scratch_.flat<int8_t>().data(); }

  Tensor scratch_;  // the plan, from Plan to Write
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

// Validates k and seed against n and reads them.
template <typename Tk>
absl::Status ValidateArgs(int64_t n, const Tensor& k_t, const Tensor& seed_t,
                          int64_t* k, int64_t* seed) {
  TF_RETURN_IF_ERROR(CheckScalar(k_t, "k"));
  TF_RETURN_IF_ERROR(CheckScalar(seed_t, "seed"));
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

absl::Status CheckSameShape(const Tensor& gradient, const Tensor& residual) {
  if (gradient.shape() == residual.shape()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "`gradient` and `residual` must have the same shape. "
      "Received: gradient.shape=",
      gradient.shape().DebugString(),
      ", residual.shape=", residual.shape().DebugString()));
}

// TopKSample (inputs x, k, seed) or, kWithResidual, TopKSampleWithResidual
// (inputs gradient, residual, k, seed; output 2 the new residual, which
// holds acc = gradient + residual until the selected entries are zeroed).
template <typename Device, typename T, typename Tk, bool kWithResidual>
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
    Functor select(&cache_);
    int64_t size = 0;
    OP_REQUIRES_OK(ctx, select.Plan(ctx, in, k, mode_, rounds_, seed, &size));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({size}), &values));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, TensorShape({size}), &indices));
    if (size == 0) return;
    OP_REQUIRES_OK(ctx, select.Write(ctx, in, size, values->flat<T>().data(),
                                     indices->flat<int32_t>().data()));
  }

 private:
  using Functor = functor::TopKSampleFunctor<Device, T>;

  TopKSampleMode mode_;
  int rounds_;
  typename Functor::Cache cache_;
};

#define REGISTER_CPU(T, Tk)                                        \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSample")                  \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tk>("Tk"),           \
                          TopKSampleOp<CPUDevice, T, Tk, false>);  \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleWithResidual")      \
                              .Device(DEVICE_CPU)                  \
                              .TypeConstraint<T>("T")              \
                              .TypeConstraint<Tk>("Tk"),           \
                          TopKSampleOp<CPUDevice, T, Tk, true>);

#define REGISTER_CPU_ALL_K(T) \
  REGISTER_CPU(T, int32_t)    \
  REGISTER_CPU(T, int64_t)

REGISTER_CPU_ALL_K(float)
REGISTER_CPU_ALL_K(Eigen::half)
REGISTER_CPU_ALL_K(Eigen::bfloat16)

#undef REGISTER_CPU_ALL_K
#undef REGISTER_CPU

#if GOOGLE_CUDA
// k and seed live in host memory.
#define REGISTER_GPU(T, Tk)                                          \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSample")                    \
                              .Device(tensorflow::DEVICE_GPU)        \
                              .HostMemory("k")                       \
                              .HostMemory("seed")                    \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<Tk>("Tk"),             \
                          TopKSampleOp<GPUDevice, T, Tk, false>);    \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>TopKSampleWithResidual")        \
                              .Device(tensorflow::DEVICE_GPU)        \
                              .HostMemory("k")                       \
                              .HostMemory("seed")                    \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<Tk>("Tk"),             \
                          TopKSampleOp<GPUDevice, T, Tk, true>);

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
