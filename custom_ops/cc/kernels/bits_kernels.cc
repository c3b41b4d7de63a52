// Copyright 2026 The tfgc Authors.
//
// The bit-packing ops: one op kernel per op, templated on the device,
// validates the inputs and allocates the outputs; the functors of
// bits_kernels.h compute them. The CPU functors split the work over words
// on the intra-op thread pool; under GOOGLE_CUDA the GPU functors call the
// launchers of bits_gpu.h.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/bits_kernels.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/simd.h"

#if GOOGLE_CUDA
#include "custom_ops/cc/kernels/bits_gpu.h"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace {

// Word blocks: 4096 words (128 Ki elements) at least per block.
constexpr int64_t kMinWordBlock = 4096;

// Per byte value: its eight bits (LSB first) as 0/1 and as -1/+1.
struct ByteLanes {
  int32_t bit[8];
  float sign[8];
};

struct ByteLaneTable {
  ByteLanes rows[256];
  ByteLaneTable() {
    for (int v = 0; v < 256; ++v) {
      for (int l = 0; l < 8; ++l) {
        rows[v].bit[l] = (v >> l) & 1;
        rows[v].sign[l] = ((v >> l) & 1) ? 1.0f : -1.0f;
      }
    }
  }
  const ByteLanes& operator[](uint32_t v) const { return rows[v]; }
};

const ByteLaneTable kByteLanes;

#if TFGC_HAVE_AVX2_PATH
// Packs the full words [begin, end): a byte's low bit shifted to its top
// bit, then one movemask per 32 bytes. Returns the first word not packed.
TFGC_AVX2 int64_t PackFullWordsAvx2(const uint8_t* bits, int64_t begin,
                                    int64_t end, uint32_t* w) {
  int64_t j = begin;
  for (; j < end; ++j) {
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(bits + j * kBitsPerWord));
    w[j] = static_cast<uint32_t>(
        _mm256_movemask_epi8(_mm256_slli_epi16(v, 7)));
  }
  return j;
}
#endif

// UnpackBitsSum (kVote false) and UnpackBitsVote (kVote true, `scales`
// null) on the CPU.
template <typename T, bool kVote>
struct UnpackBitsReduceCpu {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          const T* scales, int64_t p, int64_t n, T* dst) {
    const int64_t w = NumWords(n);
    const uint32_t* in = reinterpret_cast<const uint32_t*>(words);
    std::vector<float> s(p);
    if (!kVote) {
      for (int64_t i = 0; i < p; ++i) s[i] = static_cast<float>(scales[i]);
    }
    Blocks blocks(w, NumThreads(ctx),
                  std::max<int64_t>(1, kMinWordBlock / (p + 1)));
    ForEachBlock(ctx, blocks, [&](int64_t b) {
      float acc[kBitsPerWord];
      int32_t votes[kBitsPerWord];
      const int64_t end = blocks.end(b);
      for (int64_t j = blocks.begin(b); j < end; ++j) {
        std::fill(acc, acc + kBitsPerWord, 0.0f);
        std::fill(votes, votes + kBitsPerWord, 0);
        for (int64_t i = 0; i < p; ++i) {
          const uint32_t word = in[i * w + j];
          // One table row per byte: eight lanes the compiler vectorises
          // (the same additions, in the same order, as bit by bit).
          for (int byte = 0; byte < 4; ++byte) {
            const ByteLanes& lanes = kByteLanes[(word >> (8 * byte)) & 0xffu];
            if (kVote) {
              int32_t* v = votes + 8 * byte;
              for (int l = 0; l < 8; ++l) v[l] += lanes.bit[l];
            } else {
              const float si = s[i];
              float* a = acc + 8 * byte;
              for (int l = 0; l < 8; ++l) a[l] += lanes.sign[l] * si;
            }
          }
        }
        const int64_t first = j * kBitsPerWord;
        const int count =
            static_cast<int>(std::min<int64_t>(kBitsPerWord, n - first));
        for (int bit = 0; bit < count; ++bit) {
          const float v =
              kVote ? (2 * votes[bit] >= p ? 1.0f : -1.0f) : acc[bit];
          dst[first + bit] = static_cast<T>(v);
        }
      }
    });
    return absl::OkStatus();
  }
};

}  // namespace

