// Copyright 2026 The tfgc Authors.
//
// The TensorFlow names every kernel file (*_kernels.cc) uses, the devices
// their op kernels and functors are templated on, the checks and error
// messages several ops share, and the glue of the GPU functors. Depends on
// TensorFlow: not for the headers that the CUDA sources (*.cu.cc) and
// custom_ops/cuda_harness include.
//
// How the kernels are laid out. As in TensorFlow's own kernels (topk_op.h,
// topk_op_gpu.h), each op's header <op>_kernels.h declares typed functors,
// functor::X<Device, T>; one OpKernel per op, templated on the device,
// validates the inputs (OP_REQUIRES, with the values in the messages),
// allocates the outputs and calls the functor. <op>_kernels.cc defines the
// CPU specialisations, the op kernels and their registrations.
//
// The GPU side differs in one way. TensorFlow defines functor::X<GPUDevice,
// T> in .cu.cc files that nvcc compiles with TensorFlow's headers. tfgc's
// <op>_kernels.cu.cc include no TensorFlow header, so that the CUDA harness
// builds the very same files with nvcc alone on a GPU machine without
// TensorFlow, or as C++ on its CPU emulation of CUDA, and so that nvcc
// never parses TensorFlow's and Eigen's headers (custom_ops/build.py
// compile-checks them with whatever nvcc is at hand). So the typed device
// code ends in typed launchers, gpu::X<T>(const T*, ...), declared in
// <op>_gpu.h (TensorFlow- and CUDA-free) and explicitly instantiated in
// <op>_kernels.cu.cc for float, __half and __nv_bfloat16, and
// functor::X<GPUDevice, T> is a thin layer in <op>_kernels.cc, under
// GOOGLE_CUDA: it maps Eigen::half and Eigen::bfloat16 to the CUDA types of
// the same bits (CudaType below), takes the stream and the scratch from
// TensorFlow and turns a launcher's cudaError_t into a Status.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_

#include <cstdint>
#include <type_traits>

#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // Eigen::GpuDevice, before anything includes Eigen
#include "unsupported/Eigen/CXX11/Tensor"

// The 16-bit element types of the CUDA launchers, declared as cuda_fp16.h
// declares __half: the glue only passes pointers to them, and their headers
// need CUDA's libcu++, which the CUDA runtime's headers alone lack.
struct __half;
struct __nv_bfloat16;
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

// The devices of the op kernels and of their functors (functor::X<Device,
// ...>), as in TensorFlow's own kernels.
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

#if GOOGLE_CUDA
// The element type of the CUDA launchers for T: Eigen::half and
// Eigen::bfloat16 have the bits of __half and __nv_bfloat16 (IEEE binary16
// and bfloat16 in two bytes, two-byte aligned; cuda_float.h checks the CUDA
// side), so their buffers are passed as such (ToCuda).
template <typename T>
struct CudaType {
  static_assert(std::is_same_v<T, float>,
                "the CUDA kernels take float, half and bfloat16");
  using type = float;
};
template <>
struct CudaType<Eigen::half> {
  using type = __half;
};
template <>
struct CudaType<Eigen::bfloat16> {
  using type = __nv_bfloat16;
};
static_assert(sizeof(Eigen::half) == 2 && alignof(Eigen::half) == 2,
              "Eigen::half must have the layout of __half");
static_assert(sizeof(Eigen::bfloat16) == 2 && alignof(Eigen::bfloat16) == 2,
              "Eigen::bfloat16 must have the layout of __nv_bfloat16");

// A buffer of T (const or not) as the launchers' element type.
template <typename T>
auto* ToCuda(T* p) {
  using Cuda = typename CudaType<std::remove_const_t<T>>::type;
  return reinterpret_cast<
      std::conditional_t<std::is_const_v<T>, const Cuda, Cuda>*>(p);
}

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
