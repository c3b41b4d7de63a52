// Copyright 2026 The tfgc Authors.
//
// CUDA kernels of GolombEncode and GolombDecode (format in
// golomb_common.h) and their launchers (golomb_gpu.h), the encoder's
// instantiated for int32 and int64 indices. No TensorFlow header: the GPU
// functors (golomb_kernels.cc, GOOGLE_CUDA) and custom_ops/cuda_harness/
// link it as is.
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
// Decode: the format has no chunk offsets, and where a code starts depends
// on every code before it; but a chunk of the stream can only start in
// b + 1 ways, so each chunk is decoded from all of them at once and the
// results are chained (the comment above the decode kernels says how).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/golomb_common.h"
#include "custom_ops/cc/kernels/golomb_gpu.h"

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

// ---------------------------------------------------------------------------
// Decode. The stream is cut into chunks of kChunkBits bits (one more chunk
// than the stream fills, so that the zero bit read past its end, where a
// truncated code ends, lies in a chunk). A code belongs to the chunk that
// holds its terminating zero bit. A chunk starts in one of b + 1 states: s
// in [1, b] when its first s bits end the remainder of a code begun before
// it; 0 otherwise, when a code starts at its first bit or a unary part runs
// into it, and either way its bits up to the first zero are unary ones.
// From each state, one thread per chunk decodes the chunk and notes the
// state of the next chunk, the codes it ends and their share of the
// positions (2^b per unary one bit in the chunk, 1 + r per code ending in
// it; position j + 1 is the sum of the shares of everything up to code j).
// These small transition tables are then chained: per group of kGroup
// chunks for every entry state (one block each), over the groups from
// state 0 at bit 0 (one thread), and inside each group from its entry state
// (one thread per block), which gives every chunk its state, its first
// code's index and the sum of the shares before it. Each thread then
// decodes its chunk once more and writes its codes' positions. Work is
// O(stream bits) (b + 1 states, codes of at least b + 1 bits) and the
// serial steps are one per group plus 2 kGroup, where one thread used to
// read every code in turn.
//
// Errors as the CPU kernel's: the first code that ends past the stream or
// lands at or above `limit` (a unary part above limit >> b does too). Both
// only grow with the code index, so the codes before the first error are
// exactly the valid ones and their number, summed with an integer atomic,
// is that code's index; one thread then describes it.
// ---------------------------------------------------------------------------

constexpr int64_t kChunkBits = 512;
constexpr int kGroup = kThreads;  // chunks per group: one per thread
constexpr int kMaxStates = golomb::kMaxB + 1;
// Sums of position shares saturate here, far above any int32 position,
// so that a corrupt stream cannot wrap them.
constexpr uint64_t kShareCap = uint64_t{1} << 62;

__device__ __forceinline__ uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return Min(a + b, kShareCap);  // a <= kShareCap and b < 2^62
}

// The stream and the code parameter.
struct Stream {
  const uint8_t* data;
  int64_t num_bytes;
  int64_t num_bits;
  int b;
};

// Where a chunk's (or a group's) walk from one state ends: the next state,
// the codes it ends (count) and their share of the positions.
struct Transition {
  uint64_t share;
  uint32_t next_and_count;  // count << 8 | next state
};

__device__ __forceinline__ uint32_t Pack(int next, uint64_t count) {
  return static_cast<uint32_t>(count << 8) | static_cast<uint32_t>(next);
}

// A chunk's (or a group's) state, its first code's index and the sum of
// the shares before it.
struct Entry {
  int64_t code;
  uint64_t share;
  int32_t state;
};

// The 64 bits from stream bit `pos`, the first in bit 63; past the end of
// the stream they are zeros.
__device__ __forceinline__ uint64_t Peek(const Stream& st, int64_t pos) {
  const int64_t byte = pos >> 3;
  const int off = static_cast<int>(pos & 7);
  uint64_t w = 0;
  for (int i = 0; i < 9; ++i) {
    const int64_t at = byte + i;
    const uint64_t v = at < st.num_bytes ? st.data[at] : 0;
    if (i < 8) {
      w = (w << 8) | v;
    } else if (off > 0) {
      w = (w << off) | (v >> (8 - off));
    }
  }
  return w;
}

// The first zero bit in [pos, end), or end.
__device__ __forceinline__ int64_t NextZero(const Stream& st, int64_t pos,
                                            int64_t end) {
  for (; pos < end; pos += 64) {
    const int ones = __clzll(static_cast<long long>(~Peek(st, pos)));
    if (ones < 64) return pos + ones < end ? pos + ones : end;
  }
  return end;
}