namespace functor {

// ---------------------------------------------------------------------------
// CPU functors.
// ---------------------------------------------------------------------------

template <>
absl::Status PackBits<CPUDevice>::operator()(OpKernelContext* ctx,
                                             const bool* mask, int64_t n,
                                             int32_t* words) {
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(mask);
  uint32_t* w = reinterpret_cast<uint32_t*>(words);
  Blocks blocks(NumWords(n), NumThreads(ctx), kMinWordBlock);
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    int64_t j = blocks.begin(b);
    const int64_t end = blocks.end(b);
#if TFGC_HAVE_AVX2_PATH
    if (UseAvx2()) j = PackFullWordsAvx2(bits, j, std::min(end, n / 32), w);
#endif
    for (; j < end; ++j) {
      const int64_t first = j * kBitsPerWord;
      const int count =
          static_cast<int>(std::min<int64_t>(kBitsPerWord, n - first));
      w[j] = PackWord(bits + first, count);
    }
  });
  return absl::OkStatus();
}

template <>
absl::Status UnpackBits<CPUDevice>::operator()(OpKernelContext* ctx,
                                               const int32_t* words,
                                               int64_t rows, int64_t w,
                                               int64_t n, bool* mask) {
  const uint32_t* in = reinterpret_cast<const uint32_t*>(words);
  Blocks blocks(rows * w, NumThreads(ctx), kMinWordBlock);
  ForEachBlock(ctx, blocks, [&](int64_t b) {
    const int64_t end = blocks.end(b);
    for (int64_t g = blocks.begin(b); g < end; ++g) {
      const int64_t row = g / w;
      const int64_t j = g - row * w;
      const int64_t first = j * kBitsPerWord;
      const int count =
          static_cast<int>(std::min<int64_t>(kBitsPerWord, n - first));
      const uint32_t word = in[g];
      bool* dst = mask + row * n + first;
      for (int i = 0; i < count; ++i) dst[i] = (word >> i) & 1u;
    }
  });
  return absl::OkStatus();
}

template <typename T>
struct UnpackBitsSum<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          const T* scales, int64_t p, int64_t n, T* out) {
    return UnpackBitsReduceCpu<T, false>()(ctx, words, scales, p, n, out);
  }
};

template <typename T>
struct UnpackBitsVote<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          int64_t p, int64_t n, T* out) {
    return UnpackBitsReduceCpu<T, true>()(ctx, words, nullptr, p, n, out);
  }
};

#if GOOGLE_CUDA
// ---------------------------------------------------------------------------
// GPU functors over the launchers of bits_gpu.h.
// ---------------------------------------------------------------------------

template <>
absl::Status PackBits<GPUDevice>::operator()(OpKernelContext* ctx,
                                             const bool* mask, int64_t n,
                                             int32_t* words) {
  return CudaStatus(gpu::PackBits(mask, n, words, StreamOf(ctx)),
                    "PackBits");
}

template <>
absl::Status UnpackBits<GPUDevice>::operator()(OpKernelContext* ctx,
                                               const int32_t* words,
                                               int64_t rows, int64_t /*w*/,
                                               int64_t n, bool* mask) {
  return CudaStatus(gpu::UnpackBits(words, rows, n, mask, StreamOf(ctx)),
                    "UnpackBits");
}

template <typename T>
struct UnpackBitsSum<GPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          const T* scales, int64_t p, int64_t n, T* out) {
    return CudaStatus(gpu::UnpackBitsSum(words, ToCuda(scales), p, n,
                                         ToCuda(out), StreamOf(ctx)),
                      "UnpackBitsSum");
  }
};

template <typename T>
struct UnpackBitsVote<GPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          int64_t p, int64_t n, T* out) {
    return CudaStatus(
        gpu::UnpackBitsVote(words, p, n, ToCuda(out), StreamOf(ctx)),
        "UnpackBitsVote");
  }
};
#endif  // GOOGLE_CUDA

}  // namespace functor

namespace {

// ---------------------------------------------------------------------------
// Op kernels: validation and outputs, for every device.
// ---------------------------------------------------------------------------

template <typename Device>
class PackBitsOp : public OpKernel {
 public:
  explicit PackBitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& mask = ctx->input(0);
    const int64_t n = mask.NumElements();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({NumWords(n)}), &out));
    OP_REQUIRES_OK(ctx, functor::PackBits<Device>()(
                            ctx, mask.flat<bool>().data(), n,
                            out->flat<int32_t>().data()));
  }
};

absl::Status CheckWordsDim(int64_t got, int64_t n) {
  if (got != NumWords(n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`words` must have ceil(n / 32) = ", NumWords(n),
        " entries in its last axis for n=", n, ". Received: ", got));
  }
  return absl::OkStatus();
}

// A kernel of an op with the attribute `n` (bits per row), which must be
// non-negative.
class OpKernelWithN : public OpKernel {
 public:
  explicit OpKernelWithN(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
    OP_REQUIRES_OK(ctx, CheckNonNegative(n_, "n"));
  }

 protected:
  int64_t n_;
};

