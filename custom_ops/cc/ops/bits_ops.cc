// Copyright 2026 The tfgc Authors.
//
// Op registrations of Tfgc>PackBits, Tfgc>UnpackBits, Tfgc>UnpackBitsSum and
// Tfgc>UnpackBitsVote.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfgc {
namespace {

int64_t Words(int64_t n) { return (n + 31) / 32; }

// Checks that `dim` (if known) is ceil(n / 32).
absl::Status CheckWords(InferenceContext* c, DimensionHandle dim, int64_t n) {
  if (c->ValueKnown(dim) && c->Value(dim) != Words(n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`words` must have ceil(n / 32) = ", Words(n),
        " entries in its last axis for n=", n,
        ". Received: ", c->Value(dim)));
  }
  return absl::OkStatus();
}

// words [p, w] (and scales [p] from input 1 when `with_scales`) -> [n].
absl::Status ReduceShape(InferenceContext* c, bool with_scales) {
  ShapeHandle words;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &words));
  int64_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("n", &n));
  TF_RETURN_IF_ERROR(CheckWords(c, c->Dim(words, 1), n));
  if (with_scales) {
    ShapeHandle scales;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &scales));
    DimensionHandle p;
    TF_RETURN_IF_ERROR(c->Merge(c->Dim(words, 0), c->Dim(scales, 0), &p));
  }
  c->set_output(0, c->Vector(n));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfgc>PackBits")
    .Input("mask: bool")
    .Output("words: int32")
    .SetShapeFn([](InferenceContext* c) {
      const DimensionHandle n = c->NumElements(c->input(0));
      c->set_output(0, c->Vector(c->ValueKnown(n) ? c->MakeDim(Words(
                                                        c->Value(n)))
                                                  : c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Packs the flattened boolean `mask` into int32 words: element 32 j + i is bit i
(least significant first) of word j; the last word is zero-padded.
)doc");

REGISTER_OP("Tfgc>UnpackBits")
    .Input("words: int32")
    .Output("mask: bool")
    .Attr("n: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle words;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &words));
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("n", &n));
      TF_RETURN_IF_ERROR(CheckWords(c, c->Dim(words, -1), n));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(
          c->ReplaceDim(words, -1, c->MakeDim(n), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("Inverse of PackBits over the last axis: [..., ceil(n/32)] -> "
         "[..., n].");

REGISTER_OP("Tfgc>UnpackBitsSum")
    .Input("words: int32")
    .Input("scales: T")
    .Output("sum: T")
    .Attr("n: int >= 0")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) { return ReduceShape(c, true); })
    .Doc(R"doc(
sum[e] = sum over rows i of scales[i] * (+1 if bit e of row i is set else -1),
accumulated in float32.
)doc");

REGISTER_OP("Tfgc>UnpackBitsVote")
    .Input("words: int32")
    .Output("vote: T")
    .Attr("n: int >= 0")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) { return ReduceShape(c, false); })
    .Doc(R"doc(
Majority vote over rows: +1 where at least half of the rows have bit e set
(ties give +1), -1 elsewhere.
)doc");

}  // namespace tfgc
