// Copyright 2026 The tfgc Authors.
//
// GolombEncode / GolombDecode: Golomb-Rice coding of sorted, unique positions
// (SBC position coding, docs/algorithms.md). This header holds the bit
// format and the decoder's error kinds, which the CPU functors, the CUDA
// kernels and the CUDA harness share; it includes no TensorFlow header
// (kernel_utils.h says why).
//
// Format (the pure-TF reference in tfgc/ops/golomb.py writes the same bytes):
//   gap_0 = idx_0, gap_j = idx_j - idx_{j-1} - 1 (every gap >= 0).
//   Each gap is coded with parameter M = 2^b as
//     q = gap >> b one bits, one zero bit, then r = gap & (M - 1) in b bits,
//     most significant bit first.
//   Bit i of the stream is bit 7 - (i % 8) of byte i / 8 (MSB first); the
//   last byte is padded with zero bits.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_COMMON_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_COMMON_H_

#include <cstdint>
#include <cstring>

namespace tfgc {
namespace golomb {

constexpr int kMaxB = 31;

// The word loads and stores below byte-swap: little-endian hosts only.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "golomb_common.h assumes a little-endian host");

// What GolombDecode finds wrong: none, a code running past the stream, a
// unary part above (limit >> b), a position >= limit.
enum DecodeError : int64_t {
  kDecodeOk = 0,
  kDecodeTruncated = 1,
  kDecodeQuotientTooLarge = 2,
  kDecodePositionTooLarge = 3,
};

// Bits of the code of `gap` with parameter 2^b.
inline uint64_t CodeBits(uint64_t gap, int b) {
  return (gap >> b) + 1 + static_cast<uint64_t>(b);
}

// Writes bits MSB first from an absolute bit offset, 32 bits at a time.
// Bytes go to out[pos] except the byte at index `shared_byte`, which goes to
// *shared_slot (the byte shared with the writer of the preceding block, to
// be OR-ed in later); -1 for none.
class BitWriter {
 public:
  BitWriter(uint8_t* out, int64_t bit_offset, int64_t shared_byte,
            uint8_t* shared_slot)
      : out_(out),
        pos_(bit_offset >> 3),
        fill_(static_cast<int>(bit_offset & 7)),
        shared_byte_(shared_byte),
        shared_slot_(shared_slot) {}

  // Appends the low `len` bits of `value` (len <= 32, value < 2^len).
  void Put(uint64_t value, int len) {
    acc_ = (acc_ << len) | value;
    fill_ += len;
    if (fill_ >= 32) {
      fill_ -= 32;
      const uint32_t word = static_cast<uint32_t>(acc_ >> fill_);
      if (pos_ == shared_byte_) {
        *shared_slot_ = static_cast<uint8_t>(word >> 24);
        for (int i = 1; i < 4; ++i) {
          out_[pos_ + i] = static_cast<uint8_t>(word >> (24 - 8 * i));
        }
      } else {
        const uint32_t big_endian = __builtin_bswap32(word);
        std::memcpy(out_ + pos_, &big_endian, 4);
      }
      pos_ += 4;
    }
  }

  // Appends the code of `gap`: q ones, a zero, then the b-bit remainder.
  void PutCode(uint64_t gap, int b) {
    uint64_t q = gap >> b;
    while (q >= 32) {
      Put(0xFFFFFFFFu, 32);
      q -= 32;
    }
    // q ones and the terminating zero: q + 1 <= 32 bits.
    Put(((uint64_t{1} << q) - 1) << 1, static_cast<int>(q) + 1);
    if (b > 0) Put(gap & ((uint64_t{1} << b) - 1), b);
  }

  // Writes the remaining bits, the last byte padded with zero bits.
  void Flush() {
    while (fill_ > 0) {
      const int take = fill_ < 8 ? fill_ : 8;
      fill_ -= take;
      const uint8_t byte =
          static_cast<uint8_t>(((acc_ >> fill_) << (8 - take)) & 0xFF);
      if (pos_ == shared_byte_) {
        *shared_slot_ = byte;
      } else {
        out_[pos_] = byte;
      }
      ++pos_;
    }
  }

 private:
  uint8_t* out_;
  int64_t pos_;
  int fill_;
  int64_t shared_byte_;
  uint8_t* shared_slot_;
  uint64_t acc_ = 0;
};

// Reads bits MSB first; bits past the end read as zero.
class BitReader {
 public:
  BitReader(const uint8_t* data, int64_t num_bytes)
      : data_(data), num_bytes_(num_bytes), num_bits_(num_bytes * 8) {}

  int64_t pos() const { return pos_; }
  int64_t num_bits() const { return num_bits_; }
  void Skip(int64_t bits) { pos_ += bits; }

  // The 64 bits from the current position, the first one in bit 63.
  uint64_t Peek() const {
    const int64_t byte = pos_ >> 3;
    const int off = static_cast<int>(pos_ & 7);
    uint64_t w = 0;
    if (byte + 9 <= num_bytes_) {
      std::memcpy(&w, data_ + byte, 8);
      w = __builtin_bswap64(w);
      if (off > 0) w = (w << off) | (data_[byte + 8] >> (8 - off));
      return w;
    }
    for (int i = 0; i < 9; ++i) {
      const int64_t at = byte + i;
      const uint64_t v = at < num_bytes_ ? data_[at] : 0;
      if (i < 8) {
        w = (w << 8) | v;
      } else if (off > 0) {
        w = (w << off) | (v >> (8 - off));
      }
    }
    return w;
  }

 private:
  const uint8_t* data_;
  int64_t num_bytes_;
  int64_t num_bits_;
  int64_t pos_ = 0;
};

// Number of leading one bits of w (64 when all are set).
inline int LeadingOnes(uint64_t w) {
  const uint64_t inv = ~w;
  return inv == 0 ? 64 : __builtin_clzll(inv);
}

}  // namespace golomb
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_GOLOMB_COMMON_H_
