// Copyright 2026 The tfgc Authors.
//
// Op registrations of Tfgc>TopKSample, Tfgc>TopKSampleWithResidual and
// Tfgc>TopKRatioWithResidual, and of the first two's segmented
// (multi-tensor) twins Tfgc>TopKSampleSegments and
// Tfgc>TopKSampleSegmentsWithResidual.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "custom_ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfgc {
namespace {

// Output length k when k is known and in [0, n], unknown otherwise; the
// selection reads `shape`'s elements.
absl::Status ExactLength(InferenceContext* c, int k_input, ShapeHandle shape,
                         DimensionHandle* out) {
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(k_input), 0, &unused));
  const Tensor* k = c->input_tensor(k_input);
  if (k == nullptr) return absl::OkStatus();
  const int64_t kv = IntScalarValue(*k);
  const DimensionHandle num = c->NumElements(shape);
  const int64_t n = c->ValueKnown(num) ? c->Value(num) : -1;
  if (kv >= 0 && (n < 0 || kv <= n)) *out = c->MakeDim(kv);
  return absl::OkStatus();
}

// Output length: k for the exact-k modes when k is known, unknown otherwise.
absl::Status SelectionLength(InferenceContext* c, int k_input,
                             DimensionHandle* out) {
  TF_RETURN_IF_ERROR(ScalarInputs(c, k_input, k_input + 1));
  std::string mode;
  TF_RETURN_IF_ERROR(c->GetAttr("mode", &mode));
  *out = c->UnknownDim();
  if (mode == "threshold") return absl::OkStatus();
  // An out-of-range k is left to the kernel, which raises
  // InvalidArgumentError at run time in eager and graph mode alike.
  return ExactLength(c, k_input, c->input(0), out);
}

// The segmented ops' outputs: values and indices of length sum(k) when k
// is known and every k[i] is in [0, n_i] in the exact-k modes, unknown
// otherwise; sizes [S]. k and seeds are vectors of length S, the number of
// `segment_sizes`. Values out of range are left to the kernel, as above.
absl::Status SegmentsShapes(InferenceContext* c, int k_input) {
  std::vector<int64_t> sizes;
  TF_RETURN_IF_ERROR(c->GetAttr("segment_sizes", &sizes));
  std::string mode;
  TF_RETURN_IF_ERROR(c->GetAttr("mode", &mode));
  const auto count = static_cast<int64_t>(sizes.size());
  for (int i = k_input; i <= k_input + 1; ++i) {
    ShapeHandle vec;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vec));
    DimensionHandle unused;
    TF_RETURN_IF_ERROR(c->Merge(c->Dim(vec, 0), c->MakeDim(count), &unused));
  }
  DimensionHandle len = c->UnknownDim();
  const Tensor* k = c->input_tensor(k_input);
  if (k != nullptr && mode != "threshold") {
    int64_t total = 0;
    bool valid = true;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t ki = k->dtype() == tensorflow::DT_INT32
                             ? int64_t{k->vec<int32_t>()(i)}
                             : k->vec<int64_t>()(i);
      valid = valid && ki >= 0 && ki <= sizes[i];
      total += valid ? ki : 0;
    }
    if (valid) len = c->MakeDim(total);
  }
  c->set_output(0, c->Vector(len));
  c->set_output(1, c->Vector(len));
  c->set_output(2, c->Vector(count));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>TopKSample")
    .Input("x: T")
    .Input("k: Tk")
    .Input("seed: int64")
    .Output("values: T")
    .Output("indices: int32")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tk: {int32, int64} = DT_INT32")
    .Attr("mode: {'mstopk', 'threshold', 'trimmed'} = 'mstopk'")
    .Attr("rounds: int >= 1 = 20")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle len;
      TF_RETURN_IF_ERROR(SelectionLength(c, 1, &len));
      c->set_output(0, c->Vector(len));
      c->set_output(1, c->Vector(len));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Selects about k elements of the flattened `x` by magnitude without sorting.

