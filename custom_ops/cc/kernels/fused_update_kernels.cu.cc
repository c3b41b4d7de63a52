// Copyright 2026 The tfgc Authors.
//
// CUDA kernel of FusedUpdate and its launchers (fused_update_gpu.h). No
// TensorFlow header: the GPU functor (fused_update_kernels.cc, GOOGLE_CUDA)
// and custom_ops/cuda_harness/ link it as is.
//
// One launch updates up to kTensorsPerLaunch variables, whose table travels
// by value in the kernel's parameters (as PyTorch's multi_tensor_apply
// does), so nothing is copied to the device and the host never waits; a
// longer table takes one launch per chunk. Block row blockIdx.y is the
// chunk's tensor, and its blocks walk that tensor's elements grid-stride;
// the blocks per row come from the largest tensor of the chunk, so rows of
// smaller tensors have blocks that find nothing to do and leave at once.
// The scalars stay on the device: every thread reads them from the array
// TensorFlow computed them in.
//
// Each element gets fused_update::UpdateElement over FlushedFloat below:
// one correctly rounded float32 operation per step (the _rn intrinsics,
// which nvcc never contracts into a fused multiply-add), in Keras's order,
// with the subnormals that a CPU thread with FTZ and DAZ flushes flushed,
// so the bits are those of the CPU kernel and of Keras's own update.

#include <algorithm>
#include <cstdint>

#include "custom_ops/cc/kernels/cuda_float.h"
#include "custom_ops/cc/kernels/cuda_launch.h"
#include "custom_ops/cc/kernels/fused_update_common.h"
#include "custom_ops/cc/kernels/fused_update_gpu.h"

