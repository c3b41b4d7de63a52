// Copyright 2026 The tfgc Authors.
//
// The TensorFlow names every kernel file (*_kernels.cc) uses, the devices
// their op kernels and functors are templated on, and the checks and error
// messages several ops share. Depends on TensorFlow: not for the headers that
// the CUDA sources (*.cu.cc) and custom_ops/cuda_harness include.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_

#include <cstdint>
#include <type_traits>

#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // Eigen::GpuDevice, before anything includes Eigen
#include "unsupported/Eigen/CXX11/Tensor"
#endif  // GOOGLE_CUDA

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tfgc {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;

// The devices of the op kernels and of their functors (functor::XxxFunctor<
// Device, ...>), as in TensorFlow's own kernels.
using CPUDevice = Eigen::ThreadPoolDevice;
using GPUDevice = Eigen::GpuDevice;

// "`name` must be a scalar": for a scalar input.
inline absl::Status CheckScalar(const Tensor& t, const char* name) {
  if (TensorShapeUtils::IsScalar(t.shape())) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("`", name, "` must be a scalar. Received: shape=",
                   t.shape().DebugString()));
}

// "`name` must be non-negative": for a size read from an input or attribute.
inline absl::Status CheckNonNegative(int64_t value, const char* name) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "`", name, "` must be non-negative. Received: ", name, "=", value));
}

// The error of a position `indices[position] = index` outside [0, n).
inline absl::Status IndexOutOfRange(int64_t position, int64_t index,
                                    int64_t n) {
  return absl::InvalidArgumentError(
      absl::StrCat("`indices` must be in [0, n). Received: indices[",
                   position, "]=", index, " with n=", n));
}

// The element-type code the CUDA launchers take: 0 float, 1 half,
// 2 bfloat16 (gpu::DType of top_k_sample_kernels.h).
template <typename T>
constexpr int GpuDType() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Eigen::half> ||
                    std::is_same_v<T, Eigen::bfloat16>,
                "the CUDA kernels take float, half and bfloat16");
  if constexpr (std::is_same_v<T, float>) return 0;
  if constexpr (std::is_same_v<T, Eigen::half>) return 1;
  return 2;
}

#if GOOGLE_CUDA
// The status of a CUDA launcher's result (a cudaError_t value, 0 success).
inline absl::Status CudaStatus(int err, const char* launcher) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA launcher ", launcher,
                                          " failed: cudaError_t ", err));
}

// TensorFlow's compute stream of the op's GPU, for the launchers.
inline void* StreamOf(OpKernelContext* ctx) {
  return ctx->eigen_device<GPUDevice>().stream();
}

// Device scratch of `bytes` bytes for a launcher, from TensorFlow's
// allocator (freed with `scratch`).
inline absl::Status AllocateScratch(OpKernelContext* ctx, int64_t bytes,
                                    Tensor* scratch) {
  return ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({bytes}),
                            scratch);
}
#endif  // GOOGLE_CUDA

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_
