// Copyright 2026 The tfgc Authors.
//
// The op kernel of FusedUpdate, templated on the device: it looks up the
// variables and slots, validates them against the gradients and the rule,
// locks every variable's mutex in address order (as TensorFlow's own
// ResourceApply* ops do), gives a buffer that something else still reads a
// copy of its own first (copy on write, as TensorFlow's
// PrepareToUpdateVariable does), and calls functor::FusedUpdate
// (fused_update_kernels.h) once for all of them. Under GOOGLE_CUDA the GPU
// functors call the launchers of fused_update_gpu.h.
//
// The CPU functor cuts every tensor into chunks and updates the chunks of
// all tensors in parallel on TensorFlow's intra-op threads, one pass over
// each element; the loops are compiled per rule with -ffp-contract=off, so
// each element gets exactly the float32 operations of Keras's update step.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/fused_update_common.h"
#include "custom_ops/cc/kernels/fused_update_kernels.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

#if GOOGLE_CUDA
#include "custom_ops/cc/kernels/fused_update_gpu.h"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace {

using fused_update::Rule;

// Chunks of at least this many elements (a hand-off costs more than
// updating fewer).
constexpr int64_t kMinChunk = int64_t{1} << 14;

// Float32 arithmetic of the CPU loops: one correctly rounded operation each
// (the file is compiled with -ffp-contract=off and -fno-math-errno, so the
// loops vectorise into the same operations).
struct CpuFloat {
  static float Mul(float a, float b) { return a * b; }
  static float Add(float a, float b) { return a + b; }
  static float Sub(float a, float b) { return a - b; }
  static float Div(float a, float b) { return a / b; }
  static float Sqrt(float a) { return std::sqrt(a); }
};

// One chunk [begin, end) of a tensor.
struct Chunk {
  const fused_update::Tensor<float>* tensor;
  int64_t begin;
  int64_t end;
};

// The loop of one chunk, compiled for one rule.
struct UpdateChunk {
  const fused_update::Scalars& scalars;
  const Chunk& chunk;

  template <Rule kRule, bool kDecay>
  void operator()() const {
    const fused_update::Tensor<float>& t = *chunk.tensor;
    for (int64_t i = chunk.begin; i < chunk.end; ++i) {
      fused_update::UpdateElement<CpuFloat, kRule, kDecay>(
          scalars, t.variable, t.momentum, t.velocity, t.gradient, i);
    }
  }
};

}  // namespace

namespace functor {

template <>
struct FusedUpdate<CPUDevice, float> {
  absl::Status operator()(
      OpKernelContext* ctx, Rule rule, bool weight_decay,
      const std::vector<fused_update::Tensor<float>>& tensors,
      const float* scalars) {
    fused_update::Scalars c{};
    std::copy(scalars, scalars + fused_update::NumScalars(rule, weight_decay),
              c.s);
    int64_t total = 0;
    for (const auto& t : tensors) total += t.size;
    // Chunks of about a quarter thread's share, never across tensors.
    const int threads = NumThreads(ctx);
    const int64_t len =
        std::max(kMinChunk, (total + 4 * threads - 1) / (4 * threads));
    std::vector<Chunk> chunks;
    for (const auto& t : tensors) {
      for (int64_t b = 0; b < t.size; b += len) {
        chunks.push_back({&t, b, std::min(t.size, b + len)});
      }
    }
    const Blocks blocks(static_cast<int64_t>(chunks.size()), threads, 1);
    ForEachBlock(ctx, blocks, [&](int64_t b) {
      for (int64_t k = blocks.begin(b); k < blocks.end(b); ++k) {
        fused_update::DispatchRule(rule, weight_decay,
                                   UpdateChunk{c, chunks[k]});
      }
    });
    return absl::OkStatus();
  }
};

template <>
struct CopyBuffer<CPUDevice, float> {
  absl::Status operator()(OpKernelContext* /*ctx*/, const float* src,
                          int64_t n, float* dst) {
    std::memcpy(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
};

#if GOOGLE_CUDA
template <>
struct FusedUpdate<GPUDevice, float> {
  absl::Status operator()(
      OpKernelContext* ctx, Rule rule, bool weight_decay,
      const std::vector<fused_update::Tensor<float>>& tensors,
      const float* scalars) {
    return CudaStatus(
        gpu::FusedUpdate(rule, weight_decay, tensors.data(),
                         static_cast<int64_t>(tensors.size()), scalars,
                         StreamOf(ctx)),
        "FusedUpdate");
  }
};

template <>
struct CopyBuffer<GPUDevice, float> {
  absl::Status operator()(OpKernelContext* ctx, const float* src, int64_t n,
                          float* dst) {
    return CudaStatus(gpu::CopyBuffer(dst, src, n, StreamOf(ctx)),
                      "CopyBuffer");
  }
};
#endif  // GOOGLE_CUDA

}  // namespace functor

namespace {

using tensorflow::ResourceHandle;
using tensorflow::Var;
using tensorflow::core::RefCountPtr;

absl::Status ParseRule(const std::string& name, Rule* rule) {
  if (name == "sgd") {
    *rule = Rule::kSgd;
  } else if (name == "momentum") {
    *rule = Rule::kMomentum;
  } else if (name == "nesterov") {
    *rule = Rule::kNesterov;
  } else if (name == "adam") {
    *rule = Rule::kAdam;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "`rule` must be one of sgd, momentum, nesterov, adam. Received: "
        "rule=",
        name));
  }
  return absl::OkStatus();
}

// Locks the mutexes of `vars` in increasing address order (each once) and
// unlocks them when it goes out of scope, so that two ops over overlapping
// variables cannot deadlock.
class LockInOrder {
 public:
  explicit LockInOrder(const std::vector<Var*>& vars) {
    for (Var* v : vars) mutexes_.push_back(v->mu());
    std::sort(mutexes_.begin(), mutexes_.end());
    mutexes_.erase(std::unique(mutexes_.begin(), mutexes_.end()),
                   mutexes_.end());
    for (auto* mu : mutexes_) mu->lock();
  }
  ~LockInOrder() {
    for (auto it = mutexes_.rbegin(); it != mutexes_.rend(); ++it) {
      (*it)->unlock();
    }
  }
  LockInOrder(const LockInOrder&) = delete;
  LockInOrder& operator=(const LockInOrder&) = delete;