// Decodes chunk c from `state`: calls on_code(zero bit, share up to and
// including the code) for each code ending in the chunk, in order, until
// it returns false.
template <typename OnCode>
__device__ __forceinline__ Transition WalkChunk(const Stream& st, int64_t c,
                                                int state, OnCode on_code) {
  const int64_t begin = c * kChunkBits, end = begin + kChunkBits;
  // The bits from `pos` up to a zero bit are unary ones.
  int64_t pos = begin + state;
  uint64_t share = 0, count = 0;
  while (pos < end) {
    const int64_t zero = NextZero(st, pos, end);
    share += static_cast<uint64_t>(zero - pos) << st.b;
    if (zero == end) return {share, Pack(0, count)};
    const uint64_t r = st.b > 0 ? Peek(st, zero + 1) >> (64 - st.b) : 0;
    share += 1 + r;
    ++count;
    if (!on_code(zero, share)) break;
    pos = zero + 1 + st.b;
  }
  return {share, Pack(static_cast<int>(pos - end), count)};
}

// Pass 1: every chunk's transition from each of the b + 1 states.
__global__ void ChunkTransitionsKernel(Stream st, int64_t chunks,
                                       Transition* out) {
  const int states = st.b + 1;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
       c < chunks; c += int64_t{gridDim.x} * blockDim.x) {
    for (int s = 0; s < states; ++s) {
      out[c * states + s] =
          WalkChunk(st, c, s, [](int64_t, uint64_t) { return true; });
    }
  }
}

// Moves `e` past a chunk (or group) with that transition from e's state.
__device__ __forceinline__ void Advance(Entry* e, uint32_t next_and_count,
                                        uint64_t share) {
  e->code += next_and_count >> 8;
  e->share = SaturatingAdd(e->share, share);
  e->state = static_cast<int32_t>(next_and_count & 0xffu);
}

// Copies the packed transitions of group g's chunks to shared memory.
__device__ __forceinline__ int64_t LoadGroup(const Transition* chunk,
                                             int64_t chunks, int states,
                                             int64_t g, uint32_t* s_trans) {
  const int64_t first = g * kGroup;
  const int64_t count = Min(chunks - first, kGroup);
  for (int64_t e = threadIdx.x; e < count * states; e += blockDim.x) {
    s_trans[e] = chunk[first * states + e].next_and_count;
  }
  __syncthreads();
  return count;
}

// Pass 2: every group's transition from each state, by walking its chunks
// (one thread per entry state).
__global__ void GroupTransitionsKernel(const Transition* chunk,
                                       int64_t chunks, int states,
                                       int64_t groups, Transition* group) {
  __shared__ uint32_t s_trans[kGroup * kMaxStates];
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t count = LoadGroup(chunk, chunks, states, g, s_trans);
    if (threadIdx.x < states) {
      Entry e = {0, 0, static_cast<int32_t>(threadIdx.x)};
      for (int64_t i = 0; i < count; ++i) {
        Advance(&e, s_trans[i * states + e.state],
                chunk[(g * kGroup + i) * states + e.state].share);
      }
      group[g * states + threadIdx.x] = {e.share, Pack(e.state, e.code)};
    }
    __syncthreads();  // s_trans is read before the next group's load
  }
}

// Pass 3 (one thread): the groups' entries, from state 0 at bit 0.
__global__ void ChainGroupsKernel(const Transition* group, int states,
                                  int64_t groups, Entry* entry) {
  Entry e = {0, 0, 0};
  for (int64_t g = 0; g < groups; ++g) {
    entry[g] = e;
    const Transition t = group[g * states + e.state];
    Advance(&e, t.next_and_count, t.share);
  }
}

// Pass 4: each group's chunks' entries (one thread walks them), then every
// thread decodes its chunk: writes the positions of its valid codes below
// k and adds their number to *valid.
__global__ void DecodeChunksKernel(Stream st, const Transition* chunk,
                                   int64_t chunks, int64_t groups,
                                   const Entry* group_entry, int64_t k,
                                   int64_t limit, Entry* chunk_entry,
                                   int32_t* out, unsigned long long* valid) {
  __shared__ uint32_t s_trans[kGroup * kMaxStates];
  __shared__ Entry s_entry[kGroup];
  const int states = st.b + 1;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t count = LoadGroup(chunk, chunks, states, g, s_trans);
    if (threadIdx.x == 0) {
      Entry e = group_entry[g];
      for (int64_t i = 0; i < count; ++i) {
        s_entry[i] = e;
        chunk_entry[g * kGroup + i] = e;
        Advance(&e, s_trans[i * states + e.state],
                chunk[(g * kGroup + i) * states + e.state].share);
      }
    }
    __syncthreads();
    if (threadIdx.x < count) {
      const Entry e = s_entry[threadIdx.x];
      int64_t j = e.code;
      unsigned long long ok = 0;
      WalkChunk(st, g * kGroup + threadIdx.x, e.state,
                [&](int64_t zero, uint64_t share) {
                  if (j >= k) return false;
                  // Position j + 1 is the sum of the shares up to code j.
                  const uint64_t p1 = SaturatingAdd(e.share, share);
                  if (zero + 1 + st.b <= st.num_bits &&
                      p1 <= static_cast<uint64_t>(limit)) {
                    out[j] = static_cast<int32_t>(p1 - 1);
                    ++ok;
                  }
                  ++j;
                  return true;
                });
      if (ok > 0) atomicAdd(valid, ok);
    }
    __syncthreads();  // s_trans and s_entry are read before the next load
  }
}

