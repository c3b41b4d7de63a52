// Copyright 2026 The tfgc Authors.
//
// TopKTwoSided: the k largest positive entries of x and its k most negative
// ones in one selection (SBC's binarization). This header holds what the
// CPU functor, the CUDA kernels and the CUDA harness share. It includes no
// TensorFlow header (top_k_two_sided_kernels.cu.cc is compiled by nvcc
// alone; kernel_utils.h says why).
//
// The definitions (those of today's pure-TF selection in
// tfgc/ops/top_k_sample.py, `top_k_two_sided_reference`: top_k_abs of
// relu(x) and of relu(-x), each kept where `values > 0` or NaN):
//   side    an entry is on the positive side when its float32 value is a
//           normal positive number or +inf, on the negative side when it is
//           a normal negative number or -inf, and on both when it is NaN.
//           Zeros and float32 subnormals are on neither: TensorFlow's
//           threads compare with denormals flushed (DAZ), so `values > 0`
//           is false for them there. (float16 converts to normal float32
//           values, so its subnormals are on their side; bfloat16's
//           subnormals are float32's.)
//   key     on its side, an entry's key is that of TopKSample
//           (top_k_sample_common.h): the bits of |x| in float32, +inf's for
//           NaN; off its side, 0. Every key on a side is >= kMinNormalKey.
//   select  per side the min(k, entries on the side) largest keys, the
//           lower index first among equal keys; indices increasing.
//   values  the positive side's are x's, the negative side's -x (the sign
//           bit flipped: relu(-x) of the reference, NaN payloads kept).

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_COMMON_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_COMMON_H_

#include <cstdint>
#include <cstring>

#include "custom_ops/cc/kernels/top_k_sample_common.h"

namespace tfgc {

// The sides, as indices of the op's outputs (values, indices) pairs.
constexpr int kPositiveSide = 0;
constexpr int kNegativeSide = 1;
constexpr int kSides = 2;

// The key on `side` of the entry whose float32 bits are `bits` (0: not on
// that side). Branch-free but for NaN: signs are random in gradients.
TFGC_HOST_DEVICE inline uint32_t SideKey(uint32_t bits, int side) {
  const uint32_t magnitude = bits & 0x7fffffffu;
  const uint32_t on_side =
      static_cast<uint32_t>((bits >> 31) == static_cast<uint32_t>(side)) &
      static_cast<uint32_t>(magnitude >= kMinNormalKey);
  const uint32_t key = magnitude & (0u - on_side);
  return magnitude > kInfKey ? kInfKey : key;  // NaN: on both sides
}

// The float32 bits of v.
TFGC_HOST_DEVICE inline uint32_t FloatBits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// v with its sign bit flipped (a 2- or 4-byte float: float, float16,
// bfloat16), NaN payloads kept: what TensorFlow's negation gives.
template <typename T>
TFGC_HOST_DEVICE inline T FlipSign(T v) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "a 16- or 32-bit float");
  if constexpr (sizeof(T) == 2) {
    uint16_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bits ^= 0x8000u;
    std::memcpy(&v, &bits, sizeof(bits));
  } else {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bits ^= 0x80000000u;
    std::memcpy(&v, &bits, sizeof(bits));
  }
  return v;
}

// The value written for entry v on `side`.
template <typename T>
TFGC_HOST_DEVICE inline T SideValue(T v, int side) {
  return side == kPositiveSide ? v : FlipSign(v);
}

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_TOP_K_TWO_SIDED_COMMON_H_
