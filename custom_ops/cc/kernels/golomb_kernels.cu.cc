// Copyright 2026 The tfgc Authors.
//
// CUDA kernels of GolombEncode and GolombDecode (format in
// golomb_kernels.h). No TensorFlow header: the TF glue (golomb_kernels.cc,
// GOOGLE_CUDA) and custom_ops/cuda_harness/ link it as is.
//
// Encode: one thread per position, 256 positions per tile. A first kernel
// checks the indices (any violation raises a flag) and sums the code
// lengths of each tile; the host scans the tile sums (as TopKSample's
// ordered write does) and copies the offsets back; a second kernel scans
// the lengths inside each tile in shared memory, and every thread adds the
// one bits of its code into zeroed 32-bit words holding the stream
// big-endian (bytes MSB first). The codes never share a bit, so adding a
// code's bits to a word is an OR: atomicAdd is used because the emulation
// of custom_ops/cuda_harness/ has it (not atomicOr) and it gives the same
// words. The words are then copied to the output, which has only
// ceil(num_bits / 8) bytes.
//
// Decode: one thread (one block of one thread). Where a code starts
// depends on the lengths of all the codes before it, so a parallel decoder
// would have to decode speculatively from every bit and chain the results;
// the stream is short (k codes of about b + 2 bits) next to the tensors the
// other kernels read, so a serial pass on the device, skipping 0xFF bytes
// of long unary runs, avoids copying it to the host and back.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/golomb_kernels.h"

