// Copyright 2026 The tfgc Authors.
//
// CPU kernels of Tfgc>GolombEncode and Tfgc>GolombDecode (format in
// golomb_kernels.h). Encoding validates and sizes the codes of blocks of
// positions in parallel on the intra-op pool, then writes the blocks in
// parallel from their prefix-summed bit offsets; decoding is sequential.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/golomb_kernels.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"


namespace tfgc {
namespace {

// Positions per block of the parallel encoder.
constexpr int64_t kMinEncodeBlock = int64_t{1} << 15;
// Largest stream the encoder writes (4 GiB); a larger one means b is far
// too small for the gaps.
constexpr int64_t kMaxEncodedBits = int64_t{1} << 35;
// Decoded positions are int32.
constexpr int64_t kInt32Limit =
    static_cast<int64_t>(std::numeric_limits<int32_t>::max()) + 1;

absl::Status CheckScalar(const Tensor& t, const char* name) {
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", name, "` must be a scalar. Received: shape=",
                     t.shape().DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckB(const Tensor& t, int* b) {
  TF_RETURN_IF_ERROR(CheckScalar(t, "b"));
  const int32_t v = t.scalar<int32_t>()();
  if (v < 0 || v > golomb::kMaxB) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`b` must be in [0, ", golomb::kMaxB, "]. Received: b=", v));
  }
  *b = v;
  return absl::OkStatus();
}

// The checks and messages the CPU and the GPU kernels share.

// Why indices[j] = cur is invalid (out of range, or not above
// indices[j - 1] = prev).
absl::Status IndexError(int64_t j, int64_t cur, int64_t prev, int64_t n) {
  if (cur < 0 || cur >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("`indices` must be in [0, n). Received: indices[", j,
                     "]=", cur, " with n=", n));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "`indices` must be strictly increasing (sorted, no duplicates). "
      "Received: indices[",
      j - 1, "]=", prev, ", indices[", j, "]=", cur));
}

// Validates GolombEncode's inputs (indices, n, b) and reads n and b.
absl::Status ReadEncodeArgs(OpKernelContext* ctx, int64_t* n, int* b) {
  const Tensor& indices = ctx->input(0);
  if (!TensorShapeUtils::IsVector(indices.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("`indices` must be a vector. Received: shape=",
                     indices.shape().DebugString()));
  }
  TF_RETURN_IF_ERROR(CheckScalar(ctx->input(1), "n"));
  *n = ctx->input(1).scalar<int64_t>()();
  if (*n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("`n` must be non-negative. Received: n=", *n));
  }
  return CheckB(ctx->input(2), b);
}

absl::Status CheckEncodedBits(uint64_t bits, int64_t k, int64_t n, int b) {
  if (bits <= static_cast<uint64_t>(kMaxEncodedBits)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "The Golomb stream of k=", k, " positions in n=", n, " with b=", b,
      " would exceed ", kMaxEncodedBits,
      " bits; use a larger `b` (golomb_optimal_b(k, n))"));
}

// GolombDecode's scalars, validated.
struct DecodeArgs {
  int64_t k = 0;
  int b = 0;
  int64_t n = 0;
  int64_t limit = 0;     // positions must be below it: n if given, and int32
  int64_t num_bits = 0;  // of `encoded`
};

// Validates GolombDecode's inputs (encoded, k, b, n) and reads them.
template <typename Tk>
absl::Status ReadDecodeArgs(OpKernelContext* ctx, DecodeArgs* a) {
  const Tensor& encoded = ctx->input(0);
  if (!TensorShapeUtils::IsVector(encoded.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("`encoded` must be a vector of bytes. Received: shape=",
                     encoded.shape().DebugString()));
  }
  TF_RETURN_IF_ERROR(CheckScalar(ctx->input(1), "k"));
  TF_RETURN_IF_ERROR(CheckScalar(ctx->input(3), "n"));
  a->k = static_cast<int64_t>(ctx->input(1).scalar<Tk>()());
  if (a->k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("`k` must be non-negative. Received: k=", a->k));
  }
  TF_RETURN_IF_ERROR(CheckB(ctx->input(2), &a->b));
  a->n = ctx->input(3).scalar<int64_t>()();
  a->limit = a->n >= 0 ? std::min(a->n, kInt32Limit) : kInt32Limit;
  a->num_bits = encoded.NumElements() * 8;
  // Every code takes at least 1 + b bits.
  if (a->k > a->num_bits / (1 + a->b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`encoded` (", a->num_bits, " bits) is too short for k=", a->k,
        " codes of at least 1 + b=", 1 + a->b,
        " bits: the stream is truncated or was encoded with another k or "
        "b"));
  }
  return absl::OkStatus();
}

absl::Status TruncatedError(const DecodeArgs& a, int64_t j) {
  return absl::InvalidArgumentError(absl::StrCat(
      "`encoded` (", a.num_bits, " bits) ends inside the code of position ",
      j, " of k=", a.k, " with b=", a.b,
      ": the stream is truncated or was encoded with another k or b"));
}

// Position j decodes to `pos` (`at_least` when only a lower bound of it is
// known) outside [0, limit).
absl::Status PositionError(const DecodeArgs& a, int64_t j, int64_t pos,
                           bool at_least) {
  return absl::InvalidArgumentError(absl::StrCat(
      "Decoded position ", j, " of k=", a.k, " is ",
      at_least ? "at least " : "", pos, ", outside [0, ", a.limit,
      ") (n=", a.n, ", int32 positions); wrong b=", a.b,
      " or corrupt stream"));
}

template <typename T>
class GolombEncodeOp : public OpKernel {
 public:
  explicit GolombEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t n = 0;
    int b = 0;
    OP_REQUIRES_OK(ctx, ReadEncodeArgs(ctx, &n, &b));
    const Tensor& indices = ctx->input(0);
    const int64_t k = indices.NumElements();
    const T* idx = indices.flat<T>().data();

    // Pass 1: validate and count the bits of each block.
    const Blocks blocks(k, NumThreads(ctx), kMinEncodeBlock);
    const int64_t num_blocks = blocks.count();
    std::vector<uint64_t> block_bits(num_blocks, 0);
    std::vector<int64_t> first_bad(num_blocks, -1);
    ForEachBlock(ctx, blocks, [&](int64_t blk) {
      uint64_t bits = 0;
      const int64_t end = blocks.end(blk);
      for (int64_t j = blocks.begin(blk); j < end; ++j) {
        const int64_t prev = j == 0 ? -1 : static_cast<int64_t>(idx[j - 1]);
        const int64_t cur = static_cast<int64_t>(idx[j]);
        if (cur <= prev || cur >= n) {
          first_bad[blk] = j;
          return;
        }
        bits += golomb::CodeBits(static_cast<uint64_t>(cur - prev - 1), b);
      }
      block_bits[blk] = bits;
    });
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      const int64_t j = first_bad[blk];
      if (j >= 0) {
        const int64_t prev = j == 0 ? -1 : static_cast<int64_t>(idx[j - 1]);
        OP_REQUIRES_OK(ctx, IndexError(j, static_cast<int64_t>(idx[j]), prev,
                                       n));
      }
    }
    std::vector<int64_t> offsets(num_blocks + 1, 0);
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      const uint64_t next = static_cast<uint64_t>(offsets[blk]) +
                            block_bits[blk];
      OP_REQUIRES_OK(ctx, CheckEncodedBits(next, k, n, b));
      offsets[blk + 1] = static_cast<int64_t>(next);
    }
    const int64_t total_bits = offsets[num_blocks];
    const int64_t num_bytes = (total_bits + 7) / 8;

    Tensor* encoded = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_bytes}),
                                             &encoded));
    Tensor* num_bits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &num_bits));
    num_bits->scalar<int64_t>()() = total_bits;
    if (num_bytes == 0) return;
    uint8_t* out = encoded->flat<uint8_t>().data();

    // Pass 2: every block writes its own bytes; the byte a block shares
    // with the one before goes to heads[blk] and is OR-ed in afterwards.
    if (num_blocks > 1) std::memset(out, 0, num_bytes);
    std::vector<uint8_t> heads(num_blocks, 0);
    ForEachBlock(ctx, blocks, [&](int64_t blk) {
      const int64_t offset = offsets[blk];
      const int64_t shared = (blk > 0 && (offset & 7) != 0) ? offset >> 3 : -1;
      golomb::BitWriter writer(out, offset, shared, &heads[blk]);
      const int64_t end = blocks.end(blk);
      for (int64_t j = blocks.begin(blk); j < end; ++j) {
        const int64_t prev = j == 0 ? -1 : static_cast<int64_t>(idx[j - 1]);
        const int64_t cur = static_cast<int64_t>(idx[j]);
        writer.PutCode(static_cast<uint64_t>(cur - prev - 1), b);
      }
      writer.Flush();
    });
    for (int64_t blk = 1; blk < num_blocks; ++blk) {
      if ((offsets[blk] & 7) != 0) out[offsets[blk] >> 3] |= heads[blk];
    }
  }
};

template <typename Tk>
class GolombDecodeOp : public OpKernel {
 public:
  explicit GolombDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    DecodeArgs a;
    OP_REQUIRES_OK(ctx, ReadDecodeArgs<Tk>(ctx, &a));
    const int64_t k = a.k;
    const int b = a.b;
    const Tensor& encoded = ctx->input(0);
    golomb::BitReader reader(encoded.flat<uint8_t>().data(),
                             encoded.NumElements());
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &out_t));
    int32_t* out = out_t->flat<int32_t>().data();
    const uint64_t r_mask = (uint64_t{1} << b) - 1;
    const uint64_t max_q = static_cast<uint64_t>(a.limit) >> b;
    int64_t prev = -1;
    for (int64_t j = 0; j < k; ++j) {
      uint64_t q = 0;
      uint64_t r = 0;
      uint64_t w = reader.Peek();
      int ones = golomb::LeadingOnes(w);
      if (ones + 1 + b <= 63) {
        // The whole code is in the window.
        q = ones;
        r = (w >> (63 - ones - b)) & r_mask;
        reader.Skip(ones + 1 + b);
      } else {
        while (ones == 64 && reader.pos() < a.num_bits) {
          q += 64;
          reader.Skip(64);
          w = reader.Peek();
          ones = golomb::LeadingOnes(w);
        }
        q += ones;
        reader.Skip(ones + 1);
        if (b > 0) r = reader.Peek() >> (64 - b);
        reader.Skip(b);
      }
      OP_REQUIRES(ctx, reader.pos() <= a.num_bits, TruncatedError(a, j));
      OP_REQUIRES(
          ctx, q <= max_q,
          PositionError(
              a, j,
              prev + 1 + static_cast<int64_t>(std::min(q, max_q + 1) << b),
              /*at_least=*/true));
      const int64_t pos = prev + 1 + static_cast<int64_t>((q << b) | r);
      OP_REQUIRES(ctx, pos < a.limit,
                  PositionError(a, j, pos, /*at_least=*/false));
      out[j] = static_cast<int32_t>(pos);
      prev = pos;
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombEncode")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int32_t>("T"),
                        GolombEncodeOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombEncode")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int64_t>("T"),
                        GolombEncodeOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombDecode")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int32_t>("Tk"),
                        GolombDecodeOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombDecode")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<int64_t>("Tk"),
                        GolombDecodeOp<int64_t>);

#if GOOGLE_CUDA
// ---------------------------------------------------------------------------
// GPU glue over the launchers of golomb_kernels.cu.cc. n, b and k live in
// host memory; the encoder's output size is copied back before the output
// is allocated, and both ops wait for the device's validity flags so that
// they fail like the CPU kernels, with the same messages.
// ---------------------------------------------------------------------------
template <typename T>
class GolombEncodeGpuOp : public OpKernel {
 public:
  explicit GolombEncodeGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t n = 0;
    int b = 0;
    OP_REQUIRES_OK(ctx, ReadEncodeArgs(ctx, &n, &b));
    const Tensor& indices = ctx->input(0);
    const int64_t k = indices.NumElements();
    constexpr bool kInt64 = std::is_same<T, int64_t>::value;
    const void* idx = indices.flat<T>().data();
    void* stream = StreamOf(ctx);
    Tensor scratch;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_temp(
                 tensorflow::DT_INT8,
                 TensorShape({gpu::GolombEncodeScratchBytes(k)}), &scratch));
    void* scratch_p = scratch.flat<int8_t>().data();
    int64_t total_bits = 0, bad = -1, bad_value = 0, bad_prev = 0;
    OP_REQUIRES_OK(ctx, CudaStatus(gpu::GolombEncodeSize(
                                       kInt64, idx, k, n, b, scratch_p,
                                       stream, &total_bits, &bad, &bad_value,
                                       &bad_prev),
                                   "EncodeSize"));
    OP_REQUIRES(ctx, bad < 0, IndexError(bad, bad_value, bad_prev, n));
    OP_REQUIRES_OK(ctx, CheckEncodedBits(static_cast<uint64_t>(total_bits),
                                         k, n, b));
    const int64_t num_bytes = (total_bits + 7) / 8;
    Tensor* encoded = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_bytes}),
                                             &encoded));
    // num_bits is a host-memory output.
    Tensor* num_bits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &num_bits));
    num_bits->scalar<int64_t>()() = total_bits;
    if (num_bytes == 0) return;
    Tensor words;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            tensorflow::DT_UINT32,
                            TensorShape({(total_bits + 31) / 32}), &words));
    OP_REQUIRES_OK(ctx, CudaStatus(gpu::GolombEncodeWrite(
                                       kInt64, idx, k, b, total_bits,
                                       scratch_p, words.flat<uint32_t>().data(),
                                       encoded->flat<uint8_t>().data(),
                                       stream),
                                   "EncodeWrite"));
  }
};

template <typename Tk>
class GolombDecodeGpuOp : public OpKernel {
 public:
  explicit GolombDecodeGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    DecodeArgs a;
    OP_REQUIRES_OK(ctx, ReadDecodeArgs<Tk>(ctx, &a));
    const int64_t k = a.k;
    const Tensor& encoded = ctx->input(0);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &out_t));
    if (k == 0) return;
    Tensor scratch;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_temp(tensorflow::DT_INT8,
                                TensorShape({gpu::GolombDecodeScratchBytes(
                                    encoded.NumElements(), a.b)}),
                                &scratch));
    int64_t error[3] = {0, 0, 0};
    OP_REQUIRES_OK(
        ctx, CudaStatus(gpu::GolombDecode(
                            encoded.flat<uint8_t>().data(),
                            encoded.NumElements(), k, a.b, a.limit,
                            out_t->flat<int32_t>().data(),
                            scratch.flat<int8_t>().data(),
                            StreamOf(ctx), error),
                        "Decode"));
    const int64_t j = error[1];
    OP_REQUIRES(ctx, error[0] != gpu::kDecodeTruncated, TruncatedError(a, j));
    OP_REQUIRES(ctx, error[0] != gpu::kDecodeQuotientTooLarge,
                PositionError(a, j, error[2], /*at_least=*/true));
    OP_REQUIRES(ctx, error[0] != gpu::kDecodePositionTooLarge,
                PositionError(a, j, error[2], /*at_least=*/false));
  }
};

#define REGISTER_GPU(T)                                                  \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombEncode")                      \
                              .Device(tensorflow::DEVICE_GPU)            \
                              .HostMemory("n")                           \
                              .HostMemory("b")                           \
                              .HostMemory("num_bits")                    \
                              .TypeConstraint<T>("T"),                   \
                          GolombEncodeGpuOp<T>);                         \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombDecode")                      \
                              .Device(tensorflow::DEVICE_GPU)            \
                              .HostMemory("k")                           \
                              .HostMemory("b")                           \
                              .HostMemory("n")                           \
                              .TypeConstraint<T>("Tk"),                  \
                          GolombDecodeGpuOp<T>);

REGISTER_GPU(int32_t)
REGISTER_GPU(int64_t)

#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
