// Copyright 2026 The tfgc Authors.
//
// The functors of Tfgc>GolombEncode and Tfgc>GolombDecode (kernel_utils.h
// describes the layout): the CPU specialisations in golomb_kernels.cc, the
// GPU ones over the launchers of golomb_gpu.h. The bit format is
// golomb_common.h's.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_KERNELS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "custom_ops/cc/kernels/golomb_common.h"
#include "custom_ops/cc/kernels/kernel_utils.h"

namespace tfgc {
namespace functor {

// The first invalid entry of GolombEncode's `indices`: indices[position] =
// value, outside [0, n) or not above indices[position - 1] = prev (-1 for
// position 0); position -1 when every entry is valid.
struct EncodeFault {
  int64_t position = -1;
  int64_t value = 0;
  int64_t prev = 0;
};

// GolombEncode of Index (int32_t or int64_t) positions, in two steps, so
// that the op kernel can allocate the stream in between. The functor
// object keeps what Write needs besides its arguments (the CPU's block
// offsets, the GPU's scratch), from Size to Write. Each device specialises
// the whole class template; the primary template is the interface.
template <typename Device, typename Index>
class GolombEncode {
 public:
  // Checks the k positions (strictly increasing, in [0, n)), setting
  // *fault to the first invalid one, and sums the bits of their codes with
  // parameter 2^b.
  absl::Status Size(OpKernelContext* ctx, const Index* indices, int64_t k,
                    int64_t n, int b, uint64_t* num_bits, EncodeFault* fault);

  // Writes the stream of num_bits > 0 bits to out[ceil(num_bits / 8)].
  absl::Status Write(OpKernelContext* ctx, const Index* indices, int64_t k,
                     int b, int64_t num_bits, uint8_t* out);
};

// What GolombDecode found wrong (golomb::DecodeError): `error` at code j;
// `value` is position j, or its lower bound for kDecodeQuotientTooLarge.
struct DecodeFault {
  int64_t error = golomb::kDecodeOk;
  int64_t j = 0;
  int64_t value = 0;
};

// GolombDecode: decodes k > 0 positions, all below `limit`, from
// encoded[num_bytes] into out[k], until the first fault.
template <typename Device>
struct GolombDecode {
  absl::Status operator()(OpKernelContext* ctx, const uint8_t* encoded,
                          int64_t num_bytes, int64_t k, int b, int64_t limit,
                          int32_t* out, DecodeFault* fault);
};

}  // namespace functor
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_KERNELS_H_
