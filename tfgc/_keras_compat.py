"""Every use of Keras private API in tfgc, fenced and version-checked.

Four things need it:
1. `CompressedOptimizer` communicates gradients itself, so the inner
   optimizer must not all-reduce them again. Keras 3 sums inside
   `TFOptimizer._all_reduce_sum_gradients` and has no public switch
   (keras-team/keras#19308).
2. `LossScaleOptimizer` (what the `mixed_float16` policy adds) decides
   from each worker's local gradients whether to skip a step; around a
   communicating optimizer every worker must decide the same.
3. `model.fit` under `MultiWorkerMirroredStrategy` is broken upstream
   (keras-team/keras#20585): `TensorFlowTrainer._maybe_symbolic_build`
   reduces the first distributed batch with `strategy.reduce`, and
   `reduce_per_replica` reduces scalar metrics with `axis=0`. The fix below
   replaces both, in multi-worker mode only.
4. The fused update (`tfgc.optimizers.fused_apply`) stands in for the
   inner optimizer's own `apply`: it reads the optimizer's slots, its
   clipping, weight-decay exclusions and step counter as `apply` does.

Outside the tested Keras versions this module refuses to run unless
`TFGC_ALLOW_UNTESTED_KERAS=1` is set, because the hooks may have moved.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings

import keras
import tensorflow as tf
from keras.src.utils import tracking

# Keeps Keras from wrapping build-time Python lists (per-variable plans) in
# tracked containers, as Keras's own optimizers do in `build`.
no_automatic_dependency_tracking = tracking.no_automatic_dependency_tracking

# Keras minor versions whose private hooks were read and tested.
TESTED_KERAS = ((3, 15),)
TESTED_TENSORFLOW = ((2, 21),)
_ALLOW_UNTESTED = "TFGC_ALLOW_UNTESTED_KERAS"
_NO_FIT_PATCH = "TFGC_NO_KERAS_FIT_PATCH"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def check_versions() -> None:
    """Raises if Keras or TensorFlow is outside the tested range."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "tfgc needs the Keras 'tensorflow' backend. Received: "
            f"backend={keras.backend.backend()!r}. "
            "Set KERAS_BACKEND=tensorflow."
        )
    problems = []
    if _minor(keras.version()) not in TESTED_KERAS:
        problems.append(f"keras {keras.version()} (tested: 3.15.x)")
    if _minor(tf.__version__) not in TESTED_TENSORFLOW:
        problems.append(f"tensorflow {tf.__version__} (tested: 2.21.x)")
    if not problems:
        return
    message = (
        "tfgc relies on Keras internals that were tested only with "
        "keras 3.15.x on tensorflow 2.21.x. Found: "
        + "; ".join(problems)
        + ". Install the tested versions (pip install 'tfgc[cpu]'), or set "
        f"{_ALLOW_UNTESTED}=1 to try anyway."
    )
    if os.environ.get(_ALLOW_UNTESTED) == "1":
        warnings.warn(message, stacklevel=2)
        return
    raise RuntimeError(message)


# --- 1. keep the inner optimizer from summing a second time ---------------

_summed = threading.local()


@contextlib.contextmanager
def gradients_already_summed():
    """Within this block (on this thread), optimizers prepared by
    `sum_gradients_unless_summed` take their gradients as already summed.

    Thread-local because MirroredStrategy traces its replicas in threads:
    each replica's wrapper marks only its own call into the inner
    optimizer.
    """
    previous = getattr(_summed, "active", False)
    _summed.active = True
    try:
        yield
    finally:
        _summed.active = previous


def sum_gradients_unless_summed(optimizer: keras.optimizers.Optimizer) -> None:
    """Makes `optimizer` skip its all-reduce inside
    `gradients_already_summed()`, and only there.

    Used on its own (outside a wrapper's call) the optimizer still sums
    its gradients across replicas as Keras does. Idempotent.
    """
    original = getattr(optimizer, "_all_reduce_sum_gradients", None)
    if not callable(original):
        raise RuntimeError(
            f"{type(optimizer).__name__} has no `_all_reduce_sum_gradients`; "
            f"keras {keras.version()} is not supported by tfgc."
        )
    if getattr(original, "_tfgc_skips_when_summed", False):
        return

    def all_reduce_sum_gradients(grads_and_vars):
        if getattr(_summed, "active", False):
            return list(grads_and_vars)
        return original(grads_and_vars)

    all_reduce_sum_gradients._tfgc_skips_when_summed = True
    optimizer._all_reduce_sum_gradients = all_reduce_sum_gradients


def step_counter(optimizer: keras.optimizers.Optimizer):
    """The variable that counts `optimizer.apply` calls.

    With `gradient_accumulation_steps`, Keras's public `iterations` is that
    count divided by the steps (a tensor, not the variable).
    """
    return optimizer._iterations


# --- 2. loss scaling: one finite/non-finite decision for all workers --------

_loss_scale_patched = False


