// Copyright 2026 The tfgc Authors.
//
// The op kernel of ScatterAddSum, templated on the device: it validates the
// inputs, allocates the output and reports the first index out of range
// that functor::ScatterAddSum (scatter_kernels.h) finds. Under GOOGLE_CUDA
// the GPU functor calls the launcher of scatter_gpu.h.
//
// The CPU functor cuts the output into tiles of kScatterTile elements. Three
// passes: count the values per (input chunk, tile) while checking the
// indices; bucket them by tile, chunk after chunk (a stable counting sort);
// then per tile, zero its float32 accumulators and add its bucket in order.
// Each output element is thus written once, from cache, and sums its values
// in input order, from +0 and left to right in float32, whatever the thread
// count: the result is deterministic and equals a serial loop's (with
// subnormals flushed, as TensorFlow runs CPU kernels; the CUDA kernel
// flushes them too and gives the same bits). No atomics, no locks.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/kernels/kernel_utils.h"
#include "custom_ops/cc/kernels/parallel.h"
#include "custom_ops/cc/kernels/scatter_kernels.h"

#if GOOGLE_CUDA
#include "custom_ops/cc/kernels/scatter_gpu.h"
#endif  // GOOGLE_CUDA

namespace tfgc {
namespace {

// Input chunks of at least this many values (counted and bucketed by one
// thread each).
constexpr int64_t kMinChunk = int64_t{1} << 14;
// Output tiles per parallel block: 2^18 elements, so small outputs stay on
// the calling thread (a hand-off costs more than zeroing 1 MiB).
constexpr int64_t kMinTilesPerBlock = (int64_t{1} << 18) / kScatterTile;

// Sums the entries [e, e_end) of one tile into out[0, len).
void SumTile(const ScatterEntry* e, const ScatterEntry* e_end, int64_t len,
             float* out, float* /*buffer*/) {
  std::fill(out, out + len, 0.0f);
  for (; e < e_end; ++e) out[e->offset] += e->value;
}

// Half and bfloat16: accumulate in the float32 `buffer` of kScatterTile
// elements, round once. A conversion costs about as much as an addition
// here (no F16C), so a sparse tile zeroes the output bytes (+0 in both
// formats) and converts only the elements it touches.
template <typename T>
void SumTile(const ScatterEntry* e, const ScatterEntry* e_end, int64_t len,
             T* out, float* buffer) {
  if (2 * (e_end - e) < len) {
    std::memset(static_cast<void*>(out), 0, len * sizeof(T));
    for (const ScatterEntry* p = e; p < e_end; ++p) buffer[p->offset] = 0.0f;
    for (const ScatterEntry* p = e; p < e_end; ++p) {
      buffer[p->offset] += p->value;
    }
    for (; e < e_end; ++e) out[e->offset] = static_cast<T>(buffer[e->offset]);
    return;
  }
  std::fill(buffer, buffer + len, 0.0f);
  for (; e < e_end; ++e) buffer[e->offset] += e->value;
  for (int64_t i = 0; i < len; ++i) out[i] = static_cast<T>(buffer[i]);
}

}  // namespace

namespace functor {

template <typename T>
struct ScatterAddSum<CPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const T* v,
                          const int32_t* idx, int64_t m, int64_t n, T* dst,
                          int64_t* bad_position, int32_t* bad_index) {
    const int threads = NumThreads(ctx);
    const int64_t tiles = (n + kScatterTile - 1) >> kScatterTileBits;
    const Blocks chunks(m, threads, kMinChunk);
    const int64_t num_chunks = chunks.count();

    // Pass 1: counts[c * tiles + t] = values of chunk c that fall in tile t;
    // bad[c] = first position of chunk c with an index outside [0, n).
    std::vector<int64_t> counts(num_chunks * tiles, 0);
    std::vector<int64_t> bad(num_chunks, -1);
    ForEachBlock(ctx, chunks, [&](int64_t c) {
      int64_t* count = counts.data() + c * tiles;
      const int64_t end = chunks.end(c);
      for (int64_t i = chunks.begin(c); i < end; ++i) {
        const int32_t j = idx[i];
        if (j < 0 || j >= n) {
          bad[c] = i;
          return;
        }
        ++count[j >> kScatterTileBits];
      }
    });
    *bad_position = -1;
    for (int64_t c = 0; c < num_chunks; ++c) {
      if (bad[c] >= 0) {
        *bad_position = bad[c];
        *bad_index = idx[bad[c]];
        return absl::OkStatus();
      }
    }

    // Bucket offsets: tile by tile, and chunk by chunk inside a tile, so a
    // tile's bucket lists its values in input order. counts becomes each
    // (chunk, tile)'s next write position.
    std::vector<int64_t> tile_start(tiles + 1);
    int64_t pos = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      tile_start[t] = pos;
      for (int64_t c = 0; c < num_chunks; ++c) {
        const int64_t count = counts[c * tiles + t];
        counts[c * tiles + t] = pos;
        pos += count;
      }
    }
    tile_start[tiles] = pos;