namespace tfgc {
namespace gpu {
namespace {

using fused_update::Rule;

constexpr int kThreads = 256;
constexpr int kTensorsPerLaunch = 48;

// The tensors of one launch, by value.
struct TensorChunk {
  fused_update::Tensor<float> tensors[kTensorsPerLaunch];
};

// Kernel parameters are limited to 4 KiB on every architecture the build
// targets (more needs CUDA 12.1 and Volta); the scalars' pointer follows.
static_assert(sizeof(TensorChunk) + sizeof(const float*) <= 4096,
              "a chunk of tensors must fit the kernel's parameters");

// 2^64, and 2^-126 (the smallest normal float32) times 2^64.
constexpr float kTwoTo64 = 18446744073709551616.0f;
constexpr float kMinNormalTimesTwoTo64 = 2.16840434497100886801e-19f;

__device__ __forceinline__ bool IsMinNormal(float v) {
  return (__float_as_uint(v) & 0x7fffffffu) == 0x00800000u;
}

// A zero of v's sign.
__device__ __forceinline__ float SignedZero(float v) {
  return __uint_as_float(__float_as_uint(v) & 0x80000000u);
}

// x86 decides that a result is tiny, and FTZ makes it zero, after rounding
// it to float32's precision with an unbounded exponent. The device rounds
// in the subnormal range instead, where the steps are coarser: a product or
// quotient just below 2^-126 (from 2^-126 - 2^-150 to 2^-126 - 2^-151,
// exclusive) becomes +-2^-126 on the device but zero on the CPU. `scaled`
// is the same operation with one operand times 2^64 (exact), whose result
// is far above the subnormal range and tells on which side it lies. Sums
// and differences never fall there: they are multiples of 2^-149.
__device__ __forceinline__ float ZeroIfTiny(float result, float scaled) {
  return fabsf(scaled) < kMinNormalTimesTwoTo64 ? SignedZero(result)
                                                : result;
}

// UpdateElement's float policy on the device: every operand and result
// flushed as a CPU thread with FTZ and DAZ flushes them.
struct FlushedFloat {
  __device__ static float Add(float a, float b) {
    return Flush(__fadd_rn(Flush(a), Flush(b)));
  }
  __device__ static float Sub(float a, float b) {
    return Flush(__fsub_rn(Flush(a), Flush(b)));
  }
  __device__ static float Mul(float a, float b) {
    a = Flush(a);
    b = Flush(b);
    const float r = Flush(__fmul_rn(a, b));
    if (!IsMinNormal(r)) return r;
    // |a| = 2^-126 / |b| < 2 here (b is normal): a * 2^64 is exact.
    return ZeroIfTiny(r, __fmul_rn(__fmul_rn(a, kTwoTo64), b));
  }
  __device__ static float Div(float a, float b) {
    a = Flush(a);
    b = Flush(b);
    const float r = Flush(__fdiv_rn(a, b));
    if (!IsMinNormal(r)) return r;
    // |a| = 2^-126 |b| < 2^3 here (b is finite): a * 2^64 is exact.
    return ZeroIfTiny(r, __fdiv_rn(__fmul_rn(a, kTwoTo64), b));
  }
  // The square root of a normal float32 is never subnormal.
  __device__ static float Sqrt(float a) { return __fsqrt_rn(Flush(a)); }
};

template <Rule kRule, bool kDecay>
__global__ void FusedUpdateKernel(TensorChunk chunk, const float* scalars) {
  const fused_update::Tensor<float>& t = chunk.tensors[blockIdx.y];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= t.size) return;
  // Only the rule's scalars: the array may hold no more.
  fused_update::Scalars c = {};
  for (int s = 0; s < fused_update::NumScalars(kRule, kDecay); ++s) {
    c.s[s] = scalars[s];
  }
  for (; i < t.size; i += stride) {
    fused_update::UpdateElement<FlushedFloat, kRule, kDecay>(
        c, t.variable, t.momentum, t.velocity, t.gradient, i);
  }
}

// Launches the kernel over `count` tensors (at most kTensorsPerLaunch).
template <Rule kRule, bool kDecay>
int LaunchChunk(const fused_update::Tensor<float>* tensors, int count,
                const float* scalars, cudaStream_t stream) {
  TensorChunk chunk = {};
  int64_t largest = 0;
  for (int j = 0; j < count; ++j) {
    chunk.tensors[j] = tensors[j];
    largest = std::max(largest, tensors[j].size);
  }
  if (largest == 0) return 0;
  const dim3 grid(StrideGridFor(largest, kThreads), count);
  LaunchKernel(FusedUpdateKernel<kRule, kDecay>, grid, kThreads, 0, stream,
               chunk, scalars);
  return static_cast<int>(cudaGetLastError());
}

using ChunkLauncher = int (*)(const fused_update::Tensor<float>*, int,
                              const float*, cudaStream_t);

// LaunchChunk for `rule`, or null for an unknown rule. As DispatchRule, on
// the host only: under nvcc DispatchRule is device code too, which may not
// launch.
ChunkLauncher ChunkLauncherFor(Rule rule, bool decay) {
  switch (rule) {
    case Rule::kSgd:
      return decay ? LaunchChunk<Rule::kSgd, true>
                   : LaunchChunk<Rule::kSgd, false>;
    case Rule::kMomentum:
      return decay ? LaunchChunk<Rule::kMomentum, true>
                   : LaunchChunk<Rule::kMomentum, false>;
    case Rule::kNesterov:
      return decay ? LaunchChunk<Rule::kNesterov, true>
                   : LaunchChunk<Rule::kNesterov, false>;
    case Rule::kAdam:
      return decay ? LaunchChunk<Rule::kAdam, true>
                   : LaunchChunk<Rule::kAdam, false>;
  }
  return nullptr;
}

}  // namespace

int FusedUpdate(fused_update::Rule rule, bool weight_decay,
                const fused_update::Tensor<float>* tensors, int64_t count,
                const float* scalars, void* stream) {
  const ChunkLauncher launch = ChunkLauncherFor(rule, weight_decay);
  if (launch == nullptr || count < 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  for (int64_t j = 0; j < count; ++j) {
    if (tensors[j].size < 0) return static_cast<int>(cudaErrorInvalidValue);
  }
  int status = 0;
  for (int64_t first = 0; first < count && status == 0;
       first += kTensorsPerLaunch) {
    const int64_t n = std::min<int64_t>(kTensorsPerLaunch, count - first);
    status = launch(tensors + first, static_cast<int>(n), scalars,
                    static_cast<cudaStream_t>(stream));
  }
  return status;
}

int CopyBuffer(float* dst, const float* src, int64_t n, void* stream) {
  if (n < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return 0;
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                      cudaMemcpyDeviceToDevice,
                      static_cast<cudaStream_t>(stream)));
}

}  // namespace gpu
}  // namespace tfgc
