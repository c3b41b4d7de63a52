"""What `CompressedOptimizer` refuses, with the argument, the value and the
fix: its arguments, combinations that would train wrongly, and gradients
that cannot be exchanged."""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from tfgc import _arguments, _keras_compat
from tfgc.compressors import ErrorFeedback
from tfgc.core.compressor import Compressor

# Arguments of every Keras optimizer, which go on the inner optimizer.
_BASE_ARGS = (
    "learning_rate",
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "ema_momentum",
    "ema_overwrite_frequency",
    "loss_scale_factor",
    "gradient_accumulation_steps",
)
# What a step does when a gradient holds NaN or Inf (docs/algorithms.md,
# "Non-finite gradients").
NON_FINITE_POLICIES = ("propagate", "skip", "raise")


def check_keywords(kwargs: dict, init) -> None:
    """Refuses keywords `init` does not take, naming the closest one, or
    the inner optimizer where they belong there."""
    if not kwargs:
        return
    misplaced = sorted(set(kwargs) & set(_BASE_ARGS))
    if misplaced:
        raise ValueError(
            f"CompressedOptimizer does not take {misplaced}. Set them on "
            "the inner optimizer instead."
        )
    raise _arguments.unexpected_keyword(
        "CompressedOptimizer",
        sorted(kwargs)[0],
        _arguments.keyword_names(init),
    )


def check_inner_optimizer(inner, wrapper_type: type) -> None:
    """Refuses what cannot be wrapped: not an optimizer, a wrapper already,
    or a LossScaleOptimizer (which must wrap tfgc instead)."""
    if not isinstance(inner, keras.optimizers.Optimizer):
        raise TypeError(
            "`inner_optimizer` must be a keras.optimizers.Optimizer "
            f"instance. Received: inner_optimizer={inner!r}"
        )
    if isinstance(inner, wrapper_type):
        raise ValueError(
            "`inner_optimizer` is already a CompressedOptimizer; wrap the "
            "plain optimizer once."
        )
    if isinstance(inner, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "Wrap the other way round: keras.optimizers."
            "LossScaleOptimizer(tfgc.CompressedOptimizer(optimizer, "
            "...)), or compile with the 'mixed_float16' dtype policy, "
            "which adds the LossScaleOptimizer itself. Inside tfgc it "
            "would decide per worker whether to skip a step and sum the "
            "gradients a second time. Received inner_optimizer="
            f"LossScaleOptimizer({type(inner.inner_optimizer).__name__})"
        )


def check_values(
    error_feedback, min_compress_size, seed, non_finite, bucket_bytes, fused
) -> tuple[bool, int, int, int | None, bool]:
    """The optimizer's plain arguments, checked: (error_feedback,
    min_compress_size, seed, bucket_bytes, fused_update)."""
    if non_finite not in NON_FINITE_POLICIES:
        raise ValueError(
            f"`non_finite` must be one of {list(NON_FINITE_POLICIES)}. "
            f"Received: non_finite={non_finite!r}"
        )
    return (
        _arguments.check_bool("error_feedback", error_feedback),
        _arguments.check_int("min_compress_size", min_compress_size, minimum=0),
        _arguments.check_int("seed", seed),
        None
        if bucket_bytes is None
        else _arguments.check_int("bucket_bytes", bucket_bytes, minimum=1),
        _arguments.check_bool("fused_update", fused),
    )


def check_combination(
    compressor: Compressor, communicator, error_feedback: bool, inner
) -> None:
    """Refuses a compressor whose payload the communicator cannot carry,
    error feedback turned off where it is part of the algorithm, momentum
    applied twice, and communication delay with gradient accumulation;
    warns of gradient clipping applied twice."""
    name = type(compressor).__name__
    spec = compressor.spec
    for collective in spec.collectives:
        if not communicator.supports(collective):
            raise ValueError(
                f"{name} sends a payload that needs {collective!r}, which "
                f"communicator {communicator.name!r} cannot carry. Use "
                "communicator='auto' or 'allgather'."
            )
    if spec.has_error_feedback and not error_feedback:
        raise ValueError(
            f"{name} keeps its own residual (error feedback is part of the "
            "algorithm); error_feedback=False cannot turn it off. Drop the "
            "argument or use another compressor."
        )
    _check_momentum_applied_once(compressor, inner)
    _warn_if_clipped_twice(compressor, inner)
    if spec.compresses_updates and inner.gradient_accumulation_steps:
        raise ValueError(
            f"{name} already communicates once per {spec.delay} local "
            "steps; combined with the inner optimizer's "
            "gradient_accumulation_steps="
            f"{inner.gradient_accumulation_steps} the rounds would cut "
            "through accumulations. Drop gradient_accumulation_steps and "
            "raise the compressor's `delay` instead."
        )


def _check_momentum_applied_once(compressor: Compressor, inner) -> None:
    momentum = compressor.spec.local_momentum
    if not momentum:
        return
    plain_sgd = (
        type(inner) is keras.optimizers.SGD
        and not inner.momentum
        and not inner.nesterov
    )
    if plain_sgd:
        return
    name = type(compressor).__name__
    raise ValueError(
        f"{name} applies momentum {momentum} itself (momentum correction), "
        "so the inner optimizer must apply the summed update as it is: use "
        f"keras.optimizers.SGD(learning_rate) with {name}(momentum="
        f"{momentum}), or {name}(momentum=0) to keep "
        f"{type(inner).__name__}. Received inner_optimizer="
        f"{type(inner).__name__}"
        + (f"(momentum={inner.momentum})" if hasattr(inner, "momentum") else "")
    )


