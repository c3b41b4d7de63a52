// Copyright 2026 The tfgc Authors.
//
// Op registration of Tfgc>ScatterAddSum.

#include <cstdint>

#include "absl/status/status.h"
#include "custom_ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfgc {

REGISTER_OP("Tfgc>ScatterAddSum")
    .Input("values: T")
    .Input("indices: int32")
    .Input("n: Tn")
    .Output("sum: T")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("Tn: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values, indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(values, 0), c->Dim(indices, 0), &unused));
      TF_RETURN_IF_ERROR(ScalarInputs(c, 2, 2));
      DimensionHandle len = c->UnknownDim();
      const Tensor* n = c->input_tensor(2);
      // A negative n is left to the kernel (InvalidArgumentError at run
      // time, in eager and graph mode alike).
      if (n != nullptr && IntScalarValue(*n) >= 0) {
        len = c->MakeDim(IntScalarValue(*n));
      }
      c->set_output(0, c->Vector(len));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Dense sum of sparse (index, value) pairs: sum[j] = sum of values[i] over every
i with indices[i] == j, zero where no index points; sum has n elements.
Duplicate indices add up (the pairs all-gathered from several workers). Every
index must be in [0, n). Half and bfloat16 are summed in float32 and rounded
once. The CPU kernel adds each element's values in input order
(deterministic); the CUDA kernel adds with atomics in any order.
)doc");

}  // namespace tfgc
