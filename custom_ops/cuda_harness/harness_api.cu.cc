// Copyright 2026 The tfgc Authors.
//
// A C API over the typed CUDA launchers of custom_ops/cc/kernels/*_gpu.h,
// for ctypes (run_harness.py): the same kernel source the TF op uses, built
// by nvcc alone, so the kernels can be checked and timed on a GPU machine
// that has no TensorFlow. Element types travel as codes (0 float32,
// 1 float16, 2 bfloat16) and pick the launchers' instantiation. Every
// function returns a cudaError_t value (0 = ok). Compiled as C++ with
// cuda_emulation.h force-included, the same API runs the kernels on the CPU
// emulation (run_harness.py --emulate).

#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>  // _mm_getcsr, _mm_setcsr
#define TFGC_HARNESS_HAVE_MXCSR 1
#else
#define TFGC_HARNESS_HAVE_MXCSR 0
#endif

#include "custom_ops/cc/kernels/bits_gpu.h"
#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/fused_update_common.h"
#include "custom_ops/cc/kernels/fused_update_gpu.h"
#include "custom_ops/cc/kernels/golomb_gpu.h"
#include "custom_ops/cc/kernels/residual_gpu.h"
#include "custom_ops/cc/kernels/scatter_gpu.h"
#include "custom_ops/cc/kernels/top_k_sample_common.h"
#include "custom_ops/cc/kernels/top_k_sample_gpu.h"
#include "custom_ops/cc/kernels/top_k_two_sided_gpu.h"