def _warn_if_clipped_twice(compressor: Compressor, inner) -> None:
    """Warns when the compressor clips each worker's gradient itself
    (RedSync's `clipnorm`) and the inner optimizer clips the summed one
    again."""
    local = compressor.spec.local_clipnorm
    if local is None:
        return
    clipping = [
        f"{option}={getattr(inner, option)}"
        for option in ("global_clipnorm", "clipnorm")
        if getattr(inner, option, None)
    ]
    if not clipping:
        return
    name = type(compressor).__name__
    warnings.warn(
        f"{name}(clipnorm={local}) clips each worker's gradient before it "
        f"accumulates, and the inner optimizer {type(inner).__name__}("
        f"{', '.join(clipping)}) clips the summed update again, so the "
        f"gradient is clipped twice. {name}'s clipnorm replaces the inner "
        f"optimizer's clipping: drop {' and '.join(clipping)} from the "
        f"inner optimizer, or pass {name}(clipnorm=None) to keep it.",
        UserWarning,
        stacklevel=4,
    )


def check_step_counter(inner, topology) -> None:
    """Refuses an inner optimizer whose step counter is one plain variable
    shared by several local replicas.

    An optimizer created outside `strategy.scope()` has such a counter:
    every replica increments it, so it counts replicas x steps (Keras
    itself does not notice: learning-rate schedules then run that much too
    fast), and the compressor's choices that follow the step (warm-up,
    phases, rounds, shared seeds) would go wrong or differ between
    replicas.
    """
    replicas = len(topology.devices)
    counter = _keras_compat.step_counter(inner)
    if replicas < 2 or isinstance(
        counter.value, tf.distribute.DistributedValues
    ):
        return
    raise ValueError(
        f"The inner optimizer {type(inner).__name__} was created outside "
        "`strategy.scope()`: its step counter is one variable that each of "
        f"the {replicas} local replicas increments, so it would count "
        f"{replicas} per step. Create it inside the scope: `with "
        "strategy.scope(): optimizer = tfgc.CompressedOptimizer("
        "keras.optimizers.SGD(...), ...)`."
    )


def check_replica_context(replica_context) -> None:
    if replica_context is None:
        raise ValueError(
            "CompressedOptimizer.apply() must be called in a replica "
            "context: inside `strategy.run(...)`, as `model.fit` does."
        )


def check_may_build_here(replica_context) -> None:
    """Refuses to build in the first distributed step: building creates
    variables and may measure the network, which needs the strategy's
    cross-replica context."""
    if (
        tf.distribute.has_strategy()
        and replica_context.num_replicas_in_sync > 1
    ):
        raise ValueError(
            "Build the optimizer before the first distributed step: call "
            "`optimizer.build(model.trainable_variables)` inside "
            "`strategy.scope()` (model.fit does this itself)."
        )


def check_built(built: bool) -> None:
    if not built:
        raise ValueError(
            "Pass `trainable_variables` on the first call to apply(), or "
            "call `optimizer.build(variables)` first."
        )


def check_lengths(grads, trainable_variables) -> None:
    if len(grads) != len(trainable_variables):
        raise ValueError(
            f"Got {len(grads)} gradients for {len(trainable_variables)} "
            "variables; pass one gradient (or None) per variable."
        )


def describe(variable) -> str:
    """The variable's path (Keras) or name (a raw tf.Variable)."""
    return getattr(variable, "path", None) or variable.name


def check_gradient(grad, variable):
    """A gradient ready to exchange: dense, of static shape, floating point
    and of the variable's shape (None stays None)."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        # Embedding gradients arrive sparse; sparse-aware compression of
        # them is future work, so they travel as dense tensors.
        grad = tf.convert_to_tensor(grad)
    if not grad.shape.is_fully_defined():
        # Densified IndexedSlices lose their static shape inside
        # LossScaleOptimizer's tf.cond; compressors plan from it.
        grad = tf.ensure_shape(grad, variable.shape)
    if not grad.dtype.is_floating:
        raise TypeError(
            "Gradients must be floating point. Received a gradient of dtype "
            f"{grad.dtype.name} for variable {describe(variable)!r}; make the "
            "variable non-trainable or cast its gradient."
        )
    if grad.shape.is_fully_defined() and tuple(grad.shape) != tuple(
        variable.shape
    ):
        raise ValueError(
            f"Gradient shape {tuple(grad.shape)} does not match variable "
            f"{describe(variable)!r} of shape {tuple(variable.shape)}."
        )
    return grad


def check_bare_compressor(compressor) -> None:
    """Refuses an `ErrorFeedback` wrapper: the optimizer adds it."""
    if isinstance(compressor, ErrorFeedback):
        raise ValueError(
            "Pass the bare compressor and `error_feedback=True` instead of "
            f"an ErrorFeedback wrapper. Received: {compressor!r}"
        )
