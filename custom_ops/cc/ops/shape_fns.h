// Copyright 2026 The tfgc Authors.
//
// Names and helpers the shape functions of the op registrations share.

#ifndef TFGC_CUSTOM_OPS_CC_OPS_SHAPE_FNS_H_
#define TFGC_CUSTOM_OPS_CC_OPS_SHAPE_FNS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tfgc {

using tensorflow::Tensor;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Checks that inputs first, ..., last of the op are scalars.
inline absl::Status ScalarInputs(InferenceContext* c, int first, int last) {
  ShapeHandle unused;
  for (int i = first; i <= last; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  }
  return absl::OkStatus();
}

// The value of an int32 or int64 scalar tensor.
inline int64_t IntScalarValue(const Tensor& t) {
  return t.dtype() == tensorflow::DT_INT32
             ? static_cast<int64_t>(t.scalar<int32_t>()())
             : t.scalar<int64_t>()();
}

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_OPS_SHAPE_FNS_H_
