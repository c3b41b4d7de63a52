// Copyright 2026 The tfgc Authors.
//
// Op registration of Tfgc>TopKTwoSided.

#include "absl/status/status.h"
#include "custom_ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfgc {

REGISTER_OP("Tfgc>TopKTwoSided")
    .Input("x: T")
    .Input("k: Tk")
    .Output("positive_values: T")
    .Output("positive_indices: int32")
    .Output("negative_values: T")
    .Output("negative_indices: int32")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tk: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      // Each side selects at most k entries, fewer when fewer are on it.
      TF_RETURN_IF_ERROR(ScalarInputs(c, 1, 1));
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The k largest positive entries of the flattened x and its k most negative
ones (SBC's two sides), in one pass. An entry is on the positive side when
its float32 value is a normal positive number or +inf, on the negative side
when it is a normal negative number or -inf, on both when it is NaN; zeros
and float32 subnormals are on neither (as TensorFlow's CPU threads compare,
with denormals flushed). Each side keeps the min(k, entries on it) largest
magnitudes (|x| compared as float32 bits, NaN as +inf; the lower index first
among equal ones), indices increasing. positive_values are x there,
negative_values -x (the magnitudes; a NaN's sign bit flipped).
)doc");

}  // namespace tfgc