// Pass 5 (one thread, only on an error): describes code j, the first
// invalid one, in error[3] as the CPU kernel would. Its chunk is the last
// whose first code index is at most j.
__global__ void DescribeErrorKernel(Stream st, const Entry* chunk_entry,
                                    int64_t chunks, int64_t j, int64_t limit,
                                    const int32_t* out, int64_t* error) {
  int64_t lo = 0, hi = chunks - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (chunk_entry[mid].code <= j) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const Entry e = chunk_entry[lo];
  int64_t at = e.code, zero = 0;
  uint64_t share = 0;
  WalkChunk(st, lo, e.state, [&](int64_t z, uint64_t through) {
    zero = z;
    share = through;
    return at++ < j;
  });
  error[1] = j;
  if (zero + 1 + st.b > st.num_bits) {
    error[0] = golomb::kDecodeTruncated;
    return;
  }
  // The code may start chunks earlier: its unary part q comes from the
  // gap to the previous position, valid and written by pass 4.
  const uint64_t p1 = SaturatingAdd(e.share, share);
  const int64_t prev = j > 0 ? out[j - 1] : -1;
  const uint64_t max_q = static_cast<uint64_t>(limit) >> st.b;
  const uint64_t gap = p1 - static_cast<uint64_t>(prev + 2);
  if (p1 == kShareCap || (gap >> st.b) > max_q) {
    error[0] = golomb::kDecodeQuotientTooLarge;
    error[2] = prev + 1 + static_cast<int64_t>((max_q + 1) << st.b);
  } else {
    error[0] = golomb::kDecodePositionTooLarge;
    error[2] = static_cast<int64_t>(p1 - 1);
  }
}

// The decoder's scratch, in this order.
struct DecodeScratch {
  int64_t* error;            // 3, then the count of valid codes
  Transition* chunk;         // chunks * (b + 1)
  Transition* group;         // groups * (b + 1)
  Entry* chunk_entry;        // chunks
  Entry* group_entry;        // groups
  int64_t chunks, groups;
};

constexpr int64_t kHeaderBytes = 4 * sizeof(int64_t);

int64_t Chunks(int64_t num_bytes) { return num_bytes * 8 / kChunkBits + 1; }
int64_t Groups(int64_t chunks) { return (chunks + kGroup - 1) / kGroup; }

DecodeScratch SplitDecodeScratch(void* scratch, int64_t num_bytes, int b) {
  DecodeScratch d;
  const int64_t states = b + 1;
  d.chunks = Chunks(num_bytes);
  d.groups = Groups(d.chunks);
  d.error = static_cast<int64_t*>(scratch);
  d.chunk = reinterpret_cast<Transition*>(d.error + kHeaderBytes / 8);
  d.group = d.chunk + d.chunks * states;
  d.chunk_entry = reinterpret_cast<Entry*>(d.group + d.groups * states);
  d.group_entry = d.chunk_entry + d.chunks;
  return d;
}

}  // namespace

int64_t GolombEncodeScratchBytes(int64_t k) {
  // Tile sums (then offsets), one spare slot, the 4-byte flag (padded).
  return (Tiles(k) + 2) * static_cast<int64_t>(sizeof(uint64_t));
}

template <typename Index>
int GolombEncodeSize(const Index* indices, int64_t k, int64_t n, int b,
                     void* scratch, void* stream, int64_t* num_bits,
                     int64_t* bad_position, int64_t* bad_value,
                     int64_t* bad_prev) {
  *num_bits = 0;
  *bad_position = -1;
  *bad_value = *bad_prev = 0;
  if (b < 0 || b > golomb::kMaxB) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (k == 0) return 0;
  return static_cast<int>(EncodeSize(indices, k, n, b, scratch,
                                     static_cast<cudaStream_t>(stream),
                                     num_bits, bad_position, bad_value,
                                     bad_prev));
}

