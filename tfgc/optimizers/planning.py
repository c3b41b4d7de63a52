"""How each variable's gradient travels, decided once when the optimizer is
built, identically on every worker: its compressors, the variables that
hold their state, and the seeds they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgc import compressors as compressors_lib
from tfgc.communicators import probe
from tfgc.core.compressor import Compressor, Network
from tfgc.core.wire import num_elements
from tfgc.optimizers.checks import describe

#: The step of the keys that initial states are drawn with, distinct from
#: every real step.
INIT_STEP = -1


class Plan(NamedTuple):
    """How one trainable variable's gradient travels.

    Attributes:
        phases: the compressors used in turn after the warm-up.
        warmup: the compressor of the warm-up steps (same state).
        state_structure: the compressor's initial state NamedTuple, the
            template its variables are packed into.
        state_variables: the state's leaves, one optimizer variable each.
        seed: the variable's seed of the keys all workers share.
        round_start: the weights when the communication round started
            (compressors that compress weight updates, SBC); else None.
        accumulator: the sum of this worker's gradients since the last
            exchange, when the inner optimizer accumulates gradients; else
            None.
        bucket: the exchange bucket the planner put the variable in
            (`tfgc.compressors.Auto`); None: the exchange cuts buckets
            itself.
        options: with re-planning, per candidate its phases (`Slot`s over
            one shared state), of which the bucket's `selector` picks one
            each step; else None.
        selector: with re-planning, the int32 variable [buckets] holding
            each bucket's candidate; else None.
    """

    phases: tuple[Compressor, ...]
    warmup: Compressor
    state_structure: object
    state_variables: list
    seed: int
    round_start: object = None
    accumulator: object = None
    bucket: int | None = None
    options: tuple | None = None
    selector: object = None

    @property
    def compressor(self) -> Compressor:
        """The compressor after the warm-up (its first phase)."""
        return self.phases[0]

    def state(self):
        """The compressor state, read from its variables."""
        return tf.nest.pack_sequence_as(
            self.state_structure, [v.value for v in self.state_variables]
        )

    def assign_state(self, state) -> None:
        for variable, value in zip(
            self.state_variables, tf.nest.flatten(state)
        ):
            variable.assign(value)


class Settings(NamedTuple):
    """The optimizer's arguments that planning reads."""

    compressor: Compressor
    communicator: object
    error_feedback: bool
    min_compress_size: int
    seed: int
    accumulation_steps: int

    @classmethod
    def of(cls, optimizer) -> Settings:
        """A `CompressedOptimizer`'s settings, at its build."""
        return cls(
            optimizer.compressor,
            optimizer.communicator,
            optimizer.error_feedback,
            optimizer.min_compress_size,
            optimizer.seed,
            optimizer._accumulation_steps,
        )


class Assignment(NamedTuple):
    """What the planner decided for one variable (`make_plans`).

    Attributes:
        compressor: its codec, in place of the optimizer's; None: the
            optimizer's.
        bucket: its exchange bucket; None: the exchange cuts them.
        options: with re-planning, per candidate its phases (see `Plan`).
        selector: with re-planning, the buckets' candidate variable.
        choice: with re-planning, the candidate chosen at build.
    """

    compressor: Compressor | None = None
    bucket: int | None = None
    options: tuple | None = None
    selector: object = None
    choice: int = 0


def key(seed: int, step) -> tf.Tensor:
    """The stateless key of a variable's compressor at `step`, the same on
    every worker."""
    return tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])


def overwrites_with_gradient(variable) -> bool:
    """Keras float8 scales and histories take their gradient as their new
    value; they are neither compressed nor summed (as in Keras)."""
    return bool(getattr(variable, "overwrite_with_gradient", False))


def without_overwritten(grads, trainable_variables) -> list:
    """`grads` with None for the variables that are overwritten."""
    return [
        None if overwrites_with_gradient(v) else g
        for g, v in zip(grads, trainable_variables)
    ]


def with_overwritten(summed, grads, trainable_variables) -> list:
    """`summed`, with the local gradients of the overwritten variables."""
    return [
        g if overwrites_with_gradient(v) else s
        for s, g, v in zip(summed, grads, trainable_variables)
    ]


def dense_bytes(var_list) -> int:
    """What a dense all-reduce of the exchanged gradients carries."""
    return sum(
        num_elements(tuple(v.shape)) * tf.as_dtype(v.dtype).size
        for v in var_list
        if not overwrites_with_gradient(v)
    )


def network(compressor: Compressor, communicator) -> Network:
    """What compressors may know of the network; probed if they ask."""
    peers = communicator.num_peers
    if not compressor.spec.wants_cost_probe or peers < 2:
        return Network(peers, None)
    if (
        not tf.executing_eagerly()
        or not tf.distribute.in_cross_replica_context()
    ):
        raise ValueError(
            f"{type(compressor).__name__}(cost_model='probe') measures the "
            "network when the optimizer is built, which must happen outside "
            "tf.function: call `optimizer.build(model.trainable_variables)` "
            "inside `strategy.scope()` before training (model.fit does), or "
            "give the costs: cost_model=tfgc.compressors.CostModel("
            "latency=..., bandwidth=...)."
        )
    return Network(peers, probe.measure(options=communicator.options))