namespace {

void* g_scratch = nullptr;
int64_t g_scratch_bytes = 0;
cudaEvent_t g_timer_start = nullptr;
cudaEvent_t g_timer_stop = nullptr;
#if defined(TFGC_CUDA_EMULATION)
// What the launchers of the last tfgc_top_k_sample (or its segmented form,
// or tfgc_top_k_two_sided) and of the last tfgc_fused_update asked of the
// host.
tfgc::emu::HostTraffic g_top_k_traffic;
tfgc::emu::HostTraffic g_fused_update_traffic;
#endif

// Runs body(static_cast<T*>(nullptr)) with the element type T of the C
// API's code `dtype`; cudaErrorInvalidValue for another code.
template <typename F>
int WithDType(int dtype, F&& body) {
  switch (dtype) {
    case 0:
      return body(static_cast<float*>(nullptr));
    case 1:
      return body(static_cast<__half*>(nullptr));
    case 2:
      return body(static_cast<__nv_bfloat16*>(nullptr));
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int EnsureScratch(int64_t bytes) {
  if (bytes <= g_scratch_bytes) return 0;
  if (g_scratch != nullptr) cudaFree(g_scratch);
  g_scratch = nullptr;
  g_scratch_bytes = 0;
  const cudaError_t err = cudaMalloc(&g_scratch, bytes);
  if (err != cudaSuccess) return static_cast<int>(err);
  g_scratch_bytes = bytes;
  return 0;
}

// While alive, the calling thread flushes denormal results to zero and
// reads denormal operands as zero (MXCSR FTZ and DAZ), as TensorFlow sets
// its threads, when `on`; then restores the previous mode. Under the
// emulation the "device" code runs on this thread too, so it also stands
// for device code built with -ftz=true.
class ScopedFlushDenormals {
 public:
  explicit ScopedFlushDenormals(bool on) {
#if TFGC_HARNESS_HAVE_MXCSR
    saved_ = _mm_getcsr();
    if (on) _mm_setcsr(saved_ | 0x8040u);  // FTZ (bit 15), DAZ (bit 6)
#else
    (void)on;
#endif
  }
  ~ScopedFlushDenormals() {
#if TFGC_HARNESS_HAVE_MXCSR
    _mm_setcsr(saved_);
#endif
  }
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  unsigned saved_ = 0;
};

// One call of the C API whose launchers' host traffic is recorded: while
// alive, the thread flushes denormals when asked (ScopedFlushDenormals);
// under the emulation, what the launchers asked of the host meanwhile goes
// to *record (g_top_k_traffic or g_fused_update_traffic; elsewhere null).
#if defined(TFGC_CUDA_EMULATION)
using TrafficRecord = tfgc::emu::HostTraffic;
#define TFGC_TRAFFIC_RECORD(name) (&(name))
#else
using TrafficRecord = void;
#define TFGC_TRAFFIC_RECORD(name) nullptr
#endif

class LauncherCall {
 public:
  LauncherCall(bool flush_denormals, TrafficRecord* record)
      : flush_(flush_denormals), record_(record) {}
  ~LauncherCall() {
#if defined(TFGC_CUDA_EMULATION)
    const tfgc::emu::HostTraffic& after = tfgc::emu::Traffic();
    *record_ = {after.waits - before_.waits, after.to_host - before_.to_host,
                after.from_host - before_.from_host,
                after.launches - before_.launches};
#endif
  }
  LauncherCall(const LauncherCall&) = delete;
  LauncherCall& operator=(const LauncherCall&) = delete;

 private:
  ScopedFlushDenormals flush_;
  [[maybe_unused]] TrafficRecord* record_;  // only the emulation records
#if defined(TFGC_CUDA_EMULATION)
  tfgc::emu::HostTraffic before_ = tfgc::emu::Traffic();
#endif
};

// The rows (offset, n, k, seed) of a host table as the launchers' type.
std::vector<tfgc::TopKSampleSegment> SegmentTable(const int64_t* table,
                                                 int count) {
  std::vector<tfgc::TopKSampleSegment> segments(count > 0 ? count : 0);
  for (int s = 0; s < count; ++s) {
    segments[s].offset = table[4 * s];
    segments[s].n = table[4 * s + 1];
    segments[s].k = table[4 * s + 2];
    segments[s].seed = table[4 * s + 3];
  }
  return segments;
}

}  // namespace

extern "C" {

int tfgc_device_count(int* count) {
  return static_cast<int>(cudaGetDeviceCount(count));
}

int tfgc_malloc(void** ptr, int64_t bytes) {
  return static_cast<int>(cudaMalloc(ptr, bytes > 0 ? bytes : 1));
}

int tfgc_free(void* ptr) { return static_cast<int>(cudaFree(ptr)); }

int tfgc_copy_to_device(void* dst, const void* src, int64_t bytes) {
  return static_cast<int>(
      cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

int tfgc_copy_to_host(void* dst, const void* src, int64_t bytes) {
  return static_cast<int>(
      cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

// Whether tfgc_top_k_sample can flush denormals (x86: MXCSR).
int tfgc_can_flush_denormals() { return TFGC_HARNESS_HAVE_MXCSR; }

// dtype: 0 float32, 1 float16, 2 bfloat16; mode: 0 mstopk, 1 threshold,
// 2 trimmed. `capacity` is the length of values/indices; *out_size gets the
// selection size (an error is returned when it exceeds capacity).
// `zero_selected` (nullable) has its selected entries zeroed. With
// `flush_denormals` the call runs in ScopedFlushDenormals (an error where
// tfgc_can_flush_denormals() is 0). Under the emulation,
// tfgc_emulation_top_k_sample_traffic then tells what the three launchers
// asked of the host.
int tfgc_top_k_sample(int dtype, const void* x, int64_t n, int64_t k,
                      int mode, int rounds, int64_t seed, void* values,
                      int32_t* indices, int64_t capacity, int64_t* out_size,
                      void* zero_selected, int flush_denormals) {
  if (flush_denormals && !TFGC_HARNESS_HAVE_MXCSR) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  LauncherCall call(flush_denormals != 0,
                    TFGC_TRAFFIC_RECORD(g_top_k_traffic));
  int err = EnsureScratch(tfgc::gpu::TopKSampleScratchBytes(n));
  if (err != 0) return err;
  const auto m = static_cast<tfgc::TopKSampleMode>(mode);
  return WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* data = static_cast<const T*>(x);
    int status = tfgc::gpu::TopKSamplePlan(data, n, k, m, rounds, seed,
                                           g_scratch, nullptr);
    if (status == 0) {
      status = tfgc::gpu::TopKSampleOutputSize(m, n, k, g_scratch, nullptr,
                                               out_size);
    }
    if (status == 0 && *out_size > capacity) {
      status = static_cast<int>(cudaErrorInvalidValue);
    }
    if (status == 0) {
      status = tfgc::gpu::TopKSampleWrite(
          data, n, *out_size, static_cast<T*>(values), indices,
          static_cast<T*>(zero_selected), g_scratch, nullptr);
    }
    return status;
  });
}

// TopKRatio (TopKRatioWithResidual's launcher) on device buffers of n
// elements (g, r, w; acc gets the new residual and may be r) and k
// (values, indices); dtype as above; `flush_denormals` as above.
int tfgc_top_k_ratio(int dtype, const void* g, const void* r, const void* w,
                     float floor, int64_t n, int64_t k, void* acc,
                     void* values, int32_t* indices, int flush_denormals) {
  if (flush_denormals && !TFGC_HARNESS_HAVE_MXCSR) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  LauncherCall call(flush_denormals != 0,
                    TFGC_TRAFFIC_RECORD(g_top_k_traffic));
  int err = EnsureScratch(tfgc::gpu::TopKRatioScratchBytes(n, k));
  if (err != 0) return err;
  return WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return tfgc::gpu::TopKRatio(
        static_cast<const T*>(g), static_cast<const T*>(r),
        static_cast<const T*>(w), floor, n, k, static_cast<T*>(acc),
        static_cast<T*>(values), indices, g_scratch, nullptr);
  });
}

// TopKTwoSided of x[n] (a device buffer; dtype as above): each side's
// selection, at most k entries, into pos_values / pos_indices and
// neg_values / neg_indices (room for k entries each); sizes[2] (host) gets
// their lengths. The scratch is a device buffer of its own, so that the
// emulation's guard page catches an access past it. `flush_denormals` and
// the recorded host traffic as tfgc_top_k_sample's.
int tfgc_top_k_two_sided(int dtype, const void* x, int64_t n, int64_t k,
                         void* pos_values, int32_t* pos_indices,
                         void* neg_values, int32_t* neg_indices,
                         int64_t* sizes, int flush_denormals) {
  if (flush_denormals && !TFGC_HARNESS_HAVE_MXCSR) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  LauncherCall call(flush_denormals != 0,
                    TFGC_TRAFFIC_RECORD(g_top_k_traffic));
  const int64_t bytes = tfgc::gpu::TopKTwoSidedScratchBytes(n);
  void* scratch = nullptr;
  int err = static_cast<int>(cudaMalloc(&scratch, bytes > 0 ? bytes : 1));
  if (err != 0) return err;
  err = WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* data = static_cast<const T*>(x);
    int status = tfgc::gpu::TopKTwoSidedPlan(data, n, k, scratch, nullptr);
    if (status == 0) {
      status = tfgc::gpu::TopKTwoSidedOutputSizes(n, k, scratch, nullptr,
                                                  sizes);
    }
    if (status == 0 && (sizes[0] > k || sizes[1] > k)) {
      status = static_cast<int>(cudaErrorInvalidValue);
    }
    if (status == 0) {
      status = tfgc::gpu::TopKTwoSidedWrite(
          data, n, sizes, static_cast<T*>(pos_values), pos_indices,
          static_cast<T*>(neg_values), neg_indices, scratch, nullptr);
    }
    return status;
  });
  cudaFree(scratch);
  return err;
}

// The scratch bytes of the segmented TopKSample over `table` (as below);
// -1 for an invalid table.
int64_t tfgc_top_k_sample_segments_scratch_bytes(const int64_t* table,
                                                 int count) {
  return tfgc::gpu::TopKSampleSegmentsScratchBytes(
      SegmentTable(table, count).data(), count);
}

// The segmented TopKSample over the fused buffer `x`: `table` (host) holds
// `count` rows (offset, n, k, seed); the selections go one after another
// into values/indices (`capacity` entries), out_sizes[count] (host) gets
// each segment's size. `scratch` holds
// tfgc_top_k_sample_segments_scratch_bytes; when null, the call allocates
// a device buffer of exactly that size and frees it, so the guard page
// catches an access past it (the timings pass their own, as TensorFlow's
// allocator would). Otherwise as tfgc_top_k_sample (traffic included).
int tfgc_top_k_sample_segments(int dtype, const void* x,
                               const int64_t* table, int count, int mode,
                               int rounds, void* values, int32_t* indices,
                               int64_t capacity, int64_t* out_sizes,
                               void* zero_selected, int flush_denormals,
                               void* scratch) {
  if (flush_denormals && !TFGC_HARNESS_HAVE_MXCSR) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  LauncherCall call(flush_denormals != 0,
                    TFGC_TRAFFIC_RECORD(g_top_k_traffic));
  const std::vector<tfgc::TopKSampleSegment> segments =
      SegmentTable(table, count);
  const bool own_scratch = scratch == nullptr;
  int err = 0;
  if (own_scratch) {
    // -1 for an invalid table, which the launchers must refuse.
    const int64_t bytes =
        tfgc::gpu::TopKSampleSegmentsScratchBytes(segments.data(), count);
    err = static_cast<int>(cudaMalloc(&scratch, bytes > 0 ? bytes : 1));
    if (err != 0) return err;
  }
  const auto m = static_cast<tfgc::TopKSampleMode>(mode);
  err = WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* data = static_cast<const T*>(x);
    int status = tfgc::gpu::TopKSampleSegmentsPlan(
        data, segments.data(), count, m, rounds, scratch, nullptr);
    if (status == 0) {
      status = tfgc::gpu::TopKSampleSegmentsOutputSizes(
          m, segments.data(), count, scratch, nullptr, out_sizes);
    }
    int64_t total = 0;
    for (int s = 0; status == 0 && s < count; ++s) total += out_sizes[s];
    if (status == 0 && total > capacity) {
      status = static_cast<int>(cudaErrorInvalidValue);
    }
    if (status == 0) {
      status = tfgc::gpu::TopKSampleSegmentsWrite(
          data, segments.data(), count, total, static_cast<T*>(values),
          indices, static_cast<T*>(zero_selected), scratch, nullptr);
    }
    return status;
  });
  if (own_scratch) cudaFree(scratch);
  return err;
}

