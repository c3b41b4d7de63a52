// Copyright 2026 The tfgc Authors.
//
// Op registration of Tfgc>FusedUpdate.

#include "absl/status/status.h"
#include "custom_ops/cc/ops/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfgc {

REGISTER_OP("Tfgc>FusedUpdate")
    .Input("variables: N * resource")
    .Input("slots: M * resource")
    .Input("gradients: N * T")
    .Input("scalars: T")
    .Attr("rule: {'sgd', 'momentum', 'nesterov', 'adam'}")
    .Attr("weight_decay: bool = false")
    .Attr("N: int >= 0")
    .Attr("M: int >= 0")
    .Attr("T: {float} = DT_FLOAT")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      // The scalars: the last input.
      return c->WithRank(c->input(c->num_inputs() - 1), 1, &unused);
    })
    .Doc(R"doc(
Updates every variable and its optimizer slots in place with its gradient,
by Keras's update `rule` with the float32 operations of Keras's own update
step in its order, so bit for bit Keras's result:
  sgd       scalars [lr]                 w -= g * lr
  momentum  scalars [lr, mu]             m = m * mu - g * lr; w += m
  nesterov  scalars [lr, mu]             m = m * mu - g * lr;
                                         w += m * mu - g * lr
  adam      scalars [alpha, c1, c2, eps] m += (g - m) * c1;
                                         v += (g * g - v) * c2;
                                         w -= m * alpha / (sqrt(v) + eps)
With `weight_decay`, two more scalars [wd, lr] and first w -= (w * wd) * lr.
`slots` lists every variable's momentum, then (adam) every velocity.
)doc");

}  // namespace tfgc
