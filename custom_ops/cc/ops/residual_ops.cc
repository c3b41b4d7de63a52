// Copyright 2026 The tfgc Authors.
//
// Op registration of Tfgc>NewResidual.

#include "absl/status/status.h"
#include "custom_ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfgc {

REGISTER_OP("Tfgc>NewResidual")
    .Input("corrected: T")
    .Input("sent: T")
    .Output("residual: T")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &shape));
      c->set_output(0, shape);
      return absl::OkStatus();
    })
    .Doc(R"doc(
What error feedback keeps after a step: residual = corrected - sent, and +0
wherever `sent` (what this worker sent, as a dense tensor) is not finite, so
that inf - inf or NaN - NaN never stays in the residual. One pass over both
inputs; the same bits as TensorFlow's where(is_finite(sent), corrected -
sent, 0), half and bfloat16 subtracted in float32 and rounded once.
)doc");

}  // namespace tfgc