namespace tfgc {
namespace gpu {
namespace {

constexpr int kThreads = 256;  // positions per tile
// Code lengths are capped at 2^40 bits before summing, so that tile sums
// (256 lengths) cannot wrap; any cap above 2^35 (the largest stream the op
// writes) keeps the answer. The host total saturates at 2^62.
constexpr uint64_t kLengthCap = uint64_t{1} << 40;
constexpr uint64_t kTotalCap = uint64_t{1} << 62;

int64_t Tiles(int64_t k) { return (k + kThreads - 1) / kThreads; }

// golomb::CodeBits on the device (no std:: calls in device code).
__device__ __forceinline__ uint64_t CodeLength(uint64_t gap, int b) {
  return (gap >> b) + 1 + static_cast<uint64_t>(b);
}

__device__ __forceinline__ uint64_t Min(uint64_t a, uint64_t b) {
  return a < b ? a : b;
}

// The stream byte order in a 32-bit word: the first bit is the MSB of the
// big-endian value; the device is little-endian.
__device__ __forceinline__ uint32_t ByteSwap(uint32_t x) {
  return (x >> 24) | ((x >> 8) & 0xFF00u) | ((x << 8) & 0xFF0000u) |
         (x << 24);
}

// Adds `value` (len <= 32 bits, MSB first) at stream bit `pos`; its bits
// must be zero in the words so far (each stream bit has one writer).
__device__ __forceinline__ void AddBits(uint32_t* words, int64_t pos,
                                        uint32_t value, int len) {
  if (value == 0) return;  // zero bits are already there (memset)
  const int64_t w = pos >> 5;
  const int sh = static_cast<int>(pos & 31);
  const uint64_t v = static_cast<uint64_t>(value) << (64 - sh - len);
  const uint32_t hi = static_cast<uint32_t>(v >> 32);
  const uint32_t lo = static_cast<uint32_t>(v);
  if (hi != 0) atomicAdd(words + w, ByteSwap(hi));
  if (lo != 0) atomicAdd(words + w + 1, ByteSwap(lo));
}

template <typename T>
__device__ __forceinline__ int64_t Previous(const T* idx, int64_t j) {
  return j == 0 ? -1 : static_cast<int64_t>(idx[j - 1]);
}

// Pass 1: flags invalid indices, tile_bits[t] = bits of tile t's codes.
template <typename T>
__global__ void SizeKernel(const T* idx, int64_t k, int64_t tiles, int64_t n,
                           int b, uint64_t* tile_bits, unsigned* bad) {
  __shared__ uint64_t s_len[kThreads];
  const int tid = threadIdx.x;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t j = t * kThreads + tid;
    uint64_t len = 0;
    if (j < k) {
      const int64_t prev = Previous(idx, j);
      const int64_t cur = static_cast<int64_t>(idx[j]);
      if (cur <= prev || cur >= n) {
        *bad = 1u;  // every writer stores the same value
      } else {
        const uint64_t gap = static_cast<uint64_t>(cur - prev - 1);
        len = Min(CodeLength(gap, b), kLengthCap);
      }
    }
    s_len[tid] = len;
    __syncthreads();
    for (int stride = kThreads / 2; stride > 0; stride /= 2) {
      if (tid < stride) {
        s_len[tid] += s_len[tid + stride];
      }
      __syncthreads();
    }
    if (tid == 0) tile_bits[t] = s_len[0];
    __syncthreads();  // s_len[0] is read before the next tile writes it
  }
}

// Pass 2: each thread adds its code's one bits at its bit offset.
template <typename T>
__global__ void WriteKernel(const T* idx, int64_t k, int64_t tiles, int b,
                            const uint64_t* tile_offset, uint32_t* words) {
  __shared__ uint64_t s_scan[kThreads];
  const int tid = threadIdx.x;
  const uint64_t r_mask = (uint64_t{1} << b) - 1;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t j = t * kThreads + tid;
    uint64_t gap = 0, len = 0;
    if (j < k) {
      gap = static_cast<uint64_t>(static_cast<int64_t>(idx[j]) -
                                  Previous(idx, j) - 1);
      len = CodeLength(gap, b);
    }
    // Inclusive scan of the lengths (Hillis-Steele).
    s_scan[tid] = len;
    __syncthreads();
    for (int off = 1; off < kThreads; off *= 2) {
      const uint64_t add =
          tid >= off ? s_scan[tid - off] : uint64_t{0};
      __syncthreads();
      s_scan[tid] += add;
      __syncthreads();
    }
    if (j < k) {
      int64_t pos = static_cast<int64_t>(tile_offset[t] +
                                         s_scan[tid] - len);
      // q one bits, word by word (a large q spans whole words).
      for (uint64_t q = gap >> b; q > 0;) {
        const int room = 32 - static_cast<int>(pos & 31);
        const int take = static_cast<int>(Min(q, room));
        const uint32_t ones =
            static_cast<uint32_t>((uint64_t{1} << take) - 1);
        AddBits(words, pos, ones, take);
        pos += take;
        q -= take;
      }
      pos += 1;  // the terminating zero
      if (b > 0) AddBits(words, pos, static_cast<uint32_t>(gap & r_mask), b);
    }
  }
}

template <typename T>
cudaError_t FindBad(const T* indices, int64_t k, int64_t n, cudaStream_t s,
                    int64_t* position, int64_t* value, int64_t* prev) {
  std::vector<T> host(k);
  cudaError_t err = cudaMemcpyAsync(host.data(), indices, k * sizeof(T),
                                    cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return err;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = j == 0 ? -1 : static_cast<int64_t>(host[j - 1]);
    const int64_t c = static_cast<int64_t>(host[j]);
    if (c <= p || c >= n) {
      *position = j;
      *value = c;
      *prev = p;
      break;
    }
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t EncodeSize(const T* idx, int64_t k, int64_t n, int b,
                       void* scratch, cudaStream_t s, int64_t* num_bits,
                       int64_t* bad_position, int64_t* bad_value,
                       int64_t* bad_prev) {
  const int64_t tiles = Tiles(k);
  auto* tile_bits = static_cast<uint64_t*>(scratch);
  auto* bad = reinterpret_cast<unsigned*>(tile_bits + tiles + 1);
  cudaError_t err = cudaMemsetAsync(bad, 0, sizeof(unsigned), s);
  if (err != cudaSuccess) return err;
  LaunchKernel(SizeKernel<T>, StrideGridFor(tiles * kThreads, kThreads),
               kThreads, 0, s, idx, k, tiles, n, b, tile_bits, bad);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  // The output size is needed on the host: wait for the tile sums.
  std::vector<uint64_t> host(tiles + 1);
  unsigned host_bad = 0;
  err = cudaMemcpyAsync(host.data(), tile_bits, tiles * sizeof(uint64_t),
                        cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(&host_bad, bad, sizeof(unsigned),
                          cudaMemcpyDeviceToHost, s);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) return err;
  if (host_bad != 0) {
    return FindBad(idx, k, n, s, bad_position, bad_value, bad_prev);
  }
  // Exclusive scan in place; host[tiles] is the total.
  uint64_t total = 0;
  for (int64_t t = 0; t <= tiles; ++t) {
    const uint64_t len = t < tiles ? host[t] : 0;
    host[t] = total;
    total = std::min(total + len, kTotalCap);
  }
  *num_bits = static_cast<int64_t>(host[tiles]);
  err = cudaMemcpyAsync(tile_bits, host.data(), tiles * sizeof(uint64_t),
                        cudaMemcpyHostToDevice, s);
  // `host` must outlive the copy.
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return err;
}

// Reads len <= 32 bits MSB first at stream bit pos; all are in the stream.
__device__ __forceinline__ uint64_t ReadBits(const uint8_t* data,
                                             int64_t pos, int len) {
  if (len == 0) return 0;
  const int64_t last = pos + len - 1;
  uint64_t acc = 0;
  for (int64_t byte = pos >> 3; byte <= (last >> 3); ++byte) {
    acc = (acc << 8) | data[byte];
  }
  acc >>= 7 - static_cast<int>(last & 7);
  return acc & ((uint64_t{1} << len) - 1);
}

__global__ void DecodeKernel(const uint8_t* data, int64_t num_bits,
                             int64_t k, int b, int64_t limit, int32_t* out,
                             int64_t* error) {
  const uint64_t max_q = static_cast<uint64_t>(limit) >> b;
  int64_t pos = 0, prev = -1;
  for (int64_t j = 0; j < k; ++j) {
    // The unary part: one bits up to a zero bit or the end of the stream.
    uint64_t q = 0;
    while (pos < num_bits) {
      if ((pos & 7) == 0 && pos + 8 <= num_bits && data[pos >> 3] == 0xFF) {
        q += 8;
        pos += 8;
      } else if (ReadBits(data, pos, 1) != 0) {
        q += 1;
        pos += 1;
      } else {
        break;
      }
    }
    // As the CPU kernel: a code past the end first, then its value.
    if (pos + 1 + b > num_bits) {
      error[0] = kDecodeTruncated;
      error[1] = j;
      return;
    }
    const uint64_t r = ReadBits(data, pos + 1, b);
    pos += 1 + b;
    if (q > max_q) {
      error[0] = kDecodeQuotientTooLarge;
      error[1] = j;
      error[2] = prev + 1 + static_cast<int64_t>(Min(q, max_q + 1) << b);
      return;
    }
    const int64_t p = prev + 1 + static_cast<int64_t>((q << b) | r);
    if (p >= limit) {
      error[0] = kDecodePositionTooLarge;
      error[1] = j;
      error[2] = p;
      return;
    }
    out[j] = static_cast<int32_t>(p);
    prev = p;
  }
}

}  // namespace

int64_t GolombEncodeScratchBytes(int64_t k) {
  // Tile sums (then offsets), one spare slot, the 4-byte flag (padded).
  return (Tiles(k) + 2) * static_cast<int64_t>(sizeof(uint64_t));
}

int GolombEncodeSize(bool index_int64, const void* indices, int64_t k,
                     int64_t n, int b, void* scratch, void* stream,
                     int64_t* num_bits, int64_t* bad_position,
                     int64_t* bad_value, int64_t* bad_prev) {
  *num_bits = 0;
  *bad_position = -1;
  *bad_value = *bad_prev = 0;
  if (b < 0 || b > golomb::kMaxB) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (k == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t err =
      index_int64
          ? EncodeSize(static_cast<const int64_t*>(indices), k, n, b, scratch,
                       s, num_bits, bad_position, bad_value, bad_prev)
          : EncodeSize(static_cast<const int32_t*>(indices), k, n, b, scratch,
                       s, num_bits, bad_position, bad_value, bad_prev);
  return static_cast<int>(err);
}

int GolombEncodeWrite(bool index_int64, const void* indices, int64_t k,
                      int b, int64_t num_bits, const void* scratch,
                      uint32_t* words, uint8_t* out, void* stream) {
  if (k == 0 || num_bits == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t num_words = (num_bits + 31) / 32;
  cudaError_t err = cudaMemsetAsync(words, 0, num_words * 4, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const auto* offsets = static_cast<const uint64_t*>(scratch);
  const int64_t tiles = Tiles(k);
  const int grid = StrideGridFor(tiles * kThreads, kThreads);
  if (index_int64) {
    LaunchKernel(WriteKernel<int64_t>, grid, kThreads, 0, s,
                 static_cast<const int64_t*>(indices), k, tiles, b, offsets,
                 words);
  } else {
    LaunchKernel(WriteKernel<int32_t>, grid, kThreads, 0, s,
                 static_cast<const int32_t*>(indices), k, tiles, b, offsets,
                 words);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaMemcpyAsync(out, words, (num_bits + 7) / 8,
                                          cudaMemcpyDeviceToDevice, s));
}

int GolombDecode(const uint8_t* encoded, int64_t num_bytes, int64_t k, int b,
                 int64_t limit, int32_t* out, int64_t* scratch, void* stream,
                 int64_t* error) {
  error[0] = kDecodeOk;
  error[1] = error[2] = 0;
  if (b < 0 || b > golomb::kMaxB || limit < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (k == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(scratch, 0, 3 * sizeof(int64_t), s);
  if (err != cudaSuccess) return static_cast<int>(err);
  LaunchKernel(DecodeKernel, 1, 1, 0, s, encoded, num_bytes * 8, k, b, limit,
               out, scratch);
  err = cudaGetLastError();
  // The op must fail on a bad stream, so the host waits for the record.
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(error, scratch, 3 * sizeof(int64_t),
                          cudaMemcpyDeviceToHost, s);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return static_cast<int>(err);
}

}  // namespace gpu
}  // namespace tfgc