// Validates words [..., ceil(n / 32)] and allocates output 0, the mask
// [..., n].
absl::Status AllocateUnpacked(OpKernelContext* ctx, const Tensor& words,
                              int64_t n, Tensor** out) {
  if (words.dims() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("`words` must have rank >= 1. Received: shape=",
                     words.shape().DebugString()));
  }
  TF_RETURN_IF_ERROR(CheckWordsDim(words.dim_size(words.dims() - 1), n));
  TensorShape out_shape = words.shape();
  out_shape.set_dim(words.dims() - 1, n);
  return ctx->allocate_output(0, out_shape, out);
}

template <typename Device>
class UnpackBitsOp : public OpKernelWithN {
 public:
  using OpKernelWithN::OpKernelWithN;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& words = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateUnpacked(ctx, words, n_, &out));
    if (out->NumElements() == 0) return;
    const int64_t w = words.dim_size(words.dims() - 1);
    OP_REQUIRES_OK(ctx, functor::UnpackBits<Device>()(
                            ctx, words.flat<int32_t>().data(),
                            words.NumElements() / w, w, n_,
                            out->flat<bool>().data()));
  }
};

// Validates words [p, ceil(n / 32)] (and scales [p]) and allocates output 0,
// the result [n].
absl::Status AllocateReduced(OpKernelContext* ctx, const Tensor& words,
                             const Tensor* scales, int64_t n, Tensor** out) {
  if (!TensorShapeUtils::IsMatrix(words.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("`words` must be a matrix [p, ceil(n / 32)]. Received: "
                     "shape=",
                     words.shape().DebugString()));
  }
  TF_RETURN_IF_ERROR(CheckWordsDim(words.dim_size(1), n));
  if (scales != nullptr) {
    if (!TensorShapeUtils::IsVector(scales->shape()) ||
        scales->dim_size(0) != words.dim_size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`scales` must be a vector with one entry per row of `words`. "
          "Received: scales.shape=",
          scales->shape().DebugString(),
          ", words.shape=", words.shape().DebugString()));
    }
  }
  return ctx->allocate_output(0, TensorShape({n}), out);
}

template <typename Device, typename T, bool kVote>
class UnpackBitsReduceOp : public OpKernelWithN {
 public:
  using OpKernelWithN::OpKernelWithN;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& words = ctx->input(0);
    const Tensor* scales = kVote ? nullptr : &ctx->input(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateReduced(ctx, words, scales, n_, &out));
    if (n_ == 0) return;
    const int32_t* w = words.flat<int32_t>().data();
    const int64_t p = words.dim_size(0);
    T* dst = out->flat<T>().data();
    if constexpr (kVote) {
      OP_REQUIRES_OK(
          ctx, (functor::UnpackBitsVote<Device, T>()(ctx, w, p, n_, dst)));
    } else {
      OP_REQUIRES_OK(ctx, (functor::UnpackBitsSum<Device, T>()(
                              ctx, w, scales->flat<T>().data(), p, n_, dst)));
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>PackBits").Device(DEVICE_CPU),
                        PackBitsOp<CPUDevice>);
REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackBits").Device(DEVICE_CPU),
                        UnpackBitsOp<CPUDevice>);

#define REGISTER_CPU(T)                                                     \
  REGISTER_KERNEL_BUILDER(                                                  \
      Name("Tfgc>UnpackBitsSum").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      UnpackBitsReduceOp<CPUDevice, T, false>);                             \
  REGISTER_KERNEL_BUILDER(                                                  \
      Name("Tfgc>UnpackBitsVote").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      UnpackBitsReduceOp<CPUDevice, T, true>);

REGISTER_CPU(float)
REGISTER_CPU(Eigen::half)
REGISTER_CPU(Eigen::bfloat16)

#undef REGISTER_CPU

#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("Tfgc>PackBits").Device(tensorflow::DEVICE_GPU),
                        PackBitsOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(
    Name("Tfgc>UnpackBits").Device(tensorflow::DEVICE_GPU),
    UnpackBitsOp<GPUDevice>);

#define REGISTER_GPU(T)                                                 \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackBitsSum")                    \
                              .Device(tensorflow::DEVICE_GPU)           \
                              .TypeConstraint<T>("T"),                  \
                          UnpackBitsReduceOp<GPUDevice, T, false>);     \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackBitsVote")                   \
                              .Device(tensorflow::DEVICE_GPU)           \
                              .TypeConstraint<T>("T"),                  \
                          UnpackBitsReduceOp<GPUDevice, T, true>);

REGISTER_GPU(float)
REGISTER_GPU(Eigen::half)
REGISTER_GPU(Eigen::bfloat16)

#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
