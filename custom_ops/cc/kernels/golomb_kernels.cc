// Copyright 2026 The tfgc Authors.
//
// Op kernels of Tfgc>GolombEncode and Tfgc>GolombDecode (format in
// golomb_common.h), templated on the device: they validate the inputs,
// allocate the outputs and turn what functor::GolombEncode and
// functor::GolombDecode (golomb_kernels.h) find wrong in the data into
// errors. On the CPU, encoding validates and sizes the codes of blocks of
// positions in parallel on the intra-op pool, then writes the blocks in
// parallel from their prefix-summed bit offsets; decoding is sequential.
// Under GOOGLE_CUDA the GPU functors call the launchers of golomb_gpu.h.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/golomb_common.h"
#include "custom_ops/cc/kernels/golomb_kernels.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"

#if GOOGLE_CUDA
#include "custom_ops/cc/kernels/golomb_gpu.h"
#endif  // GOOGLE_CUDA

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

}  // namespace

namespace functor {

// ---------------------------------------------------------------------------
// CPU functors.
// ---------------------------------------------------------------------------

template <typename T>
class GolombEncode<CPUDevice, T> {
 public:
  absl::Status Size(OpKernelContext* ctx, const T* idx, int64_t k, int64_t n,
                    int b, uint64_t* num_bits, EncodeFault* fault) {
    blocks_ = Blocks(k, NumThreads(ctx), kMinEncodeBlock);
    const int64_t num_blocks = blocks_.count();
    std::vector<uint64_t> block_bits(num_blocks, 0);
    std::vector<int64_t> first_bad(num_blocks, -1);
    ForEachBlock(ctx, blocks_, [&](int64_t blk) {
      uint64_t bits = 0;
      const int64_t end = blocks_.end(blk);
      for (int64_t j = blocks_.begin(blk); j < end; ++j) {
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
        fault->position = j;
        fault->value = static_cast<int64_t>(idx[j]);
        fault->prev = j == 0 ? -1 : static_cast<int64_t>(idx[j - 1]);
        return absl::OkStatus();
      }
    }
    // The gaps of valid positions sum to less than n, so no sum wraps.
    offsets_.assign(num_blocks + 1, 0);
    uint64_t total = 0;
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      total += block_bits[blk];
      offsets_[blk + 1] = static_cast<int64_t>(total);
    }
    *num_bits = total;
    return absl::OkStatus();
  }

  // Every block writes its own bytes; the byte a block shares with the one
  // before goes to heads[blk] and is OR-ed in afterwards.
  absl::Status Write(OpKernelContext* ctx, const T* idx, int64_t /*k*/,
                     int b, int64_t num_bits, uint8_t* out) {
    const int64_t num_blocks = blocks_.count();
    const int64_t num_bytes = (num_bits + 7) / 8;
    if (num_blocks > 1) std::memset(out, 0, num_bytes);
    std::vector<uint8_t> heads(num_blocks, 0);
    ForEachBlock(ctx, blocks_, [&](int64_t blk) {
      const int64_t offset = offsets_[blk];
      const int64_t shared = (blk > 0 && (offset & 7) != 0) ? offset >> 3 : -1;
      golomb::BitWriter writer(out, offset, shared, &heads[blk]);
      const int64_t end = blocks_.end(blk);
      for (int64_t j = blocks_.begin(blk); j < end; ++j) {
        const int64_t prev = j == 0 ? -1 : static_cast<int64_t>(idx[j - 1]);
        const int64_t cur = static_cast<int64_t>(idx[j]);
        writer.PutCode(static_cast<uint64_t>(cur - prev - 1), b);
      }
      writer.Flush();
    });
    for (int64_t blk = 1; blk < num_blocks; ++blk) {
      if ((offsets_[blk] & 7) != 0) out[offsets_[blk] >> 3] |= heads[blk];
    }
    return absl::OkStatus();
  }

