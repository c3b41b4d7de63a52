// Copyright 2026 The tfgc Authors.
//
// AVX2 code paths chosen at run time. The library is compiled with the
// flags of the installed TensorFlow (no -mavx2), so the AVX2 functions carry
// a target attribute and are called only when the CPU reports AVX2 and F16C;
// every caller keeps a portable scalar path for other CPUs and compilers.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_SIMD_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_SIMD_H_

#include <cstdint>
#include <cstdlib>

#include "tensorflow/core/framework/numeric_types.h"

#if (defined(__GNUC__) || defined(__clang__)) && \
    (defined(__x86_64__) || defined(__i386__))
#define TFGC_HAVE_AVX2_PATH 1
#include <immintrin.h>
#define TFGC_AVX2 __attribute__((target("avx2,f16c,popcnt")))
#else
#define TFGC_HAVE_AVX2_PATH 0
#endif

namespace tfgc {

// Whether the AVX2 paths may run (AVX2, F16C and POPCNT present);
// TFGC_DISABLE_AVX2=1 (read once, when an
// op first asks) forces the scalar paths, so that tests can compare both on
// the same machine.
inline bool UseAvx2() {
#if TFGC_HAVE_AVX2_PATH
  static const bool use = [] {
    const char* off = std::getenv("TFGC_DISABLE_AVX2");
    if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("popcnt");
  }();
  return use;
#else
  return false;
#endif
}

#if TFGC_HAVE_AVX2_PATH

// x[0..8) as eight float32 lanes, converted exactly as static_cast<float>
// does (float16 through F16C, bfloat16 by a 16-bit shift).
template <typename T>
TFGC_AVX2 inline __m256 LoadFloat8(const T* p);

template <>
TFGC_AVX2 inline __m256 LoadFloat8<float>(const float* p) {
  return _mm256_loadu_ps(p);
}

template <>
TFGC_AVX2 inline __m256 LoadFloat8<Eigen::half>(const Eigen::half* p) {
  return _mm256_cvtph_ps(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <>
TFGC_AVX2 inline __m256 LoadFloat8<Eigen::bfloat16>(
    const Eigen::bfloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// |v| lane by lane (the sign bit cleared; NaN stays NaN).
TFGC_AVX2 inline __m256 Abs8(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

// For each 8-bit mask, the lanes whose bit is set, in increasing order,
// then zeros: the permutation that moves the selected lanes of a vector to
// its front (a branch-free "compress" for AVX2, which has no compress store).
struct LeftPackTable {
  alignas(32) int32_t lanes[256][8];
  LeftPackTable() {
    for (int m = 0; m < 256; ++m) {
      int out = 0;
      for (int l = 0; l < 8; ++l) {
        if (m & (1 << l)) lanes[m][out++] = l;
      }
      while (out < 8) lanes[m][out++] = 0;
    }
  }
};

inline const LeftPackTable& LeftPack() {
  static const LeftPackTable table;
  return table;
}

// Sum of the eight int32 lanes.
TFGC_AVX2 inline int64_t HorizontalSum(__m256i v) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  int64_t total = 0;
  for (int32_t l : lanes) total += l;
  return total;
}

#endif  // TFGC_HAVE_AVX2_PATH

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_SIMD_H_