template <typename Index>
int GolombEncodeWrite(const Index* indices, int64_t k, int b,
                      int64_t num_bits, const void* scratch, uint32_t* words,
                      uint8_t* out, void* stream) {
  if (k == 0 || num_bits == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t num_words = (num_bits + 31) / 32;
  cudaError_t err = cudaMemsetAsync(words, 0, num_words * 4, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const auto* offsets = static_cast<const uint64_t*>(scratch);
  const int64_t tiles = Tiles(k);
  const int grid = StrideGridFor(tiles * kThreads, kThreads);
  LaunchKernel(WriteKernel<Index>, grid, kThreads, 0, s, indices, k, tiles,
               b, offsets, words);
  err = cudaGetLastError();
  if (err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaMemcpyAsync(out, words, (num_bits + 7) / 8,
                                          cudaMemcpyDeviceToDevice, s));
}

int64_t GolombDecodeScratchBytes(int64_t num_bytes, int b) {
  if (b < 0 || b > golomb::kMaxB || num_bytes < 0) return 0;
  const int64_t chunks = Chunks(num_bytes);
  const int64_t groups = Groups(chunks);
  return kHeaderBytes +
         (chunks + groups) * ((b + 1) * static_cast<int64_t>(
                                            sizeof(Transition)) +
                              static_cast<int64_t>(sizeof(Entry)));
}

int GolombDecode(const uint8_t* encoded, int64_t num_bytes, int64_t k, int b,
                 int64_t limit, int32_t* out, void* scratch, void* stream,
                 int64_t* error) {
  error[0] = golomb::kDecodeOk;
  error[1] = error[2] = 0;
  if (b < 0 || b > golomb::kMaxB || limit < 0 || num_bytes < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (k == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const DecodeScratch d = SplitDecodeScratch(scratch, num_bytes, b);
  const Stream st = {encoded, num_bytes, num_bytes * 8, b};
  const int states = b + 1;
  cudaError_t err = cudaMemsetAsync(d.error, 0, 4 * sizeof(int64_t), s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int group_grid = StrideGridFor(d.groups * kThreads, kThreads);
  LaunchKernel(ChunkTransitionsKernel, StrideGridFor(d.chunks, kThreads),
               kThreads, 0, s, st, d.chunks, d.chunk);
  LaunchKernel(GroupTransitionsKernel, group_grid, kThreads, 0, s,
               static_cast<const Transition*>(d.chunk), d.chunks, states,
               d.groups, d.group);
  LaunchKernel(ChainGroupsKernel, 1, 1, 0, s,
               static_cast<const Transition*>(d.group), states, d.groups,
               d.group_entry);
  auto* valid = reinterpret_cast<unsigned long long*>(d.error + 3);
  LaunchKernel(DecodeChunksKernel, group_grid, kThreads, 0, s, st,
               static_cast<const Transition*>(d.chunk), d.chunks, d.groups,
               static_cast<const Entry*>(d.group_entry), k, limit,
               d.chunk_entry, out, valid);
  err = cudaGetLastError();
  // The op must fail on a bad stream, so the host waits for the count.
  unsigned long long host_valid = 0;
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(&host_valid, valid, sizeof(host_valid),
                          cudaMemcpyDeviceToHost, s);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess || host_valid >= static_cast<uint64_t>(k)) {
    return static_cast<int>(err);
  }
  LaunchKernel(DescribeErrorKernel, 1, 1, 0, s, st,
               static_cast<const Entry*>(d.chunk_entry), d.chunks,
               static_cast<int64_t>(host_valid), limit,
               static_cast<const int32_t*>(out), d.error);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(error, d.error, 3 * sizeof(int64_t),
                          cudaMemcpyDeviceToHost, s);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return static_cast<int>(err);
}

// The encoder's launchers of golomb_gpu.h for each index type.
#define TFGC_INSTANTIATE_GOLOMB(Index)                                      \
  template int GolombEncodeSize(const Index*, int64_t, int64_t, int, void*, \
                                void*, int64_t*, int64_t*, int64_t*,        \
                                int64_t*);                                  \
  template int GolombEncodeWrite(const Index*, int64_t, int, int64_t,       \
                                 const void*, uint32_t*, uint8_t*, void*);

TFGC_INSTANTIATE_GOLOMB(int32_t)
TFGC_INSTANTIATE_GOLOMB(int64_t)

#undef TFGC_INSTANTIATE_GOLOMB

}  // namespace gpu
}  // namespace tfgc