 private:
  Blocks blocks_{0, 1};
  std::vector<int64_t> offsets_;  // the blocks' first bits, then the total
};

template <>
absl::Status GolombDecode<CPUDevice>::operator()(
    OpKernelContext* /*ctx*/, const uint8_t* encoded, int64_t num_bytes,
    int64_t k, int b, int64_t limit, int32_t* out, DecodeFault* fault) {
  golomb::BitReader reader(encoded, num_bytes);
  const int64_t num_bits = reader.num_bits();
  const uint64_t r_mask = (uint64_t{1} << b) - 1;
  const uint64_t max_q = static_cast<uint64_t>(limit) >> b;
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
      while (ones == 64 && reader.pos() < num_bits) {
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
    if (reader.pos() > num_bits) {
      *fault = {golomb::kDecodeTruncated, j, 0};
      return absl::OkStatus();
    }
    if (q > max_q) {
      *fault = {golomb::kDecodeQuotientTooLarge, j,
                prev + 1 + static_cast<int64_t>((max_q + 1) << b)};
      return absl::OkStatus();
    }
    const int64_t pos = prev + 1 + static_cast<int64_t>((q << b) | r);
    if (pos >= limit) {
      *fault = {golomb::kDecodePositionTooLarge, j, pos};
      return absl::OkStatus();
    }
    out[j] = static_cast<int32_t>(pos);
    prev = pos;
  }
  return absl::OkStatus();
}

#if GOOGLE_CUDA
// ---------------------------------------------------------------------------
// GPU functors over the launchers of golomb_gpu.h. Both launchers wait for
// the device's validity flags, so that the kernels fail like the CPU ones,
// with the same messages; the encoder's size is copied to the host before
// the kernel allocates the stream.
// ---------------------------------------------------------------------------

template <typename T>
class GolombEncode<GPUDevice, T> {
 public:
  absl::Status Size(OpKernelContext* ctx, const T* idx, int64_t k, int64_t n,
                    int b, uint64_t* num_bits, EncodeFault* fault) {
    TF_RETURN_IF_ERROR(
        AllocateScratch(ctx, gpu::GolombEncodeScratchBytes(k), &scratch_));
    int64_t bits = 0;
    TF_RETURN_IF_ERROR(CudaStatus(
        gpu::GolombEncodeSize(idx, k, n, b, Scratch(), StreamOf(ctx), &bits,
                              &fault->position, &fault->value, &fault->prev),
        "EncodeSize"));
    *num_bits = static_cast<uint64_t>(bits);
    return absl::OkStatus();
  }

  absl::Status Write(OpKernelContext* ctx, const T* idx, int64_t k, int b,
                     int64_t num_bits, uint8_t* out) {
    Tensor words;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        tensorflow::DT_UINT32, TensorShape({(num_bits + 31) / 32}), &words));
    return CudaStatus(
        gpu::GolombEncodeWrite(idx, k, b, num_bits, Scratch(),
                               words.flat<uint32_t>().data(), out,
                               StreamOf(ctx)),
        "EncodeWrite");
  }

 private:
  void* Scratch() { return scratch_.flat<int8_t>().data(); }

  Tensor scratch_;  // the codes' bit offsets, from Size to Write
};

template <>
absl::Status GolombDecode<GPUDevice>::operator()(
    OpKernelContext* ctx, const uint8_t* encoded, int64_t num_bytes,
    int64_t k, int b, int64_t limit, int32_t* out, DecodeFault* fault) {
  Tensor scratch;
  TF_RETURN_IF_ERROR(AllocateScratch(
      ctx, gpu::GolombDecodeScratchBytes(num_bytes, b), &scratch));
  int64_t error[3] = {0, 0, 0};
  TF_RETURN_IF_ERROR(CudaStatus(
      gpu::GolombDecode(encoded, num_bytes, k, b, limit, out,
                        scratch.flat<int8_t>().data(), StreamOf(ctx), error),
      "Decode"));
  fault->error = error[0];
  fault->j = error[1];
  fault->value = error[2];
  return absl::OkStatus();
}
#endif  // GOOGLE_CUDA

}  // namespace functor