// FusedUpdate of `count` float32 tensors by `rule` (0 SGD, 1 momentum,
// 2 Nesterov, 3 Adam; fused_update_common.h), weight decay first when
// `weight_decay`: pointers[4 * j ...] holds tensor j's device buffers
// (variable, momentum, velocity, gradient; null for a slot the rule does
// not have) and sizes[j] its elements; `scalars` is a device array of the
// rule's scalars. `flush_denormals` as in tfgc_top_k_sample; under the
// emulation, tfgc_emulation_fused_update_traffic then tells what the
// launcher asked of the host.
int tfgc_fused_update(int rule, int weight_decay, void* const* pointers,
                      const int64_t* sizes, int64_t count,
                      const float* scalars, int flush_denormals) {
  if (flush_denormals && !TFGC_HARNESS_HAVE_MXCSR) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  LauncherCall call(flush_denormals != 0,
                    TFGC_TRAFFIC_RECORD(g_fused_update_traffic));
  std::vector<tfgc::fused_update::Tensor<float>> tensors(count > 0 ? count
                                                                   : 0);
  for (int64_t j = 0; j < count; ++j) {
    tensors[j] = {static_cast<float*>(pointers[4 * j]),
                  static_cast<float*>(pointers[4 * j + 1]),
                  static_cast<float*>(pointers[4 * j + 2]),
                  static_cast<const float*>(pointers[4 * j + 3]), sizes[j]};
  }
  return tfgc::gpu::FusedUpdate(static_cast<tfgc::fused_update::Rule>(rule),
                                weight_decay != 0, tensors.data(), count,
                                scalars, nullptr);
}

