"""The inner optimizer's step through one fused operator per bucket.

When a bucket's sums arrive, its variables are updated at once by
`tfgc.ops.fused_update` (one op for the bucket's variables and slots, one
pass over their elements) while later buckets are still on the wire. The
result is bit for bit Keras's `apply`: clipping per tensor, weight decay,
the update rule with Keras's float operations and scalars, constraints, and
the step counter once after the last bucket (docs/algorithms.md, "The fused
update"). Keras's SGD (with momentum, Nesterov) and Adam/AdamW take it;
everything else keeps Keras's own update (`Fusion.of` says why).
"""

from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf

from tfgc import _keras_compat
from tfgc.ops import fused_update as fused_update_op
from tfgc.optimizers import planning

# Keras's own classes only: a subclass may change the update step.
_RULE_OF_ADAM = {keras.optimizers.Adam, keras.optimizers.AdamW}


class Fusion(NamedTuple):
    """How an inner optimizer's step runs fused.

    Attributes:
        rule: the update rule of `tfgc.ops.fused_update` ("sgd",
            "momentum", "nesterov", "adam"), or None: Keras's own update.
        reason: why not, when `rule` is None.
    """

    rule: str | None
    reason: str = ""

    @classmethod
    def of(cls, optimizer, var_list) -> Fusion:
        """The fusion of a built Keras optimizer over `var_list`."""
        kind = type(optimizer)
        if kind is keras.optimizers.SGD:
            rule = "sgd"
            if optimizer.momentum != 0:
                rule = "nesterov" if optimizer.nesterov else "momentum"
        elif kind in _RULE_OF_ADAM:
            rule = "adam"
            if optimizer.amsgrad:
                return cls(None, "amsgrad")
        else:
            return cls(None, f"{kind.__name__} has no fused rule")
        for option in (
            "global_clipnorm",
            "use_ema",
            "loss_scale_factor",
            "gradient_accumulation_steps",
        ):
            if getattr(optimizer, option, None):
                return cls(None, f"{option} is set")
        for variable in var_list:
            name = getattr(variable, "path", variable.name)
            if planning.overwrites_with_gradient(variable):
                return cls(None, f"{name} overwrites with gradient")
            if variable.dtype != "float32":
                return cls(None, f"{name} is {variable.dtype}")
        return cls(rule)


def usable(fusion: Fusion, grads) -> bool:
    """Whether this step can run fused: a rule, the compiled op in this
    graph (not under XLA), and every gradient present, float32 and dense
    (Keras warns about missing ones and takes IndexedSlices itself)."""
    return (
        fusion.rule is not None
        and fused_update_op.available()
        and all(
            isinstance(g, tf.Tensor) and g.dtype == tf.float32 for g in grads
        )
    )


def covering(buckets, count: int) -> list[list[int]]:
    """`buckets` (None: none) and one more of the indices below `count`
    they leave out, if any."""
    buckets = [list(b) for b in buckets or []]
    seen = {i for b in buckets for i in b}
    rest = [i for i in range(count) if i not in seen]
    return buckets + [rest] if rest else buckets


def apply(optimizer, rule: str, grads, trainable_variables, buckets) -> None:
    """Keras's `optimizer.apply(grads, trainable_variables)` (gradients
    already summed) with one fused update per bucket of indices."""
    # Read once, before the step counts: a schedule reads the step.
    lr = keras.ops.cast(optimizer.learning_rate, "float32")
    scalars = _rule_scalars(optimizer, rule, lr)
    decay = [optimizer.weight_decay, lr]
    slots = fused_update_op.RULE_SLOTS[rule]
    with tf.name_scope(optimizer.name):
        for bucket in buckets:
            variables = [trainable_variables[i] for i in bucket]
            clipped = _keras_compat.clip_gradients(
                optimizer, [grads[i] for i in bucket]
            )
            decays = [
                _keras_compat.decays_weight(optimizer, v) for v in variables
            ]
            # One op for the decayed variables, one for the others.
            for decayed in (True, False):
                part = [j for j, d in enumerate(decays) if d == decayed]
                if not part:
                    continue
                fused_update_op.fused_update(
                    rule,
                    [_local(variables[j]) for j in part],
                    _slots(optimizer, slots, [variables[j] for j in part]),
                    [clipped[j] for j in part],
                    scalars + (decay if decayed else []),
                    weight_decay=decayed,
                )
            for variable in variables:
                if variable.constraint is not None:
                    variable.assign(variable.constraint(variable))
        _keras_compat.count_step(optimizer)


def _local(variable):
    return _keras_compat.local_variable(variable)


def _slots(optimizer, count: int, variables) -> list[list]:
    """Per slot of the rule, the local variable of each of `variables`."""
    per_variable = [
        _keras_compat.update_slots(optimizer, count, v) for v in variables
    ]
    return [[_local(s[k]) for s in per_variable] for k in range(count)]


def _rule_scalars(optimizer, rule: str, lr) -> list:
    """The rule's scalars from the float32 learning rate `lr`, computed
    with the float32 operations of Keras's update step."""
    if rule == "sgd":
        return [lr]
    if rule in ("momentum", "nesterov"):
        return [lr, keras.ops.cast(optimizer.momentum, "float32")]
    local_step = keras.ops.cast(optimizer.iterations + 1, "float32")
    beta_1_power = keras.ops.power(
        keras.ops.cast(optimizer.beta_1, "float32"), local_step
    )
    beta_2_power = keras.ops.power(
        keras.ops.cast(optimizer.beta_2, "float32"), local_step
    )
    alpha = lr * keras.ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    return [
        alpha,
        1 - optimizer.beta_1,
        1 - optimizer.beta_2,
        optimizer.epsilon,
    ]
