// Copyright 2026 The tfgc Authors.
//
// The op kernel of NewResidual, templated on the device: it validates the
// inputs, allocates the output and calls functor::NewResidual
// (residual_kernels.h). The CPU functor splits the elements into blocks on
// the intra-op thread pool; each element is read once from each input and
// written once, where TensorFlow's IsFinite, Sub and SelectV2 make three
// passes and two temporaries. Under GOOGLE_CUDA the GPU functor calls the
// launcher of residual_gpu.h.

#define EIGEN_USE_THREADS

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/residual_kernels.h"

#if GOOGLE_CUDA
#include "custom_ops/cc/kernels/residual_gpu.h"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace {

// Blocks of at least 2^16 elements: a hand-off costs more than less work.
constexpr int64_t kMinBlock = int64_t{1} << 16;

// float32: the finiteness test on the bits (an exponent that is not all
// ones) and a select, no branch.
void NewResidualBlock(const float* c, const float* s, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, s + i, sizeof(bits));
    const float kept = c[i] - s[i];
    out[i] = (bits & 0x7f800000u) != 0x7f800000u ? kept : 0.0f;
  }
}

// Half and bfloat16: T's own subtraction (in float32, rounded once).
template <typename T>
void NewResidualBlock(const T* c, const T* s, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = Eigen::numext::isfinite(s[i]) ? T(c[i] - s[i]) : T(0.0f);
  }
}

}  // namespace

namespace functor {

template <typename T>
struct NewResidual<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const T* corrected,
                          const T* sent, int64_t n, T* out) {
    const Blocks blocks(n, NumThreads(ctx), kMinBlock);
    ForEachBlock(ctx, blocks, [&](int64_t b) {
      const int64_t begin = blocks.begin(b);
      NewResidualBlock(corrected + begin, sent + begin,
                       blocks.end(b) - begin, out + begin);
    });
    return absl::OkStatus();
  }
};

#if GOOGLE_CUDA
template <typename T>
struct NewResidual<GPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const T* corrected,
                          const T* sent, int64_t n, T* out) {
    return CudaStatus(gpu::NewResidual(ToCuda(corrected), ToCuda(sent), n,
                                       ToCuda(out), StreamOf(ctx)),
                      "NewResidual");
  }
};
#endif  // GOOGLE_CUDA

}  // namespace functor

namespace {

template <typename Device, typename T>
class NewResidualOp : public OpKernel {
 public:
  explicit NewResidualOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& corrected = ctx->input(0);
    const Tensor& sent = ctx->input(1);
    OP_REQUIRES(
        ctx, corrected.shape() == sent.shape(),
        absl::InvalidArgumentError(absl::StrCat(
            "`corrected` and `sent` must have the same shape. Received: "
            "corrected.shape=",
            corrected.shape().DebugString(),
            ", sent.shape=", sent.shape().DebugString())));
    Tensor* out = nullptr;
    // The output may take the buffer of `corrected` when nothing else
    // reads it (error feedback's x + residual is read by nothing after).
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                            {0}, 0, corrected.shape(), &out));
    OP_REQUIRES_OK(ctx, (functor::NewResidual<Device, T>()(
                            ctx, corrected.flat<T>().data(),
                            sent.flat<T>().data(), corrected.NumElements(),
                            out->flat<T>().data())));
  }
};

#define REGISTER_CPU(T)                                                   \
  REGISTER_KERNEL_BUILDER(                                                \
      Name("Tfgc>NewResidual").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      NewResidualOp<CPUDevice, T>);

REGISTER_CPU(float)
REGISTER_CPU(Eigen::half)
REGISTER_CPU(Eigen::bfloat16)

#undef REGISTER_CPU

#if GOOGLE_CUDA
#define REGISTER_GPU(T)                                       \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>NewResidual")            \
                              .Device(tensorflow::DEVICE_GPU) \
                              .TypeConstraint<T>("T"),        \
                          NewResidualOp<GPUDevice, T>);

REGISTER_GPU(float)
REGISTER_GPU(Eigen::half)
REGISTER_GPU(Eigen::bfloat16)

#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
