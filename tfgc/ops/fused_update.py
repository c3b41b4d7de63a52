"""One optimizer update of many variables in one op (`Tfgc>FusedUpdate`).

The MSTopK system's parallel tensor operator: instead of a few TensorFlow
ops per variable (Keras's update step issues six to eight element-wise
passes over each variable for Adam), one op updates every variable of a
bucket and its slots in place, in a single pass over their elements, on
the intra-op threads (or in one GPU launch per 48 tensors). Each element
gets the float32 operations of Keras's own update step in Keras's order,
never contracted into a fused multiply-add, so the weights are bit for
bit those of Keras's update (docs/algorithms.md, "The fused update").

There is no pure-TF reference: without the compiled library (or under
XLA) `available()` is False and the caller keeps Keras's own update.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfgc.ops import _library

#: The update rules and the scalars each takes, in order.
RULE_SCALARS = {
    "sgd": ("learning_rate",),
    "momentum": ("learning_rate", "momentum"),
    "nesterov": ("learning_rate", "momentum"),
    "adam": ("alpha", "one_minus_beta_1", "one_minus_beta_2", "epsilon"),
}
#: The slots of each rule, per variable.
RULE_SLOTS = {"sgd": 0, "momentum": 1, "nesterov": 1, "adam": 2}
#: The scalars weight decay adds after the rule's.
DECAY_SCALARS = ("weight_decay", "decay_learning_rate")


def _op():
    """The compiled op, or None (no library, one built without it, or XLA
    compiles the graph being traced)."""
    return getattr(_library.custom_ops(), "tfgc_fused_update", None)


def available() -> bool:
    """Whether the compiled op can run in the graph being traced: the
    library loads and has it, and XLA does not compile the graph."""
    return _op() is not None


def fused_update(
    rule: str,
    variables: Sequence[tf.Variable],
    slots: Sequence[Sequence[tf.Variable]],
    gradients: Sequence[tf.Tensor],
    scalars: Sequence,
    weight_decay: bool = False,
):
    """Updates `variables` and their slots in place with `gradients`.

    Args:
        rule: "sgd", "momentum", "nesterov" or "adam" (`RULE_SCALARS`).
        variables: float32 resource variables (plain `tf.Variable`s, or the
            local ones of a distributed variable in replica context).
        slots: per slot of the rule (`RULE_SLOTS`: momentum, then velocity)
            one variable per entry of `variables`, of its shape.
        gradients: float32 tensors of the variables' shapes.
        scalars: the rule's scalars (`RULE_SCALARS`), then with
            `weight_decay` the decay's (`DECAY_SCALARS`); float32 scalars
            computed as Keras computes them.
        weight_decay: first w -= (w * weight_decay) * decay_learning_rate.

    Returns:
        The op (run in eager mode; in a `tf.function`, ordered by the
        variables it updates, as TensorFlow's own ResourceApply ops).

    Raises:
        ValueError: an unknown rule, or the counts of slots or scalars do
            not fit it (with the numbers); the op itself checks dtypes,
            shapes and initialisation.
        RuntimeError: the compiled op is not available (`available()`).
    """
    if rule not in RULE_SCALARS:
        raise ValueError(
            f"`rule` must be one of {sorted(RULE_SCALARS)}. Received: "
            f"rule={rule!r}"
        )
    want_slots = RULE_SLOTS[rule]
    want_scalars = len(RULE_SCALARS[rule]) + (
        len(DECAY_SCALARS) if weight_decay else 0
    )
    if len(slots) != want_slots or any(len(s) != len(variables) for s in slots):
        raise ValueError(
            f"rule={rule!r} takes {want_slots} slot list(s) of "
            f"{len(variables)} variables. Received: "
            f"{[len(s) for s in slots]}"
        )
    if len(gradients) != len(variables) or len(scalars) != want_scalars:
        raise ValueError(
            f"rule={rule!r} (weight_decay={weight_decay}) takes one gradient "
            f"per variable and {want_scalars} scalars. Received: "
            f"{len(gradients)} gradients for {len(variables)} variables, "
            f"{len(scalars)} scalars"
        )
    op = _op()
    if op is None:
        raise RuntimeError(
            "tfgc: the compiled FusedUpdate op is not available here "
            f"({_library.load_error() or 'disabled, or XLA compiles the graph'}"
            "); check tfgc.ops.fused_update.available() first."
        )
    return op(
        variables=[v.handle for v in variables],
        slots=[s.handle for per_slot in slots for s in per_slot],
        gradients=list(gradients),
        scalars=tf.stack([tf.cast(s, tf.float32) for s in scalars]),
        rule=rule,
        weight_decay=weight_decay,
    )
