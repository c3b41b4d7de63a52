// Copyright 2026 The tfgc Authors.
//
// CPU kernels of the bit-packing ops (and their CUDA glue when built with
// GOOGLE_CUDA). Work is split over words on the intra-op thread pool.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/bits_kernels.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/simd.h"


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

class PackBitsOp : public OpKernel {
 public:
  explicit PackBitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& mask = ctx->input(0);
    const int64_t n = mask.NumElements();
    const int64_t words = NumWords(n);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({words}), &out));
    const uint8_t* bits =
        reinterpret_cast<const uint8_t*>(mask.flat<bool>().data());
    uint32_t* w = reinterpret_cast<uint32_t*>(out->flat<int32_t>().data());
    Blocks blocks(words, NumThreads(ctx), kMinWordBlock);
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
  }

 private:
#if TFGC_HAVE_AVX2_PATH
  // Packs the full words [begin, end): a byte's low bit shifted to its top
  // bit, then one movemask per 32 bytes. Returns the first word not packed.
  TFGC_AVX2 static int64_t PackFullWordsAvx2(const uint8_t* bits,
                                             int64_t begin, int64_t end,
                                             uint32_t* w) {
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
    OP_REQUIRES(ctx, n_ >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "`n` must be non-negative. Received: n=", n_)));
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

class UnpackBitsOp : public OpKernelWithN {
 public:
  using OpKernelWithN::OpKernelWithN;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& words = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateUnpacked(ctx, words, n_, &out));
    const int64_t w = words.dim_size(words.dims() - 1);
    if (out->NumElements() == 0) return;
    const uint32_t* in =
        reinterpret_cast<const uint32_t*>(words.flat<int32_t>().data());
    bool* mask = out->flat<bool>().data();
    const int64_t total = words.NumElements();
    const int64_t n = n_;
    Blocks blocks(total, NumThreads(ctx), kMinWordBlock);
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

template <typename T, bool kVote>
class UnpackBitsReduceOp : public OpKernelWithN {
 public:
  using OpKernelWithN::OpKernelWithN;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& words = ctx->input(0);
    const Tensor* scales = kVote ? nullptr : &ctx->input(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateReduced(ctx, words, scales, n_, &out));
    if (n_ == 0) return;
    const int64_t p = words.dim_size(0);
    const int64_t w = words.dim_size(1);
    const uint32_t* in =
        reinterpret_cast<const uint32_t*>(words.flat<int32_t>().data());
    std::vector<float> s(p);
    if (!kVote) {
      const T* sp = scales->flat<T>().data();
      for (int64_t i = 0; i < p; ++i) s[i] = static_cast<float>(sp[i]);
    }
    T* dst = out->flat<T>().data();
    const int64_t n = n_;
    Blocks blocks(w, NumThreads(ctx), std::max<int64_t>(1, kMinWordBlock / 
                                                               (p + 1)));
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
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>PackBits").Device(DEVICE_CPU), PackBitsOp);
REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackBits").Device(DEVICE_CPU),
                        UnpackBitsOp);

#define REGISTER_CPU(T)                                                    \
  REGISTER_KERNEL_BUILDER(                                                 \
      Name("Tfgc>UnpackBitsSum").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      UnpackBitsReduceOp<T, false>);                                       \
  REGISTER_KERNEL_BUILDER(                                                 \
      Name("Tfgc>UnpackBitsVote").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      UnpackBitsReduceOp<T, true>);

REGISTER_CPU(float)
REGISTER_CPU(Eigen::half)
REGISTER_CPU(Eigen::bfloat16)

#undef REGISTER_CPU

#if GOOGLE_CUDA
// ---------------------------------------------------------------------------
// GPU glue over the launchers of bits_kernels.cu.cc.
// ---------------------------------------------------------------------------

class PackBitsGpuOp : public OpKernel {
 public:
  explicit PackBitsGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& mask = ctx->input(0);
    const int64_t n = mask.NumElements();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({NumWords(n)}), &out));
    OP_REQUIRES_OK(ctx, CudaStatus(gpu::PackBits(mask.flat<bool>().data(), n,
                                                 out->flat<int32_t>().data(),
                                                 StreamOf(ctx)),
                                   "PackBits"));
  }
};

class UnpackBitsGpuOp : public OpKernelWithN {
 public:
  using OpKernelWithN::OpKernelWithN;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& words = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateUnpacked(ctx, words, n_, &out));
    const int64_t w = words.dim_size(words.dims() - 1);
    const int64_t rows = w == 0 ? 0 : words.NumElements() / w;
    OP_REQUIRES_OK(ctx, CudaStatus(gpu::UnpackBits(
                                       words.flat<int32_t>().data(), rows, n_,
                                       out->flat<bool>().data(), StreamOf(ctx)),
                                   "UnpackBits"));
  }
};

template <typename T, bool kVote>
class UnpackBitsReduceGpuOp : public OpKernelWithN {
 public:
  using OpKernelWithN::OpKernelWithN;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& words = ctx->input(0);
    const Tensor* scales = kVote ? nullptr : &ctx->input(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateReduced(ctx, words, scales, n_, &out));
    const int64_t p = words.dim_size(0);
    const int err =
        kVote ? gpu::UnpackBitsVote(GpuDType<T>(),
                                    words.flat<int32_t>().data(), p, n_,
                                    out->flat<T>().data(), StreamOf(ctx))
              : gpu::UnpackBitsSum(GpuDType<T>(),
                                   words.flat<int32_t>().data(),
                                   scales->flat<T>().data(), p, n_,
                                   out->flat<T>().data(), StreamOf(ctx));
    OP_REQUIRES_OK(ctx, CudaStatus(err, kVote ? "UnpackBitsVote"
                                              : "UnpackBitsSum"));
  }
};

REGISTER_KERNEL_BUILDER(
    Name("Tfgc>PackBits").Device(tensorflow::DEVICE_GPU), PackBitsGpuOp);
REGISTER_KERNEL_BUILDER(
    Name("Tfgc>UnpackBits").Device(tensorflow::DEVICE_GPU), UnpackBitsGpuOp);

#define REGISTER_GPU(T)                                           \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackBitsSum")              \
                              .Device(tensorflow::DEVICE_GPU)     \
                              .TypeConstraint<T>("T"),            \
                          UnpackBitsReduceGpuOp<T, false>);       \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>UnpackBitsVote")             \
                              .Device(tensorflow::DEVICE_GPU)     \
                              .TypeConstraint<T>("T"),            \
                          UnpackBitsReduceGpuOp<T, true>);

REGISTER_GPU(float)
REGISTER_GPU(Eigen::half)
REGISTER_GPU(Eigen::bfloat16)

#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