 private:
  std::vector<tensorflow::mutex*> mutexes_;
};

template <typename Device, typename T>
class FusedUpdateOp : public OpKernel {
 public:
  explicit FusedUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string rule;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &rule));
    OP_REQUIRES_OK(ctx, ParseRule(rule, &rule_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("weight_decay", &weight_decay_));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::OpInputList variables, slots, gradients;
    OP_REQUIRES_OK(ctx, ctx->input_list("variables", &variables));
    OP_REQUIRES_OK(ctx, ctx->input_list("slots", &slots));
    OP_REQUIRES_OK(ctx, ctx->input_list("gradients", &gradients));
    const Tensor* scalars = nullptr;
    OP_REQUIRES_OK(ctx, ctx->input("scalars", &scalars));
    const int n = variables.size();
    const int per_variable = fused_update::NumSlots(rule_);
    OP_REQUIRES(ctx, slots.size() == per_variable * n,
                absl::InvalidArgumentError(absl::StrCat(
                    "`slots` must hold ", per_variable,
                    " slot(s) per variable for this rule: ", per_variable * n,
                    " for ", n, " variables. Received: ", slots.size())));
    const int num_scalars = fused_update::NumScalars(rule_, weight_decay_);
    OP_REQUIRES(ctx,
                TensorShapeUtils::IsVector(scalars->shape()) &&
                    scalars->dim_size(0) == num_scalars,
                absl::InvalidArgumentError(absl::StrCat(
                    "`scalars` must be a vector of ", num_scalars,
                    " values for this rule. Received: shape=",
                    scalars->shape().DebugString())));

    // Variable i, then its slots (momentum, velocity).
    std::vector<RefCountPtr<Var>> refs(n * (1 + per_variable));
    std::vector<Var*> vars(refs.size());
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s <= per_variable; ++s) {
        const Tensor& handle = s == 0 ? variables[i] : slots[(s - 1) * n + i];
        const int k = i * (1 + per_variable) + s;
        OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                                ctx, handle.flat<ResourceHandle>()(0),
                                &refs[k]));
        vars[k] = refs[k].get();
      }
    }
    LockInOrder lock(vars);
    std::vector<fused_update::Tensor<T>> tensors(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& g = gradients[i];
      T* buffers[3] = {nullptr, nullptr, nullptr};
      for (int s = 0; s <= per_variable; ++s) {
        Var* var = vars[i * (1 + per_variable) + s];
        OP_REQUIRES_OK(ctx, Check(*var, g, i, s));
        OP_REQUIRES_OK(ctx, OwnBuffer(ctx, var));
        buffers[s] = var->tensor()->flat<T>().data();
      }
      tensors[i] = {buffers[0], buffers[1], buffers[2], g.flat<T>().data(),
                    g.NumElements()};
    }
    OP_REQUIRES_OK(ctx, (functor::FusedUpdate<Device, T>()(
                            ctx, rule_, weight_decay_, tensors,
                            scalars->flat<T>().data())));
  }

 private:
  // Whether variable (slot 0) or slot s of variable i fits gradient g.
  static absl::Status Check(Var& var, const Tensor& g, int i, int s) {
    static const char* const kWhat[] = {"variables", "momentum slot of",
                                        "velocity slot of"};
    const Tensor& t = *var.tensor();
    if (!t.IsInitialized()) {
      return absl::FailedPreconditionError(
          absl::StrCat("The ", kWhat[s], " variables[", i,
                       "] is not initialized. Build the optimizer first."));
    }
    if (t.dtype() != tensorflow::DataTypeToEnum<T>::value ||
        t.shape() != g.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "The ", kWhat[s], " variables[", i,
          "] must have the gradient's dtype and shape. Received: ",
          tensorflow::DataTypeString(t.dtype()), t.shape().DebugString(),
          " for gradients[", i, "] of ", tensorflow::DataTypeString(g.dtype()),
          g.shape().DebugString()));
    }
    return absl::OkStatus();
  }

  // Gives `var` a buffer of its own before it is written in place, when a
  // read still holds the current one (or reads copy: copy-on-read mode).
  static absl::Status OwnBuffer(OpKernelContext* ctx, Var* var) {
    Tensor* t = var->tensor();
    if (!var->copy_on_read_mode.load() && t->RefCountIsOne()) {
      return absl::OkStatus();
    }
    tensorflow::AllocatorAttributes attr;
    attr.set_gpu_compatible(true);
    attr.set_nic_compatible(true);
    Tensor copy;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(t->dtype(), t->shape(), &copy, attr));
    TF_RETURN_IF_ERROR((functor::CopyBuffer<Device, T>()(
        ctx, t->flat<T>().data(), t->NumElements(), copy.flat<T>().data())));
    *t = copy;
    return absl::OkStatus();
  }

  Rule rule_ = Rule::kSgd;
  bool weight_decay_ = false;
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>FusedUpdate")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<float>("T"),
                        FusedUpdateOp<CPUDevice, float>);

#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("Tfgc>FusedUpdate")
                            .Device(tensorflow::DEVICE_GPU)
                            .TypeConstraint<float>("T"),
                        FusedUpdateOp<GPUDevice, float>);
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
