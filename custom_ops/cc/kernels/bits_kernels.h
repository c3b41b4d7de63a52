// Copyright 2026 The tfgc Authors.
//
// PackBits / UnpackBits / UnpackBitsSum / UnpackBitsVote: element 32 * j + i
// of the flattened input is bit i (least significant first) of int32 word j;
// the last word is padded with zero bits. Shared by the CPU kernels, the CUDA
// kernels and the standalone CUDA harness; no TensorFlow header here.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_BITS_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_BITS_KERNELS_H_

#include <cstdint>
#include <cstring>

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

namespace gpu {

// CUDA launchers (bits_kernels.cu.cc). Device pointers; `stream` is a
// cudaStream_t; `dtype` 0/1/2 = float/half/bfloat16 (as gpu::DType of
// top_k_sample_kernels.h). Return a cudaError_t value (0 is success).
int PackBits(const bool* mask, int64_t n, int32_t* words, void* stream);
int UnpackBits(const int32_t* words, int64_t rows, int64_t n, bool* mask,
               void* stream);
int UnpackBitsSum(int dtype, const int32_t* words, const void* scales,
                  int64_t p, int64_t n, void* out, void* stream);
int UnpackBitsVote(int dtype, const int32_t* words, int64_t p, int64_t n,
                   void* out, void* stream);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_BITS_KERNELS_H_
