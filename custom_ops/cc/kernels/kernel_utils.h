// Copyright 2026 The tfgc Authors.
//
// The TensorFlow names every CPU kernel file (*_kernels.cc) uses. Depends on
// TensorFlow: not for the headers that the CUDA sources (*.cu.cc) and
// custom_ops/cuda_harness include.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_

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

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_KERNEL_UTILS_H_
