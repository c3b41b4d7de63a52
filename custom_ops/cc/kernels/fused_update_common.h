// Copyright 2026 The tfgc Authors.
//
// FusedUpdate: the inner optimizer's update of many variables in one op (the
// MSTopK system's parallel tensor operator), for the update rules of Keras's
// SGD (plain, momentum, Nesterov) and Adam / AdamW. This header holds what
// the CPU functor, the CUDA kernel and the CUDA harness share: the rules,
// the layout of their scalars and the arithmetic of one element, written
// once over a float policy F (one IEEE operation per call, rounded to
// nearest, never contracted into a fused multiply-add). No TensorFlow or
// CUDA header (kernel_utils.h says why).
//
// Every element is updated with the float32 operations of Keras's own
// update step, in its order (docs/algorithms.md, "The fused update"), so
// the result is Keras's bit for bit; the scalars are computed in TensorFlow
// as Keras computes them (tfgc/ops/fused_update.py). With weight decay,
// first w = w - (w * weight_decay) * decay_learning_rate, as Keras's
// `_apply_weight_decay` does before the update step.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_COMMON_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_COMMON_H_

#include <cstdint>

#if defined(__CUDACC__) || defined(TFGC_CUDA_EMULATION)
#define TFGC_HOST_DEVICE __host__ __device__
#else
#define TFGC_HOST_DEVICE
#endif

namespace tfgc {
namespace fused_update {

// The update rules, with their scalars (in this order) and slots:
//   kSgd       {learning_rate}                       w -= g * lr
//   kMomentum  {learning_rate, momentum}             m = m * mu - g * lr;
//                                                    w += m
//   kNesterov  {learning_rate, momentum}             m = m * mu - g * lr;
//                                                    w += m * mu - g * lr
//   kAdam      {alpha, one_minus_beta_1,             m += (g - m) * c1;
//               one_minus_beta_2, epsilon}           v += (g * g - v) * c2;
//                                                    w -= m * alpha /
//                                                         (sqrt(v) + eps)
// followed, with weight decay, by {weight_decay, decay_learning_rate}.
enum class Rule : int { kSgd = 0, kMomentum = 1, kNesterov = 2, kAdam = 3 };

constexpr int kMaxScalars = 6;

TFGC_HOST_DEVICE constexpr int RuleScalars(Rule rule) {
  return rule == Rule::kSgd ? 1 : rule == Rule::kAdam ? 4 : 2;
}

TFGC_HOST_DEVICE constexpr int NumScalars(Rule rule, bool weight_decay) {
  return RuleScalars(rule) + (weight_decay ? 2 : 0);
}

// Slots per variable: momentum (all but kSgd), then velocity (kAdam).
TFGC_HOST_DEVICE constexpr int NumSlots(Rule rule) {
  return rule == Rule::kSgd ? 0 : rule == Rule::kAdam ? 2 : 1;
}

// One variable of the update: its buffers (the slots it does not have are
// null) and its number of elements.
template <typename T>
struct Tensor {
  T* variable;
  T* momentum;
  T* velocity;
  const T* gradient;
  int64_t size;
};

// The scalars by value, so that a loop keeps them in registers.
struct Scalars {
  float s[kMaxScalars];
};

// Updates element i of one variable by kRule (weight decay first when
// kDecay). F supplies Mul, Add, Sub, Div and Sqrt of two (one) floats.
template <typename F, Rule kRule, bool kDecay>
TFGC_HOST_DEVICE inline void UpdateElement(const Scalars& c, float* w,
                                           float* m, float* v, const float* g,
                                           int64_t i) {
  constexpr int d = RuleScalars(kRule);
  float wi = w[i];
  if (kDecay) wi = F::Sub(wi, F::Mul(F::Mul(wi, c.s[d]), c.s[d + 1]));
  const float gi = g[i];
  if (kRule == Rule::kSgd) {
    wi = F::Sub(wi, F::Mul(gi, c.s[0]));
  } else if (kRule == Rule::kAdam) {
    const float mi = F::Add(m[i], F::Mul(F::Sub(gi, m[i]), c.s[1]));
    const float vi =
        F::Add(v[i], F::Mul(F::Sub(F::Mul(gi, gi), v[i]), c.s[2]));
    m[i] = mi;
    v[i] = vi;
    wi = F::Sub(wi, F::Div(F::Mul(mi, c.s[0]), F::Add(F::Sqrt(vi), c.s[3])));
  } else {
    const float mi = F::Sub(F::Mul(m[i], c.s[1]), F::Mul(gi, c.s[0]));
    m[i] = mi;
    wi = kRule == Rule::kNesterov
             ? F::Add(wi, F::Sub(F::Mul(mi, c.s[1]), F::Mul(gi, c.s[0])))
             : F::Add(wi, mi);
  }
  w[i] = wi;
}

// Calls fn.template operator()<kRule, kDecay>() for the run-time rule and
// decay, so that each loop is compiled for one rule (host code: the CUDA
// launcher has a switch of its own).
template <typename Fn>
inline void DispatchRule(Rule rule, bool decay, Fn&& fn) {
  switch (rule) {
    case Rule::kSgd:
      return decay ? fn.template operator()<Rule::kSgd, true>()
                   : fn.template operator()<Rule::kSgd, false>();
    case Rule::kMomentum:
      return decay ? fn.template operator()<Rule::kMomentum, true>()
                   : fn.template operator()<Rule::kMomentum, false>();
    case Rule::kNesterov:
      return decay ? fn.template operator()<Rule::kNesterov, true>()
                   : fn.template operator()<Rule::kNesterov, false>();
    case Rule::kAdam:
      return decay ? fn.template operator()<Rule::kAdam, true>()
                   : fn.template operator()<Rule::kAdam, false>();
  }
}

}  // namespace fused_update
}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_FUSED_UPDATE_COMMON_H_