def agree_on_finite_gradients() -> None:
    """Makes `LossScaleOptimizer` take the same finite/non-finite decision
    on every worker when it wraps an optimizer that communicates itself.

    Keras decides from this worker's own gradients, before they are
    summed. A wrapped `CompressedOptimizer` communicates inside the
    "finite" branch, so a worker that alone saw an Inf would skip the
    collectives the others enter: a hang. The inner optimizer's
    `agree_finite(finite)` (a collective) makes the decision global.
    Idempotent; other inner optimizers keep Keras's behaviour.
    """
    global _loss_scale_patched
    if _loss_scale_patched:
        return
    cls = keras.optimizers.LossScaleOptimizer
    original = cls.check_finite

    @functools.wraps(original)
    def check_finite(self, grads):
        finite = original(self, grads)
        agree = getattr(self.inner_optimizer, "agree_finite", None)
        return finite if agree is None else agree(finite)

    cls.check_finite = check_finite
    _loss_scale_patched = True


# --- 3. model.fit under MultiWorkerMirroredStrategy -----------------------

_trainer = None  # keras.src.backend.tensorflow.trainer, once patched


def _is_multi_worker(strategy) -> bool:
    return _trainer._collective_all_reduce_multi_worker(strategy)


def _local_value(value):
    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def _symbolic_build_from_local_batch(original):
    @functools.wraps(original)
    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if (
            strategy is None
            or iterator is None
            or not _is_multi_worker(strategy)
        ):
            return original(self, iterator=iterator, data_batch=data_batch)
        # The build needs only shapes and dtypes, which this worker's own
        # share of the batch has; reducing it across workers is what fails.
        for _, _, it in iterator:
            batch = tf.nest.map_structure(_local_value, next(it))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=batch)

    return maybe_symbolic_build


def _reduce_scalars_without_axis(original):
    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if reduction == "auto" and not isinstance(
            strategy, tf.distribute.TPUStrategy
        ):
            reduction = "mean"
        if reduction != "mean" or not _is_multi_worker(strategy):
            return original(values, strategy, reduction)
        # Metrics are scalars; `axis=0` fails on them. A mean over replicas
        # is what "mean" means here.
        return tf.nest.map_structure(
            lambda v: strategy.reduce("MEAN", v, axis=None), values
        )

    return reduce_per_replica


def patch_multi_worker_fit() -> bool:
    """Makes Keras 3 `model.fit` work under MultiWorkerMirroredStrategy.

    Called when tfgc loads (see `tfgc`) and by `CompressedOptimizer`;
    idempotent. Set `TFGC_NO_KERAS_FIT_PATCH=1` to leave Keras untouched.
    Single-worker strategies keep the original code paths.

    Returns:
        True if the fix is in place.
    """
    global _trainer
    if os.environ.get(_NO_FIT_PATCH) == "1":
        return False
    if _trainer is not None:
        return True
    check_versions()
    from keras.src.backend.tensorflow import trainer

    trainer.TensorFlowTrainer._maybe_symbolic_build = (
        _symbolic_build_from_local_batch(
            trainer.TensorFlowTrainer._maybe_symbolic_build
        )
    )
    trainer.reduce_per_replica = _reduce_scalars_without_axis(
        trainer.reduce_per_replica
    )
    _trainer = trainer
    return True


# --- 4. the fused update: what Keras's `apply` reads ------------------------


def update_slots(optimizer, rule_slots: int, variable) -> list:
    """The slot variables of `variable` that Keras's SGD (momentum) and
    Adam update: [momentum] or [momentum, velocity]; none for plain SGD."""
    if rule_slots == 0:
        return []
    index = optimizer._get_variable_index(variable)
    if isinstance(optimizer, keras.optimizers.Adam):
        return [optimizer._momentums[index], optimizer._velocities[index]]
    return [optimizer.momentums[index]]


def clip_gradients(optimizer, grads: list) -> list:
    """The inner optimizer's `clipnorm` / `clipvalue` clipping, per tensor
    as Keras's `apply` clips."""
    return optimizer._clip_gradients(grads)


def decays_weight(optimizer, variable) -> bool:
    """Whether Keras's `_apply_weight_decay` decays `variable`: the
    optimizer has a weight decay and does not exclude the variable (asked
    of the `tf.Variable`, as the TensorFlow backend asks)."""
    if optimizer.weight_decay is None:
        return False
    return bool(optimizer._use_weight_decay(_tf_variable(variable)))


def count_step(optimizer) -> None:
    """One more step on the counter, as the end of Keras's `apply`."""
    step_counter(optimizer).assign_add(1)


def _tf_variable(variable):
    """The `tf.Variable` behind a Keras variable (a `tf.Variable` as is)."""
    if isinstance(variable, keras.Variable):
        return variable.value
    return variable


def local_variable(variable):
    """The `tf.Variable` (Keras's, or a raw one) that this replica updates:
    its own copy of a distributed variable in replica context."""
    value = _tf_variable(variable)
    if isinstance(value, tf.distribute.DistributedValues):
        return value._get_on_device_or_primary()
    return value