    // Pass 2: bucket (offset in tile, float32 value) pairs.
    static_assert(sizeof(ScatterEntry) == sizeof(int64_t), "entry size");
    Tensor entries_t;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64,
                                          TensorShape({m}), &entries_t));
    ScatterEntry* entries =
        reinterpret_cast<ScatterEntry*>(entries_t.flat<int64_t>().data());
    ForEachBlock(ctx, chunks, [&](int64_t c) {
      int64_t* next = counts.data() + c * tiles;
      const int64_t end = chunks.end(c);
      for (int64_t i = chunks.begin(c); i < end; ++i) {
        const int32_t j = idx[i];
        entries[next[j >> kScatterTileBits]++] = {
            static_cast<uint32_t>(j & (kScatterTile - 1)),
            static_cast<float>(v[i])};
      }
    });

    // Pass 3: per tile, zero the accumulators, add the bucket, store.
    const Blocks tile_blocks(tiles, threads, kMinTilesPerBlock);
    ForEachBlock(ctx, tile_blocks, [&](int64_t b) {
      std::unique_ptr<float[]> buffer(
          std::is_same<T, float>::value ? nullptr : new float[kScatterTile]);
      const int64_t end = tile_blocks.end(b);
      for (int64_t t = tile_blocks.begin(b); t < end; ++t) {
        const int64_t first = t << kScatterTileBits;
        SumTile(entries + tile_start[t], entries + tile_start[t + 1],
                std::min(kScatterTile, n - first), dst + first,
                buffer.get());
      }
    });
    return absl::OkStatus();
  }
};

#if GOOGLE_CUDA
// The launcher of scatter_gpu.h, with a scratch from TensorFlow's allocator.
template <typename T>
struct ScatterAddSum<GPUDevice, T> {
  absl::Status operator()(OpKernelContext* ctx, const T* values,
                          const int32_t* indices, int64_t m, int64_t n,
                          T* out, int64_t* bad_position, int32_t* bad_index) {
    Tensor scratch;
    TF_RETURN_IF_ERROR(
        AllocateScratch(ctx, gpu::ScatterAddSumScratchBytes(m), &scratch));
    return CudaStatus(
        gpu::ScatterAddSum(ToCuda(values), indices, m, n, ToCuda(out),
                           scratch.flat<int8_t>().data(), StreamOf(ctx),
                           bad_position, bad_index),
        "ScatterAddSum");
  }
};
#endif  // GOOGLE_CUDA

}  // namespace functor

namespace {

// Checks values [m], indices [m] and the scalar n >= 0; sets *n.
absl::Status ValidateArgs(const Tensor& values, const Tensor& indices,
                          const Tensor& n_t, int64_t* n) {
  if (!TensorShapeUtils::IsVector(values.shape()) ||
      !TensorShapeUtils::IsVector(indices.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`values` and `indices` must be vectors [m]. Received: "
        "values.shape=",
        values.shape().DebugString(),
        ", indices.shape=", indices.shape().DebugString()));
  }
  if (values.dim_size(0) != indices.dim_size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`values` and `indices` must have the same length. Received: "
        "values.shape=",
        values.shape().DebugString(),
        ", indices.shape=", indices.shape().DebugString()));
  }
  if (!TensorShapeUtils::IsScalar(n_t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("`n` must be a scalar. Received: n.shape=",
                     n_t.shape().DebugString()));
  }
  *n = n_t.dtype() == tensorflow::DT_INT32
           ? static_cast<int64_t>(n_t.scalar<int32_t>()())
           : n_t.scalar<int64_t>()();
  return CheckNonNegative(*n, "n");
}

template <typename Device, typename T>
class ScatterAddSumOp : public OpKernel {
 public:
  explicit ScatterAddSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    int64_t n = 0;
    OP_REQUIRES_OK(ctx, ValidateArgs(values, indices, ctx->input(2), &n));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out));
    int64_t bad_position = -1;
    int32_t bad_index = 0;
    OP_REQUIRES_OK(ctx, (functor::ScatterAddSum<Device, T>()(
                            ctx, values.flat<T>().data(),
                            indices.flat<int32_t>().data(),
                            values.dim_size(0), n, out->flat<T>().data(),
                            &bad_position, &bad_index)));
    OP_REQUIRES(ctx, bad_position < 0,
                IndexOutOfRange(bad_position, bad_index, n));
  }
};

#define REGISTER_CPU(T)                                                    \
  REGISTER_KERNEL_BUILDER(                                                 \
      Name("Tfgc>ScatterAddSum").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      ScatterAddSumOp<CPUDevice, T>);

REGISTER_CPU(float)
REGISTER_CPU(Eigen::half)
REGISTER_CPU(Eigen::bfloat16)

#undef REGISTER_CPU

#if GOOGLE_CUDA
#define REGISTER_GPU(T)                                       \
  REGISTER_KERNEL_BUILDER(Name("Tfgc>ScatterAddSum")          \
                              .Device(tensorflow::DEVICE_GPU) \
                              .HostMemory("n")                \
                              .TypeConstraint<T>("T"),        \
                          ScatterAddSumOp<GPUDevice, T>);

REGISTER_GPU(float)
REGISTER_GPU(Eigen::half)
REGISTER_GPU(Eigen::bfloat16)

#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace tfgc
