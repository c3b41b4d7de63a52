// Copyright 2026 The tfgc Authors.
//
// Op registrations of Tfgc>GolombEncode and Tfgc>GolombDecode (SBC position
// coding; bit format in custom_ops/cc/kernels/golomb_common.h).

#include <cstdint>

#include "absl/status/status.h"
#include "custom_ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfgc {

REGISTER_OP("Tfgc>GolombEncode")
    .Input("indices: T")
    .Input("n: int64")
    .Input("b: int32")
    .Output("encoded: uint8")
    .Output("num_bits: int64")
    .Attr("T: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &indices));
      TF_RETURN_IF_ERROR(ScalarInputs(c, 1, 2));
      // The byte count depends on the gaps: known only when k = 0.
      const DimensionHandle k = c->Dim(indices, 0);
      const bool empty = c->ValueKnown(k) && c->Value(k) == 0;
      c->set_output(0, c->Vector(empty ? c->MakeDim(0) : c->UnknownDim()));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Golomb-Rice codes the gaps of sorted, unique positions `indices` in [0, n)
with parameter 2^b (b in [0, 31]): gap_0 = indices[0], gap_j = indices[j] -
indices[j-1] - 1; each gap as (gap >> b) one bits, a zero bit, and the low b
bits of the gap, most significant first; bytes filled MSB first, the last one
zero-padded. `encoded` has exactly ceil(num_bits / 8) bytes.
)doc");

REGISTER_OP("Tfgc>GolombDecode")
    .Input("encoded: uint8")
    .Input("k: Tk")
    .Input("b: int32")
    .Input("n: int64")
    .Output("indices: int32")
    .Attr("Tk: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(ScalarInputs(c, 1, 3));
      DimensionHandle len = c->UnknownDim();
      const Tensor* k = c->input_tensor(1);
      if (k != nullptr) {
        const int64_t kv = IntScalarValue(*k);
        // A negative k is left to the kernel (InvalidArgumentError at run
        // time, in eager and graph mode alike).
        if (kv >= 0) len = c->MakeDim(kv);
      }
      c->set_output(0, c->Vector(len));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Decodes the first k positions of a GolombEncode stream with parameter 2^b.
Trailing bytes are ignored. Positions must stay below n when n >= 0 (n < 0:
no bound but int32); a stream that ends inside a code is an error.
)doc");

}  // namespace tfgc