// dst[n] = src[n], both device buffers, through FusedUpdate's CopyBuffer.
int tfgc_copy_buffer(float* dst, const float* src, int64_t n) {
  return tfgc::gpu::CopyBuffer(dst, src, n, nullptr);
}

int tfgc_add_residual(int dtype, const void* g, const void* r, void* acc,
                      int64_t n) {
  return WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return tfgc::gpu::AddResidual(static_cast<const T*>(g),
                                  static_cast<const T*>(r),
                                  static_cast<T*>(acc), n, nullptr);
  });
}

int tfgc_new_residual(int dtype, const void* corrected, const void* sent,
                      void* out, int64_t n) {
  return WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return tfgc::gpu::NewResidual(static_cast<const T*>(corrected),
                                  static_cast<const T*>(sent),
                                  n, static_cast<T*>(out), nullptr);
  });
}

int tfgc_pack_bits(const bool* mask, int64_t n, int32_t* words) {
  return tfgc::gpu::PackBits(mask, n, words, nullptr);
}

int tfgc_unpack_bits(const int32_t* words, int64_t rows, int64_t n,
                     bool* mask) {
  return tfgc::gpu::UnpackBits(words, rows, n, mask, nullptr);
}

int tfgc_unpack_bits_sum(int dtype, const int32_t* words, const void* scales,
                         int64_t p, int64_t n, void* out) {
  return WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return tfgc::gpu::UnpackBitsSum(words, static_cast<const T*>(scales), p,
                                    n, static_cast<T*>(out), nullptr);
  });
}

