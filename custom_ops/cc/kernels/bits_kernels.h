// Copyright 2026 The tfgc Authors.
//
// PackBits / UnpackBits / UnpackBitsSum / UnpackBitsVote: element 32 * j + i
// of the flattened input is bit i (least significant first) of int32 word j;
// the last word is padded with zero bits. The ops' functors
// (kernel_utils.h describes the layout): the CPU specialisations in
// bits_kernels.cc, the GPU ones over the launchers of bits_gpu.h.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_BITS_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_BITS_KERNELS_H_

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/kernel_utils.h"

namespace tfgc {

constexpr int kBitsPerWord = 32;

inline int64_t NumWords(int64_t n) {
  return (n + kBitsPerWord - 1) / kBitsPerWord;
}

// Packs up to 32 bytes holding 0 or 1 (C++ bools) into one word.
inline uint32_t PackWord(const uint8_t* bits, int count) {
  if (count == kBitsPerWord) {
    uint32_t word = 0;
    for (int byte = 0; byte < 4; ++byte) {
      uint64_t v;
      std::memcpy(&v, bits + 8 * byte, 8);
      // Moves byte i's low bit to bit 56 + i; no partial product carries
      // into the top byte because every byte is 0 or 1.
      const uint64_t packed = (v * 0x0102040810204080ULL) >> 56;
      word |= static_cast<uint32_t>(packed) << (8 * byte);
    }
    return word;
  }
  uint32_t word = 0;
  for (int i = 0; i < count; ++i) {
    word |= static_cast<uint32_t>(bits[i] != 0) << i;
  }
  return word;
}

namespace functor {

// Packs mask[n] into words[ceil(n / 32)].
template <typename Device>
struct PackBits {
  absl::Status operator()(OpKernelContext* ctx, const bool* mask, int64_t n,
                          int32_t* words);
};

// Unpacks words[rows, w] into mask[rows, n], w = ceil(n / 32).
template <typename Device>
struct UnpackBits {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          int64_t rows, int64_t w, int64_t n, bool* mask);
};

// out[i] = the sum over rows r of scales[r] times +1 or -1 as bit i of row
// r is set or not. `words` is [p, ceil(n / 32)], `out` [n], n > 0.
template <typename Device, typename T>
struct UnpackBitsSum {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          const T* scales, int64_t p, int64_t n, T* out);
};

// out[i] = +1 when at least half the rows set bit i, else -1. `words` is
// [p, ceil(n / 32)], `out` [n], n > 0.
template <typename Device, typename T>
struct UnpackBitsVote {
  absl::Status operator()(OpKernelContext* ctx, const int32_t* words,
                          int64_t p, int64_t n, T* out);
};

}  // namespace functor
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_BITS_KERNELS_H_