namespace {

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

// Why indices[j] = cur is invalid (out of range, or not above
// indices[j - 1] = prev).
absl::Status IndexError(const functor::EncodeFault& f, int64_t n) {
  if (f.value < 0 || f.value >= n) {
    return IndexOutOfRange(f.position, f.value, n);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "`indices` must be strictly increasing (sorted, no duplicates). "
      "Received: indices[",
      f.position - 1, "]=", f.prev, ", indices[", f.position, "]=", f.value));
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
  TF_RETURN_IF_ERROR(CheckNonNegative(*n, "n"));
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
  TF_RETURN_IF_ERROR(CheckNonNegative(a->k, "k"));
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

// The error of what the decoder found wrong.
absl::Status DecodeError(const DecodeArgs& a, const functor::DecodeFault& f) {
  if (f.error == golomb::kDecodeTruncated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`encoded` (", a.num_bits, " bits) ends inside the code of position ",
        f.j, " of k=", a.k, " with b=", a.b,
        ": the stream is truncated or was encoded with another k or b"));
  }
  // Position j decodes to f.value (at least f.value when only a lower bound
  // of it is known) outside [0, limit).
  const bool at_least = f.error == golomb::kDecodeQuotientTooLarge;
  return absl::InvalidArgumentError(absl::StrCat(
      "Decoded position ", f.j, " of k=", a.k, " is ",
      at_least ? "at least " : "", f.value, ", outside [0, ", a.limit,
      ") (n=", a.n, ", int32 positions); wrong b=", a.b,
      " or corrupt stream"));
}

// ---------------------------------------------------------------------------
// Op kernels: validation and outputs, for every device.
// ---------------------------------------------------------------------------

template <typename Device, typename T>
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
    functor::GolombEncode<Device, T> encode;
    uint64_t total_bits = 0;
    functor::EncodeFault fault;
    OP_REQUIRES_OK(ctx, encode.Size(ctx, idx, k, n, b, &total_bits, &fault));
    OP_REQUIRES(ctx, fault.position < 0, IndexError(fault, n));
    OP_REQUIRES_OK(ctx, CheckEncodedBits(total_bits, k, n, b));
    const auto bits = static_cast<int64_t>(total_bits);
    const int64_t num_bytes = (bits + 7) / 8;
    Tensor* encoded = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_bytes}),
                                             &encoded));
    // num_bits is a host-memory output on the GPU too.
    Tensor* num_bits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &num_bits));
    num_bits->scalar<int64_t>()() = bits;
    if (num_bytes == 0) return;
    OP_REQUIRES_OK(ctx, encode.Write(ctx, idx, k, b, bits,
                                     encoded->flat<uint8_t>().data()));
  }
};

template <typename Device, typename Tk>
class GolombDecodeOp : public OpKernel {
 public:
  explicit GolombDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    DecodeArgs a;
    OP_REQUIRES_OK(ctx, ReadDecodeArgs<Tk>(ctx, &a));
    const Tensor& encoded = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({a.k}), &out));
    if (a.k == 0) return;
    functor::DecodeFault fault;
    OP_REQUIRES_OK(ctx, functor::GolombDecode<Device>()(
                            ctx, encoded.flat<uint8_t>().data(),
                            encoded.NumElements(), a.k, a.b, a.limit,
                            out->flat<int32_t>().data(), &fault));
    OP_REQUIRES(ctx, fault.error == golomb::kDecodeOk, DecodeError(a, fault));
  }
};

#define REGISTER_CPU(T)                                                   \
  REGISTER_KERNEL_BUILDER(                                                \
      Name("Tfgc>GolombEncode").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      GolombEncodeOp<CPUDevice, T>);                                      \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombDecode")                       \
                              .Device(DEVICE_CPU)                         \
                              .TypeConstraint<T>("Tk"),                   \
                          GolombDecodeOp<CPUDevice, T>);

REGISTER_CPU(int32_t)
REGISTER_CPU(int64_t)

#undef REGISTER_CPU

#if GOOGLE_CUDA
// n, b and k live in host memory, and so does the output num_bits.
#define REGISTER_GPU(T)                                       \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombEncode")           \
                              .Device(tensorflow::DEVICE_GPU) \
                              .HostMemory("n")                \
                              .HostMemory("b")                \
                              .HostMemory("num_bits")         \
                              .TypeConstraint<T>("T"),        \
                          GolombEncodeOp<GPUDevice, T>);      \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>GolombDecode")           \
                              .Device(tensorflow::DEVICE_GPU) \
                              .HostMemory("k")                \
                              .HostMemory("b")                \
                              .HostMemory("n")                \
                              .TypeConstraint<T>("Tk"),       \
                          GolombDecodeOp<GPUDevice, T>);

REGISTER_GPU(int32_t)
REGISTER_GPU(int64_t)

#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