int tfgc_unpack_bits_vote(int dtype, const int32_t* words, int64_t p,
                          int64_t n, void* out) {
  return WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return tfgc::gpu::UnpackBitsVote(words, p, n, static_cast<T*>(out),
                                     nullptr);
  });
}

// out[n] = sum of values[i] at indices[i] (m pairs), through `scratch` of
// tfgc_scatter_add_sum_scratch_bytes(m) bytes, a device buffer of its own
// so that the emulation's guard page catches an access past it.
// *bad_position gets -1, or the first i with indices[i] outside [0, n) and
// *bad_index that index.
int64_t tfgc_scatter_add_sum_scratch_bytes(int64_t m) {
  return tfgc::gpu::ScatterAddSumScratchBytes(m);
}

int tfgc_scatter_add_sum(int dtype, const void* values,
                         const int32_t* indices, int64_t m, int64_t n,
                         void* out, void* scratch, int64_t* bad_position,
                         int32_t* bad_index) {
  return WithDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return tfgc::gpu::ScatterAddSum(static_cast<const T*>(values), indices, m,
                                    n, static_cast<T*>(out), scratch, nullptr,
                                    bad_position, bad_index);
  });
}

// GolombEncode of k int32 or int64 indices (index_int64) in [0, n): sizes
// the stream (*num_bits, or *bad_position >= 0 with *bad_value and
// *bad_prev for the first invalid index), then writes it to `out` (at most
// `capacity` bytes) through the word scratch `words` (at least
// ceil(num_bits / 32) words). `scratch` holds
// tfgc_golomb_encode_scratch_bytes(k) bytes. Separate device buffers, so
// the guard pages catch an access past any of them.
int64_t tfgc_golomb_encode_scratch_bytes(int64_t k) {
  return tfgc::gpu::GolombEncodeScratchBytes(k);
}

int tfgc_golomb_encode(int index_int64, const void* indices, int64_t k,
                       int64_t n, int b, void* scratch, uint32_t* words,
                       int64_t word_capacity, uint8_t* out, int64_t capacity,
                       int64_t* num_bits, int64_t* bad_position,
                       int64_t* bad_value, int64_t* bad_prev) {
  auto encode = [&](const auto* idx) {
    int err = tfgc::gpu::GolombEncodeSize(idx, k, n, b, scratch, nullptr,
                                          num_bits, bad_position, bad_value,
                                          bad_prev);
    if (err != 0 || *bad_position >= 0) return err;
    if ((*num_bits + 7) / 8 > capacity ||
        (*num_bits + 31) / 32 > word_capacity) {
      return static_cast<int>(cudaErrorInvalidValue);
    }
    return tfgc::gpu::GolombEncodeWrite(idx, k, b, *num_bits, scratch, words,
                                        out, nullptr);
  };
  return index_int64 != 0 ? encode(static_cast<const int64_t*>(indices))
                          : encode(static_cast<const int32_t*>(indices));
}

// GolombDecode of k positions below `limit` through `scratch` of
// tfgc_golomb_decode_scratch_bytes(num_bytes, b) bytes; error[3] as the
// launcher's.
int64_t tfgc_golomb_decode_scratch_bytes(int64_t num_bytes, int b) {
  return tfgc::gpu::GolombDecodeScratchBytes(num_bytes, b);
}

int tfgc_golomb_decode(const uint8_t* encoded, int64_t num_bytes, int64_t k,
                       int b, int64_t limit, int32_t* out, void* scratch,
                       int64_t* error) {
  return tfgc::gpu::GolombDecode(encoded, num_bytes, k, b, limit, out,
                                 scratch, nullptr, error);
}

