// Copyright 2026 The tfgc Authors.
//
// The TensorFlow names every CPU kernel file (*_kernels.cc) uses. Depends on
// TensorFlow: not for the headers that the CUDA sources (*.cu.cc) and
// custom_ops/cuda_harness include.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_

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
  return ctx->eigen_device<Eigen::GpuDevice>().stream();
}
#endif  // GOOGLE_CUDA

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_
