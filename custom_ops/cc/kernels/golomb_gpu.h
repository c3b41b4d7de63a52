// Copyright 2026 The tfgc Authors.
//
// The CUDA launchers of GolombEncode and GolombDecode
// (golomb_kernels.cu.cc), the encoder's typed on the index type Index:
// int32_t or int64_t, the types it is instantiated for. The GPU functors of
// golomb_kernels.cc and the CUDA harness call them. No TensorFlow or CUDA
// header here (kernel_utils.h says why). Device pointers unless said
// otherwise; `stream` is a cudaStream_t; an int result is a cudaError_t
// value (0 is success). The format is golomb_common.h's.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_GPU_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_GPU_H_

#include <cstdint>

namespace tfgc {
namespace gpu {

// Bytes of the device scratch GolombEncodeSize/Write need for k positions.
int64_t GolombEncodeScratchBytes(int64_t k);

// Checks the k indices (strictly increasing, in [0, n)) and sizes their
// codes; blocks until the stream is done. Host outputs: *bad_position is -1
// or the first invalid j, with *bad_value = indices[j] and *bad_prev =
// indices[j - 1] (-1 for j = 0); when valid, *num_bits is the stream length
// (saturated near 2^62, far above any stream the ops accept) and the
// scratch holds the bit offsets GolombEncodeWrite reads.
template <typename Index>
int GolombEncodeSize(const Index* indices, int64_t k, int64_t n, int b,
                     void* scratch, void* stream, int64_t* num_bits,
                     int64_t* bad_position, int64_t* bad_value,
                     int64_t* bad_prev);

// Writes the stream sized by the last GolombEncodeSize of these indices
// into `out` (ceil(num_bits / 8) bytes), through `words`, device scratch of
// ceil(num_bits / 32) uint32 words.
template <typename Index>
int GolombEncodeWrite(const Index* indices, int64_t k, int b,
                      int64_t num_bits, const void* scratch, uint32_t* words,
                      uint8_t* out, void* stream);

// Bytes of the device scratch GolombDecode needs for a stream of num_bytes
// bytes coded with parameter 2^b.
int64_t GolombDecodeScratchBytes(int64_t num_bytes, int b);

// Decodes k positions (all < limit, limit <= 2^31) from num_bytes bytes
// into out[k], in parallel over chunks of the stream (golomb_kernels.cu.cc
// says how). Blocks until the stream is done and sets the host array
// error[3] = {golomb::DecodeError, code j, value} for the first bad code,
// as the CPU kernel finds it: the value is the lower bound of position j
// for kDecodeQuotientTooLarge and position j for kDecodePositionTooLarge
// (the CPU kernel's messages). out[i] is written for every i below that j.
int GolombDecode(const uint8_t* encoded, int64_t num_bytes, int64_t k, int b,
                 int64_t limit, int32_t* out, void* scratch, void* stream,
                 int64_t* error);

}  // namespace gpu
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_GPU_H_