def compressors_for(
    settings: Settings, variable, part, net: Network
) -> tuple[tuple[Compressor, ...], Compressor]:
    """(phases, warm-up compressor) for one variable's gradient under
    `settings.compressor`."""
    compressor = settings.compressor
    shape, dtype = tuple(variable.shape), variable.dtype
    if (
        overwrites_with_gradient(variable)
        or num_elements(shape) < settings.min_compress_size
        or settings.communicator.sends_dense(shape)
        or not compressor.should_compress(part, dtype, net)
    ):
        dense = compressor.dense_compressor() or compressors_lib.Identity()
        return (dense,), dense
    if (
        settings.error_feedback
        and not compressor.spec.has_error_feedback
        and not isinstance(compressor, compressors_lib.Identity)
    ):
        compressor = compressors_lib.ErrorFeedback(compressor)
    warmup = compressor.warmup_compressor() or compressors_lib.DenseWarmup(
        compressor
    )
    return compressor.phases(), warmup


def make_plans(
    settings: Settings,
    var_list,
    net: Network,
    add_variable: Callable,
    assignments: list[Assignment] | None = None,
) -> list[Plan]:
    """A `Plan` per variable, its state in variables from `add_variable`
    (the optimizer's), each replica keeping its own value; `assignments`:
    the planner's, per variable (None: the optimizer's compressor in the
    exchange's own buckets)."""
    assignments = assignments or [Assignment()] * len(var_list)
    return [
        _plan(settings, index, variable, net, add_variable, assignments[index])
        for index, variable in enumerate(var_list)
    ]


def _plan(
    settings: Settings,
    index: int,
    variable,
    net,
    add_variable,
    assignment: Assignment,
):
    shape = tuple(variable.shape)
    part = settings.communicator.compressed_shape(shape)
    if assignment.options is not None:
        phases = assignment.options[assignment.choice]
        warmup = phases[0]
    else:
        if assignment.compressor is not None:
            settings = settings._replace(compressor=assignment.compressor)
        phases, warmup = compressors_for(settings, variable, part, net)
    seed = settings.seed * 1_000_003 + index
    initial = phases[0].init_state(part, variable.dtype, key(seed, INIT_STEP))
    path = _variable_name(variable, index)

    def own(name, shape=shape, dtype=variable.dtype, **kwargs):
        # "none": each worker keeps its own value (e.g. residuals), and
        # writing it adds no hidden collective.
        return add_variable(
            shape=shape,
            dtype=dtype,
            aggregation="none",
            name=f"{path}_{name}",
            **kwargs,
        )

    state_variables = [
        own(
            name,
            leaf.shape,
            leaf.dtype,
            initializer=lambda shape, dtype, leaf=leaf: leaf,
        )
        for leaf, name in zip(tf.nest.flatten(initial), _state_names(initial))
    ]
    round_start = accumulator = None
    if settings.compressor.spec.compresses_updates:
        # Set from the weights when each round starts.
        round_start = own("round_start")
    if settings.accumulation_steps and not overwrites_with_gradient(variable):
        # This worker's gradients since the last exchange.
        accumulator = own("accumulated")
    return Plan(
        phases, warmup, initial, state_variables, seed, round_start,
        accumulator, assignment.bucket, assignment.options,
        assignment.selector,
    )  # fmt: skip


def plans_of(
    plans: list[Plan], index_of, items, trainable_variables
) -> tuple[list[int], list[Plan]]:
    """(indices, plans) of the items that are not None; `index_of` gives
    a variable's index in the optimizer's list."""
    present = [i for i, item in enumerate(items) if item is not None]
    return present, [plans[index_of(trainable_variables[i])] for i in present]


def regroup(plans: list[Plan], rows: dict, replicas: int) -> dict:
    """The plans' per-replica state for `replicas` replicas, from the rows
    of a run with another number (`rows`: id of a state variable or
    accumulator -> its saved values, [saved replicas, ...]).

    What sums over workers (`Compressor.worker_sums`: residuals,
    accumulated momenta; and the accumulators) is divided evenly: every
    new replica gets the old sum / `replicas`, so the sum is kept (up to
    one rounding). Every other leaf gets its initial value, which is the
    same on every worker (low-rank factors, step counts).

    Returns:
        id of each variable -> its new rows, [replicas, ...].
    """
    out = {}
    for plan in plans:
        sums = tf.nest.flatten(
            plan.compressor.worker_sums(plan.state_structure)
        )
        initial = tf.nest.flatten(plan.state_structure)
        for variable, is_sum, value in zip(plan.state_variables, sums, initial):
            out[id(variable)] = (
                _even_share(rows[id(variable)], replicas)
                if is_sum
                else np.repeat(np.asarray(value)[None], replicas, axis=0)
            )
        if plan.accumulator is not None:
            out[id(plan.accumulator)] = _even_share(
                rows[id(plan.accumulator)], replicas
            )
    return out


def _even_share(rows: np.ndarray, replicas: int) -> np.ndarray:
    """The sum of `rows` over its first axis, divided evenly among
    `replicas` rows (summed in float64, rounded once)."""
    share = rows.astype(np.float64).sum(axis=0) / replicas
    return np.repeat(share.astype(rows.dtype)[None], replicas, axis=0)


def _state_names(structure, prefix: str = "") -> list[str]:
    """Field paths of a (nested) NamedTuple state, e.g. 'inner_q'; the
    items of a plain tuple by their index ('inners_1_q')."""
    if hasattr(structure, "_fields"):
        names = []
        for field, value in zip(structure._fields, structure):
            names += _state_names(value, f"{prefix}{field}_")
        return names
    if isinstance(structure, tuple):
        names = []
        for i, value in enumerate(structure):
            names += _state_names(value, f"{prefix}{i}_")
        return names
    return [prefix.rstrip("_")]


def _variable_name(variable, index: int) -> str:
    """A name for state variables: the variable's path, or its index."""
    path = describe(variable)
    if not path:
        return f"variable_{index}"
    return path.replace("/", "_").replace(":", "_")