#if defined(TFGC_CUDA_EMULATION)
// What the emulated device reports (multiprocessors, maximum grid size in x)
// and the order in which a block's threads run between barriers (schedule:
// 0 round-robin, 1 reverse, 2 random from `seed`).
int tfgc_emulation_configure(int multiprocessors, int max_grid_x,
                             int schedule, uint64_t seed) {
  if (multiprocessors < 1 || max_grid_x < 1 || schedule < 0 ||
      schedule > 2) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  tfgc::emu::Config config = tfgc::emu::GetConfig();
  config.multiprocessors = multiprocessors;
  config.max_grid_x = max_grid_x;
  config.schedule = static_cast<tfgc::emu::Schedule>(schedule);
  config.seed = seed;
  tfgc::emu::Configure(config);
  return 0;
}

// The host waits, copies to the host and copies from the host of the
// launchers of the last tfgc_top_k_sample, tfgc_top_k_sample_segments or
// tfgc_top_k_two_sided (traffic[3]): no wait and no copy to the host in
// mstopk and trimmed modes, at most one of each in threshold mode (the
// output sizes); the segmented launch copies its segment table from the
// host once; TopKTwoSided waits once and copies its two sizes once.
int tfgc_emulation_top_k_sample_traffic(int64_t* traffic) {
  traffic[0] = g_top_k_traffic.waits;
  traffic[1] = g_top_k_traffic.to_host;
  traffic[2] = g_top_k_traffic.from_host;
  return 0;
}

// The same of the last tfgc_fused_update, and its kernel launches
// (traffic[4]): no wait and no copy either way (the table travels in the
// kernels' parameters, the scalars stay on the device), and one launch per
// chunk of the table that holds a non-empty tensor.
int tfgc_emulation_fused_update_traffic(int64_t* traffic) {
  traffic[0] = g_fused_update_traffic.waits;
  traffic[1] = g_fused_update_traffic.to_host;
  traffic[2] = g_fused_update_traffic.from_host;
  traffic[3] = g_fused_update_traffic.launches;
  return 0;
}

// float32 -> dtype (1 float16, 2 bfloat16) -> float32 through the device
// conversions the kernels use, so that the emulated ones can be checked
// against numpy: `bits` gets the 16-bit patterns, `back` their values.
int tfgc_emulation_convert(int dtype, const float* in, int64_t n,
                           uint16_t* bits, float* back) {
  if (dtype != 1 && dtype != 2) return static_cast<int>(cudaErrorInvalidValue);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == 1) {
      const __half h = __float2half_rn(in[i]);
      bits[i] = h.x;
      back[i] = __half2float(h);
    } else {
      const __nv_bfloat16 b = __float2bfloat16_rn(in[i]);
      bits[i] = b.x;
      back[i] = __bfloat162float(b);
    }
  }
  return 0;
}
#endif

int tfgc_synchronize() { return static_cast<int>(cudaDeviceSynchronize()); }

// The kernel timer of the timings (timings.py): tfgc_timer_start records
// an event on the default stream, tfgc_timer_stop another, waits for it
// and gives the milliseconds between them.
int tfgc_timer_start() {
  if (g_timer_start == nullptr) {
    const cudaError_t err = cudaEventCreate(&g_timer_start);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return static_cast<int>(cudaEventRecord(g_timer_start, nullptr));
}

int tfgc_timer_stop(float* ms) {
  if (g_timer_stop == nullptr) {
    const cudaError_t err = cudaEventCreate(&g_timer_stop);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  cudaError_t err = cudaEventRecord(g_timer_stop, nullptr);
  if (err == cudaSuccess) err = cudaEventSynchronize(g_timer_stop);
  if (err == cudaSuccess) {
    err = cudaEventElapsedTime(ms, g_timer_start, g_timer_stop);
  }
  return static_cast<int>(err);
}

// A device-to-device copy on the default stream: the timings' floor for a
// kernel that reads its input once.
int tfgc_copy_device(void* dst, const void* src, int64_t bytes) {
  return static_cast<int>(cudaMemcpyAsync(dst, src, bytes,
                                          cudaMemcpyDeviceToDevice, nullptr));
}

}  // extern "C"