mode=mstopk: exactly k (MSTopK band fill, random slice chosen by `seed`);
mode=threshold: RedSync threshold search, k < size < 2k when such a
threshold exists; mode=trimmed: exact top-k, lower index first among ties.
Indices are increasing; NaN and +-Inf have the highest magnitude.
)doc");

REGISTER_OP("Tfgc>TopKSampleWithResidual")
    .Input("gradient: T")
    .Input("residual: T")
    .Input("k: Tk")
    .Input("seed: int64")
    .Output("values: T")
    .Output("indices: int32")
    .Output("new_residual: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tk: {int32, int64} = DT_INT32")
    .Attr("mode: {'mstopk', 'threshold', 'trimmed'} = 'mstopk'")
    .Attr("rounds: int >= 1 = 20")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle merged;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &merged));
      DimensionHandle len;
      TF_RETURN_IF_ERROR(SelectionLength(c, 2, &len));
      c->set_output(0, c->Vector(len));
      c->set_output(1, c->Vector(len));
      c->set_output(2, merged);
      return absl::OkStatus();
    })
    .Doc(R"doc(
TopKSample of acc = gradient + residual, fused with error feedback:
new_residual is acc with the selected entries set to zero.
)doc");

REGISTER_OP("Tfgc>TopKRatioWithResidual")
    .Input("gradient: T")
    .Input("residual: T")
    .Input("weights: T")
    .Input("floor: float")
    .Input("k: Tk")
    .Output("values: T")
    .Output("indices: int32")
    .Output("new_residual: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tk: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle merged;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &merged));
      TF_RETURN_IF_ERROR(c->Merge(merged, c->input(2), &merged));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &unused));
      DimensionHandle len = c->UnknownDim();
      TF_RETURN_IF_ERROR(ExactLength(c, 4, merged, &len));
      c->set_output(0, c->Vector(len));
      c->set_output(1, c->Vector(len));
      c->set_output(2, merged);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Exact top-k of acc = gradient + residual ranked by importance, fused with
error feedback: the k largest key(acc / (|weights| + floor)) (the score in
float32, subnormals flushed; NaN and +-Inf scores highest; the lower index
first among equal keys). values are acc at the selected indices (not the
scores), indices increasing; new_residual is acc with them set to zero.
)doc");

REGISTER_OP("Tfgc>TopKSampleSegments")
    .Input("x: T")
    .Input("k: Tk")
    .Input("seeds: int64")
    .Output("values: T")
    .Output("indices: int32")
    .Output("sizes: int64")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tk: {int32, int64} = DT_INT32")
    .Attr("segment_sizes: list(int)")
    .Attr("mode: {'mstopk', 'threshold', 'trimmed'} = 'mstopk'")
    .Attr("rounds: int >= 1 = 20")
    .SetShapeFn([](InferenceContext* c) { return SegmentsShapes(c, 1); })
    .Doc(R"doc(
TopKSample of every segment of the flattened `x` in one op.

Segment i is the next segment_sizes[i] elements of `x` (they must add up to
x's size); it selects as TopKSample with k[i] and seeds[i] would on that
segment alone, bit for bit. values and indices hold the selections one
after another in segment order, sizes[i] entries for segment i (k[i] in
the exact-k modes); indices count from the segment's own start.
)doc");

REGISTER_OP("Tfgc>TopKSampleSegmentsWithResidual")
    .Input("gradient: T")
    .Input("residual: T")
    .Input("k: Tk")
    .Input("seeds: int64")
    .Output("values: T")
    .Output("indices: int32")
    .Output("sizes: int64")
    .Output("new_residual: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tk: {int32, int64} = DT_INT32")
    .Attr("segment_sizes: list(int)")
    .Attr("mode: {'mstopk', 'threshold', 'trimmed'} = 'mstopk'")
    .Attr("rounds: int >= 1 = 20")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle merged;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &merged));
      TF_RETURN_IF_ERROR(SegmentsShapes(c, 2));
      c->set_output(3, merged);
      return absl::OkStatus();
    })
    .Doc(R"doc(
TopKSampleSegments of acc = gradient + residual, fused with error feedback:
new_residual is acc with every segment's selected entries set to zero.
)doc");

}  // namespace tfgc
