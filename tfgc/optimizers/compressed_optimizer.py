"""`CompressedOptimizer`: compress -> communicate -> decompress, then apply."""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from tfgc import _arguments, _keras_compat, communicators
from tfgc import compressors as compressors_lib
from tfgc.communicators import probe
from tfgc.communicators import topology as topology_lib
from tfgc.compressors.base import Compressor, Network, num_elements
from tfgc.optimizers import replica_state

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
_INIT_STEP = -1  # key step for initial states, distinct from every real step
# What a step does when a gradient holds NaN or Inf (docs/algorithms.md,
# "Non-finite gradients").
NON_FINITE_POLICIES = ("propagate", "skip", "raise")


class _Plan(NamedTuple):
    """How one trainable variable's gradient travels."""

    phases: tuple  # compressors used in turn after the warm-up
    warmup: Compressor  # stands in during warm-up steps; same state
    state_structure: object  # the compressor's state NamedTuple, as a template
    state_variables: list  # its leaves, one optimizer variable each
    seed: int
    # The weights when the communication round started (compressors that
    # compress weight updates, SBC); else None.
    round_start: object = None
    # The sum of this worker's gradients since the last exchange, when the
    # inner optimizer accumulates gradients; else None.
    accumulator: object = None

    @property
    def compressor(self) -> Compressor:
        """The compressor after the warm-up (its first phase)."""
        return self.phases[0]


def _state_names(structure, prefix=""):
    """Field paths of a (nested) NamedTuple state, e.g. 'inner_q'."""
    if hasattr(structure, "_fields"):
        names = []
        for field, value in zip(structure._fields, structure):
            names += _state_names(value, f"{prefix}{field}_")
        return names
    return [prefix.rstrip("_")]


@keras.saving.register_keras_serializable(package="tfgc")
class CompressedOptimizer(keras.optimizers.Optimizer):
    """Wraps a Keras optimizer so that gradients travel compressed.

    On every `apply` each gradient is compressed (with error feedback if
    asked), exchanged with the other workers through fused collectives of
    the current `tf.distribute` replica context, decompressed into the sum
    over workers, and handed to `inner_optimizer`, which is kept from
    summing a second time (only inside this wrapper's calls). With one
    replica (no strategy) compression still runs, so results match
    multi-worker semantics; communication is skipped.

    Clipping and weight decay configured on the inner optimizer act on the
    communicated (summed) gradient. Its `loss_scale_factor` is applied
    through `scale_loss`, which delegates. With its
    `gradient_accumulation_steps`, each worker accumulates locally and the
    sum is exchanged once per update. Variables that Keras overwrites with
    their gradient (float8 scales) are passed through untouched. For
    `mixed_float16`, wrap the other way round (as `model.compile` does):
    `LossScaleOptimizer(CompressedOptimizer(...))`; `agree_finite` makes
    its skip decision the same on every worker.

    A compressor that applies momentum itself (`RedSync(momentum=0.9)`)
    needs an inner optimizer that applies the summed update as it is:
    `keras.optimizers.SGD(learning_rate)` without momentum; anything else is
    refused, so momentum is never applied twice.

    Args:
        inner_optimizer: the `keras.optimizers.Optimizer` to wrap.
        compressor: a `tfgc.compressors.Compressor`, a name ("topk") or a
            Keras config dict.
        error_feedback: keep what was not sent and add it to the next step's
            gradient (a per-worker residual per compressed variable).
        communicator: "auto" (all-reduce for linear payloads, all-gather for
            the rest), "allreduce", "allgather", "hierarchical" (HiTopKComm:
            compress only between hosts), or a
            `tfgc.communicators.Communicator`.
        communication_options: `tf.distribute.experimental.
            CommunicationOptions` for every collective, with a communicator
            name.
        min_compress_size: gradients with fewer elements are sent dense
            (summed exactly), as are tensors the compressor declines (e.g.
            1-D tensors for PowerSGD).
        seed: base of the stateless random seeds that all workers share.
        non_finite: what a step does when a gradient holds NaN or Inf on
            any replica. "propagate" (default, as Keras does): the values
            are sent and reach the weights, the same on every worker.
            "skip": every worker skips the step (weights, compressor
            state, residuals and the step counter stay as they were;
            `skipped_steps` counts them). "raise": every worker fails the
            step with an error naming the replicas and variables. Both
            cost one small all-gather per step; under `mixed_float16` the
            `LossScaleOptimizer` already skips such steps everywhere.
        name: the optimizer's name.
    """

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        compressor="identity",
        error_feedback: bool = True,
        communicator="auto",
        communication_options=None,
        min_compress_size: int = 1024,
        seed: int = 0,
        non_finite: str = "propagate",
        name: str | None = None,
        **kwargs,
    ):
        _keras_compat.check_versions()
        if kwargs:
            misplaced = sorted(set(kwargs) & set(_BASE_ARGS))
            if misplaced:
                raise ValueError(
                    f"CompressedOptimizer does not take {misplaced}. Set "
                    "them on the inner optimizer instead."
                )
            raise _arguments.unexpected_keyword(
                "CompressedOptimizer",
                sorted(kwargs)[0],
                _arguments.keyword_names(CompressedOptimizer.__init__),
            )
        if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                "`inner_optimizer` must be a keras.optimizers.Optimizer "
                f"instance. Received: inner_optimizer={inner_optimizer!r}"
            )
        if isinstance(inner_optimizer, CompressedOptimizer):
            raise ValueError(
                "`inner_optimizer` is already a CompressedOptimizer; wrap "
                "the plain optimizer once."
            )
        if isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer):
            raise ValueError(
                "Wrap the other way round: keras.optimizers."
                "LossScaleOptimizer(tfgc.CompressedOptimizer(optimizer, "
                "...)), or compile with the 'mixed_float16' dtype policy, "
                "which adds the LossScaleOptimizer itself. Inside tfgc it "
                "would decide per worker whether to skip a step and sum "
                "the gradients a second time. Received inner_optimizer="
                "LossScaleOptimizer("
                f"{type(inner_optimizer.inner_optimizer).__name__})"
            )
        if isinstance(compressor, compressors_lib.ErrorFeedback):
            raise ValueError(
                "Pass the bare compressor and `error_feedback=True` instead "
                f"of an ErrorFeedback wrapper. Received: {compressor!r}"
            )
        error_feedback = _arguments.check_bool("error_feedback", error_feedback)
        min_compress_size = _arguments.check_int(
            "min_compress_size", min_compress_size, minimum=0
        )
        seed = _arguments.check_int("seed", seed)
        if non_finite not in NON_FINITE_POLICIES:
            raise ValueError(
                f"`non_finite` must be one of {list(NON_FINITE_POLICIES)}. "
                f"Received: non_finite={non_finite!r}"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.non_finite = non_finite
        self.inner_optimizer = inner_optimizer
        self.compressor = compressors_lib.get(compressor)
        self.error_feedback = error_feedback
        self.communicator = communicators.get(
            communicator, options=communication_options
        )
        self.min_compress_size = min_compress_size
        self.seed = seed
        for collective in self.compressor.collectives():
            if not self.communicator.supports(collective):
                raise ValueError(
                    f"{type(self.compressor).__name__} sends a payload that "
                    f"needs {collective!r}, which communicator "
                    f"{self.communicator.name!r} cannot carry. Use "
                    "communicator='auto' or 'allgather'."
                )
        if self.compressor.has_error_feedback and not self.error_feedback:
            raise ValueError(
                f"{type(self.compressor).__name__} keeps its own residual "
                "(error feedback is part of the algorithm); "
                "error_feedback=False cannot turn it off. Drop the argument "
                "or use another compressor."
            )
        _check_momentum_applied_once(self.compressor, inner_optimizer)
        if (
            self.compressor.compresses_updates
            and inner_optimizer.gradient_accumulation_steps
        ):
            raise ValueError(
                f"{type(self.compressor).__name__} already communicates "
                f"once per {self.compressor.delay} local steps; combined "
                "with the inner optimizer's gradient_accumulation_steps="
                f"{inner_optimizer.gradient_accumulation_steps} the rounds "
                "would cut through accumulations. Drop "
                "gradient_accumulation_steps and raise the compressor's "
                "`delay` instead."
            )
        # Last, so that a refused configuration leaves the user's optimizer
        # as it was. Both act only inside this wrapper's calls.
        _keras_compat.sum_gradients_unless_summed(inner_optimizer)
        _keras_compat.agree_on_finite_gradients()
        # Where `import tfgc` came before TensorFlow and this class was
        # imported from its module, nothing has installed the fix yet.
        _keras_compat.patch_multi_worker_fit()

    # --- building ----------------------------------------------------------

    def _compressors_for(
        self, variable, part, network
    ) -> tuple[tuple[Compressor, ...], Compressor]:
        """(phases, warm-up compressor) for one variable's gradient."""
        compressor = self.compressor
        shape, dtype = tuple(variable.shape), variable.dtype
        if (
            _overwrites_with_gradient(variable)
            or num_elements(shape) < self.min_compress_size
            or self.communicator.sends_dense(shape)
            or not compressor.should_compress(part, dtype, network)
        ):
            dense = compressor.dense_compressor()
            return (dense,), dense
        if (
            self.error_feedback
            and not compressor.has_error_feedback
            and not isinstance(compressor, compressors_lib.Identity)
        ):
            compressor = compressors_lib.ErrorFeedback(compressor)
        return compressor.phases(), compressor.warmup_compressor()

    def _network(self) -> Network:
        """What compressors may know of the network; probed if asked."""
        peers = self.communicator.num_peers
        if not self.compressor.wants_cost_probe or peers < 2:
            return Network(peers, None)
        if (
            not tf.executing_eagerly()
            or not tf.distribute.in_cross_replica_context()
        ):
            raise ValueError(
                f"{type(self.compressor).__name__}(cost_model='probe') "
                "measures the network when the optimizer is built, which "
                "must happen outside tf.function: call "
                "`optimizer.build(model.trainable_variables)` inside "
                "`strategy.scope()` before training (model.fit does), or "
                "give the costs: cost_model=tfgc.compressors.CostModel("
                "latency=..., bandwidth=...)."
            )
        return Network(peers, probe.measure(options=self.communicator.options))

    def _key(self, seed: int, step) -> tf.Tensor:
        return tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])

    @_keras_compat.no_automatic_dependency_tracking
    def build(self, var_list):
        topology = topology_lib.current()
        # Saving gathers the per-replica state through it.
        self._strategy = tf.distribute.get_strategy()
        # Checked before anything is created or communicated.
        _check_step_counter(self.inner_optimizer, topology)
        self.inner_optimizer.build(var_list)
        # Read at build, as Keras does: tfgc accumulates in its place.
        self._accumulation_steps = (
            self.inner_optimizer.gradient_accumulation_steps or 0
        )
        self.communicator.build(topology)
        network = self._network()
        self._network_cost = network.cost
        self._plans = []
        for index, variable in enumerate(var_list):
            shape = tuple(variable.shape)
            part = self.communicator.compressed_shape(shape)
            phases, warmup = self._compressors_for(variable, part, network)
            seed = self.seed * 1_000_003 + index
            initial = phases[0].init_state(
                part, variable.dtype, self._key(seed, _INIT_STEP)
            )
            leaves = tf.nest.flatten(initial)
            path = _variable_name(variable, index)
            state_variables = [
                self.add_variable(
                    shape=leaf.shape,
                    dtype=leaf.dtype,
                    initializer=lambda shape, dtype, leaf=leaf: leaf,
                    # Each worker keeps its own state (e.g. residuals);
                    # "none" adds no hidden collective on write.
                    aggregation="none",
                    name=f"{path}_{name}",
                )
                for leaf, name in zip(leaves, _state_names(initial))
            ]
            round_start = None
            if self.compressor.compresses_updates:
                # Set from the weights when each round starts (apply).
                round_start = self.add_variable(
                    shape=shape,
                    dtype=variable.dtype,
                    aggregation="none",
                    name=f"{path}_round_start",
                )
            accumulator = None
            if self._accumulation_steps and not _overwrites_with_gradient(
                variable
            ):
                # This worker's gradients since the last exchange.
                accumulator = self.add_variable(
                    shape=shape,
                    dtype=variable.dtype,
                    aggregation="none",
                    name=f"{path}_accumulated",
                )
            self._plans.append(
                _Plan(
                    phases,
                    warmup,
                    initial,
                    state_variables,
                    seed,
                    round_start,
                    accumulator,
                )
            )

        def counter(name):
            return self.add_variable(
                shape=(), dtype="int64", aggregation="none", name=name
            )

        self._traffic = communicators.Traffic(
            *map(counter, ("sent_bytes", "overhead_bytes", "intra_host_bytes"))
        )
        # Over the whole run: bytes on the wire (sent + overhead), steps.
        self._run_bytes = counter("run_bytes")
        self._run_steps = counter("run_steps")
        self._skipped_steps = counter("skipped_steps")
        self._dense_bytes = sum(
            num_elements(tuple(v.shape)) * tf.as_dtype(v.dtype).size
            for v in var_list
            if not _overwrites_with_gradient(v)
        )
        super().build(var_list)
        # tf.train.Checkpoint saves one replica's value of each variable;
        # this entry adds every replica's (restored after the variables).
        replica_state.track(
            self,
            replica_state.ReplicaValues(
                self._strategy,
                self._per_replica_variables,
                self._load_replica_values,
            ),
        )

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    # --- applying ----------------------------------------------------------

    def apply(self, grads, trainable_variables=None):
        replica_context = tf.distribute.get_replica_context()
        if replica_context is None:
            raise ValueError(
                "CompressedOptimizer.apply() must be called in a replica "
                "context: inside `strategy.run(...)`, as `model.fit` does."
            )
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "Pass `trainable_variables` on the first call to "
                    "apply(), or call `optimizer.build(variables)` first."
                )
            trainable_variables = self._trainable_variables
        grads = list(grads)
        trainable_variables = list(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise ValueError(
                f"Got {len(grads)} gradients for {len(trainable_variables)} "
                "variables; pass one gradient (or None) per variable."
            )
        if not self.built:
            if (
                tf.distribute.has_strategy()
                and replica_context.num_replicas_in_sync > 1
            ):
                raise ValueError(
                    "Build the optimizer before the first distributed step: "
                    "call `optimizer.build(model.trainable_variables)` "
                    "inside `strategy.scope()` (model.fit does this itself)."
                )
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        grads = [
            _check_gradient(g, v) for g, v in zip(grads, trainable_variables)
        ]
        if self.non_finite == "propagate":
            self._apply_checked(grads, trainable_variables)
        else:
            self._apply_if_finite_everywhere(grads, trainable_variables)

    def _apply_checked(self, grads, trainable_variables):
        """Exchanges and applies gradients that passed the checks."""
        if self.compressor.compresses_updates:
            self._apply_local_step_then_round(grads, trainable_variables)
        elif self._accumulation_steps:
            self._apply_accumulated(grads, trainable_variables)
        else:
            exchanged = _without_overwritten(grads, trainable_variables)
            summed, traffic = self._exchange(
                exchanged, trainable_variables, self.iterations
            )
            self._count(traffic)
            self._inner_apply(
                _with_overwritten(summed, grads, trainable_variables),
                trainable_variables,
            )

    def _apply_if_finite_everywhere(self, grads, trainable_variables):
        """Applies the step only if every replica's gradients are finite;
        else skips it on every worker, or fails it on every worker.

        Every replica decides from the same gathered verdicts, so all take
        the same branch: a worker that skipped or failed alone would leave
        the others waiting in their collectives. The choice runs in
        cross-replica context, as in `_apply_accumulated`.
        """
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return self._apply_checked(grads, trainable_variables)
        local = tf.stack(
            [tf.reduce_all(tf.math.is_finite(grads[i])) for i in present]
        )
        verdicts = self.communicator.gather_flags(local)
        finite = tf.reduce_all(verdicts)
        if self.non_finite == "raise":
            names = [_describe(trainable_variables[i]) for i in present]
            failed = tf.debugging.Assert(
                finite, [_non_finite_report(verdicts, names)], summarize=1
            )
            with tf.control_dependencies([failed]):
                grads = [None if g is None else tf.identity(g) for g in grads]
            return self._apply_checked(grads, trainable_variables)

        def cross_replica(strategy, grads, finite):
            # Every replica holds the same verdict.
            finite = strategy.experimental_local_results(finite)[0]

            def apply():
                strategy.extended.call_for_each_replica(
                    self._apply_checked, args=(grads, trainable_variables)
                )
                return tf.constant(True)

            def skip():
                self._skipped_steps.assign_add(1)
                return tf.constant(False)

            tf.cond(finite, apply, skip)

        tf.distribute.get_replica_context().merge_call(
            cross_replica, args=(grads, finite)
        )

    def apply_gradients(self, grads_and_vars):
        grads, trainable_variables = zip(*grads_and_vars)
        self.apply(grads, trainable_variables)
        # The step counter that counts is the inner optimizer's.
        return self.iterations

    def _inner_apply(self, grads, trainable_variables):
        """The inner optimizer's step on gradients that are already summed."""
        with _keras_compat.gradients_already_summed():
            self.inner_optimizer.apply(grads, trainable_variables)

    def scale_loss(self, loss):
        # The inner optimizer divides by its `loss_scale_factor`, so it
        # also scales.
        return self.inner_optimizer.scale_loss(loss)

    def agree_finite(self, finite):
        """True on every worker if `finite` (a scalar bool, this worker's
        verdict on its gradients) is True on all of them.

        `LossScaleOptimizer` calls it so that every worker skips the same
        steps: one that skipped alone would leave the others waiting in
        their collectives.
        """
        return self.communicator.all_true(finite)

    def _plans_of(self, items, trainable_variables):
        """(indices, plans) of the items that are not None."""
        present = [i for i, item in enumerate(items) if item is not None]
        plans = [
            self._plans[self._get_variable_index(trainable_variables[i])]
            for i in present
        ]
        return present, plans

    def _exchange(self, tensors, trainable_variables, step):
        """Compresses, exchanges and decompresses `tensors` (None skipped).

        Returns:
            (totals, traffic): per tensor the sum over workers (None where
            the tensor was None), and the `Traffic` of the step.
        """
        present, plans = self._plans_of(tensors, trainable_variables)
        if not present:
            return list(tensors), _no_traffic()
        states = [
            tf.nest.pack_sequence_as(
                plan.state_structure,
                [v.value for v in plan.state_variables],
            )
            for plan in plans
        ]
        inputs = [tensors[i] for i in present]
        keys = [self._key(plan.seed, step) for plan in plans]
        variables = None
        if any(c.reads_step_info for p in plans for c in p.phases):
            variables = [
                tf.convert_to_tensor(trainable_variables[i]) for i in present
            ]

        def run(compressors):
            return self.communicator.step(
                compressors, inputs, states, keys, variables
            )

        # Warm-up, then the phases in turn: a branch per choice, taken by
        # the step, which every worker shares (so all take the same one).
        warmup_steps = self.compressor.warmup_steps
        num_phases = max(len(plan.phases) for plan in plans)
        branches = [
            functools.partial(run, [p.phases[i % len(p.phases)] for p in plans])
            for i in range(num_phases)
        ]
        step = tf.cast(step, tf.int64)
        if warmup_steps:
            branches.insert(
                0, functools.partial(run, [p.warmup for p in plans])
            )
            index = tf.where(
                step < warmup_steps,
                tf.constant(0, tf.int64),
                1 + (step - warmup_steps) % num_phases,
            )
        else:
            index = step % num_phases
        if len(branches) == 1:
            result = branches[0]()
        else:
            result = tf.switch_case(tf.cast(index, tf.int32), branches)
        totals, new_states, traffic = result
        for plan, state in zip(plans, new_states):
            for variable, value in zip(
                plan.state_variables, tf.nest.flatten(state)
            ):
                variable.assign(value)
        out = list(tensors)
        for i, total in zip(present, totals):
            out[i] = total
        return out, traffic

    def _count(self, traffic):
        for variable, value in zip(self._traffic, traffic):
            variable.assign(value)
        self._run_bytes.assign_add(traffic.sent + traffic.overhead)
        self._run_steps.assign_add(1)

    def _apply_accumulated(self, grads, trainable_variables):
        """Adds the gradients to this worker's accumulators; every
        `gradient_accumulation_steps`-th call exchanges the accumulated sum
        once and applies its mean, as the inner optimizer would.

        The choice runs in cross-replica context (as `LossScaleOptimizer`
        does): the inner optimizer's update may use `merge_call`, which
        refuses to run inside a replica's `tf.cond`.
        """
        steps = self._accumulation_steps
        inner = self.inner_optimizer
        # Counts micro-batches; `inner.iterations` counts updates.
        calls = _keras_compat.step_counter(inner)

        def exchange_and_apply(grads):
            exchanged = _without_overwritten(grads, trainable_variables)
            present, plans = self._plans_of(exchanged, trainable_variables)
            for i, plan in zip(present, plans):
                exchanged[i] = exchanged[i] + plan.accumulator
            # Warm-up, phases and keys count exchanges, not micro-batches.
            exchange_index = tf.cast(calls, tf.int64) // steps
            summed, traffic = self._exchange(
                exchanged, trainable_variables, exchange_index
            )
            self._count(traffic)
            for i, plan in zip(present, plans):
                summed[i] = summed[i] / steps
                plan.accumulator.assign(tf.zeros_like(plan.accumulator))
            summed = _with_overwritten(summed, grads, trainable_variables)
            self._inner_apply(summed, trainable_variables)

        def accumulate(grads):
            exchanged = _without_overwritten(grads, trainable_variables)
            present, plans = self._plans_of(exchanged, trainable_variables)
            for i, plan in zip(present, plans):
                plan.accumulator.assign_add(exchanged[i])
            self._count(_no_traffic())

        def cross_replica(strategy, grads):
            each_replica = strategy.extended.call_for_each_replica

            def update():
                # The inner optimizer takes the accumulated mean as one
                # step; its own accumulation would count it as a
                # micro-batch. Nothing else runs meanwhile: the replicas
                # wait in this merge_call.
                saved = inner.gradient_accumulation_steps
                inner.gradient_accumulation_steps = None
                try:
                    each_replica(exchange_and_apply, args=(grads,))
                finally:
                    inner.gradient_accumulation_steps = saved

            def add():
                each_replica(accumulate, args=(grads,))
                calls.assign_add(1)

            is_update = (calls + 1) % steps == 0
            tf.cond(is_update, update, add)

        tf.distribute.get_replica_context().merge_call(
            cross_replica, args=(grads,)
        )

    def _apply_local_step_then_round(self, grads, trainable_variables):
        """A local step of the inner optimizer; at a round's end, exchange.

        Every worker applies its own gradient (times the number of
        replicas: Keras divides each replica's loss by it) to its own
        weights. After every `delay` steps each worker compresses its
        weight update since the round started, and all continue from the
        round-start weights plus the mean of the updates.
        """
        # Overwritten variables (float8 scales) take no part in rounds.
        present, plans = self._plans_of(
            _without_overwritten(grads, trainable_variables),
            trainable_variables,
        )
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        delay = self.compressor.delay
        step = tf.cast(self.iterations, tf.int64)

        def start_round():
            for i, plan in zip(present, plans):
                plan.round_start.assign(trainable_variables[i])
            return tf.constant(True)

        tf.cond(step % delay == 0, start_round, lambda: tf.constant(False))
        local = [
            None if g is None else g * replicas
            for g in _without_overwritten(grads, trainable_variables)
        ]
        self._inner_apply(
            _with_overwritten(local, grads, trainable_variables),
            trainable_variables,
        )

        def end_round():
            updates = [None] * len(grads)
            for i, plan in zip(present, plans):
                updates[i] = trainable_variables[i] - plan.round_start
            totals, traffic = self._exchange(updates, trainable_variables, step)
            for i, plan in zip(present, plans):
                mean = tf.cast(totals[i], plan.round_start.dtype) / replicas
                trainable_variables[i].assign(plan.round_start + mean)
            return traffic

        traffic = tf.cond((step + 1) % delay == 0, end_round, _no_traffic)
        self._count(traffic)

    # --- reporting ---------------------------------------------------------

    def compression_stats(self) -> dict[str, float]:
        """Bytes this worker sent in the last step, against dense.

        `sent_bytes` is measured from the payloads; `overhead_bytes` is
        what went on the wire beyond them (headers and padding of gathers
        whose payloads differ in size between workers);
        `intra_host_bytes` stayed inside the host (hierarchical
        communicator); `dense_bytes` is what an uncompressed all-reduce
        carries; `compression_ratio` is dense / (sent + overhead). The
        `run_` values count every step since the optimizer was built:
        `run_steps` the steps, `run_mean_bytes` (sent + overhead) per step
        and `run_compression_ratio` dense / that (with SBC's communication
        delay, most steps send nothing). All are before the collective's
        own transport factor. Call outside `tf.function`.
        """
        if not self.built:
            return {}
        traffic = [int(v.numpy()) for v in self._traffic]
        sent, overhead, intra_host = traffic
        steps = int(self._run_steps.numpy())
        run_mean = int(self._run_bytes.numpy()) / max(steps, 1)
        return {
            "sent_bytes": float(sent),
            "overhead_bytes": float(overhead),
            "intra_host_bytes": float(intra_host),
            "dense_bytes": float(self._dense_bytes),
            "compression_ratio": self._dense_bytes / max(sent + overhead, 1),
            "run_steps": float(steps),
            "run_mean_bytes": float(run_mean),
            "run_compression_ratio": self._dense_bytes / max(run_mean, 1e-9),
        }

    @property
    def skipped_steps(self) -> int:
        """Steps skipped everywhere for a non-finite gradient
        (`non_finite="skip"`). Call outside `tf.function`."""
        if not self.built:
            return 0
        return int(self._skipped_steps.numpy())

    @property
    def network_cost(self):
        """The `CostModel` measured at build (or None if none was)."""
        return getattr(self, "_network_cost", None)

    # --- saving ------------------------------------------------------------

    def save_own_variables(self, store):
        """Keras saving (`save_weights`, `.keras`, `BackupAndRestore`).

        The wrapper's per-replica variables (`aggregation="none"`: the
        compressor states, accumulators, counters) are saved with every
        replica's value, stacked [replicas, ...]; the others (the inner
        optimizer's, the same on every replica) once, as Keras does. Under
        MultiWorkerMirroredStrategy this gathers from every worker: every
        worker must save at the same step (Keras's `BackupAndRestore` and
        `tfgc.callbacks.BackupAndRestore` do).
        """
        stacked = iter(
            replica_state.gather(self._strategy, self._per_replica_variables())
        )
        for i, variable in enumerate(self.variables):
            per_replica = _per_replica(variable)
            store[str(i)] = next(stacked) if per_replica else variable.numpy()
        store[replica_state.REPLICAS_KEY] = np.array(
            self._strategy.num_replicas_in_sync
        )

    def load_own_variables(self, store):
        """Gives each replica its own saved state back.

        Saved with another number of replicas, the per-replica state
        cannot be split among the new ones: it is reset to its initial
        value (residuals and accumulators to zero, so what was not yet
        sent is dropped, as at the start of training), with a warning; the
        inner optimizer's variables and the step are restored.
        """
        if replica_state.REPLICAS_KEY not in store:
            # Written before per-replica saving: one copy for all.
            return super().load_own_variables(store)
        variables = self.variables
        if len(store.keys()) - 1 != len(variables):
            raise ValueError(
                f"The saved optimizer {self.name!r} has "
                f"{len(store.keys()) - 1} variables and this one "
                f"{len(variables)}: it was saved with another model, "
                "compressor, error_feedback or inner optimizer. Build the "
                "same configuration to load it."
            )
        per_replica, stacked = [], []
        for i, variable in enumerate(variables):
            value = np.asarray(store[str(i)])
            if _per_replica(variable):
                per_replica.append(variable)
                stacked.append(value)
            else:
                variable.assign(value)
        self._load_replica_values(
            int(np.asarray(store[replica_state.REPLICAS_KEY])), stacked
        )

    def _per_replica_variables(self) -> list:
        """The variables each replica keeps its own value of, in order."""
        return [v for v in self.variables if _per_replica(v)]

    def _load_replica_values(self, saved: int, stacked) -> None:
        """Row r of each of `stacked` (saved with `saved` replicas) to
        replica r of `_per_replica_variables()`; with another number of
        replicas, the first row to all, then the compressor state reset."""
        replicas = self._strategy.num_replicas_in_sync
        if saved != replicas:
            # Values every replica shares (the inner optimizer's slots,
            # SBC's round start) survive; the compressor state is reset.
            stacked = [np.repeat(s[:1], replicas, axis=0) for s in stacked]
        replica_state.scatter(
            self._strategy, self._per_replica_variables(), stacked
        )
        if saved == replicas:
            return
        self._reset_replica_state()
        warnings.warn(
            f"The optimizer {self.name!r} was saved with {saved} replicas "
            f"and is loaded with {replicas}: each replica's compressor "
            "state (error-feedback residuals, momenta, low-rank factors, "
            "accumulated gradients) cannot be divided among a different "
            "number of replicas, so it starts afresh, as at the start of "
            "training. Weights, the inner optimizer's state and the step "
            "are restored.",
            stacklevel=3,
        )

    def _reset_replica_state(self):
        """Every replica's compressor state back to its initial value."""
        for plan in self._plans:
            initial = tf.nest.flatten(plan.state_structure)
            for variable, value in zip(plan.state_variables, initial):
                variable.assign(value)
            if plan.accumulator is not None:
                plan.accumulator.assign(tf.zeros_like(plan.accumulator))
        for counter in (
            *self._traffic,
            self._run_bytes,
            self._run_steps,
            self._skipped_steps,
        ):
            counter.assign(tf.zeros_like(counter))

    # --- delegation and serialization --------------------------------------

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(
                self.inner_optimizer
            ),
            "compressor": keras.saving.serialize_keras_object(self.compressor),
            "error_feedback": self.error_feedback,
            "communicator": communicators.serialize(self.communicator),
            "min_compress_size": self.min_compress_size,
            "seed": self.seed,
            "non_finite": self.non_finite,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects
        )
        compressor = keras.saving.deserialize_keras_object(
            config.pop("compressor"), custom_objects=custom_objects
        )
        return cls(inner, compressor=compressor, **config)


def _variable_name(variable, index: int) -> str:
    """A name for state variables: the variable's path, or its index."""
    path = _describe(variable)
    if not path:
        return f"variable_{index}"
    return path.replace("/", "_").replace(":", "_")


def _check_momentum_applied_once(compressor, inner_optimizer) -> None:
    momentum = compressor.local_momentum
    if not momentum:
        return
    plain_sgd = (
        type(inner_optimizer) is keras.optimizers.SGD
        and not inner_optimizer.momentum
        and not inner_optimizer.nesterov
    )
    if plain_sgd:
        return
    name = type(compressor).__name__
    raise ValueError(
        f"{name} applies momentum {momentum} itself (momentum correction), "
        "so the inner optimizer must apply the summed update as it is: use "
        f"keras.optimizers.SGD(learning_rate) with {name}(momentum="
        f"{momentum}), or {name}(momentum=0) to keep "
        f"{type(inner_optimizer).__name__}. Received inner_optimizer="
        f"{type(inner_optimizer).__name__}"
        + (
            f"(momentum={inner_optimizer.momentum})"
            if hasattr(inner_optimizer, "momentum")
            else ""
        )
    )


def _check_step_counter(inner, topology):
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


def _non_finite_report(verdicts, names) -> tf.Tensor:
    """The error text of a step with non-finite gradients: which replica
    had them in which variable. `verdicts` is [replicas, variables] bool
    (True: finite); `names` names the columns."""
    bad = tf.where(tf.logical_not(verdicts))
    where = tf.strings.join(
        [
            "replica ",
            tf.strings.as_string(bad[:, 0]),
            ": ",
            tf.gather(tf.constant(names), bad[:, 1]),
        ]
    )
    return tf.strings.join(
        [
            "Non-finite gradient (NaN or Inf), so every worker stops "
            "(CompressedOptimizer(non_finite='raise')); under "
            "MultiWorkerMirroredStrategy with one device per worker the "
            "replica is the worker's task index. ",
            tf.strings.reduce_join(where, separator="; "),
        ]
    )


def _per_replica(variable) -> bool:
    """Whether each replica keeps its own value of `variable`."""
    return getattr(variable, "aggregation", None) == "none"


def _no_traffic() -> communicators.Traffic:
    """The traffic of a step that sends nothing."""
    zero = tf.constant(0, tf.int64)
    return communicators.Traffic(zero, zero, zero)


def _overwrites_with_gradient(variable) -> bool:
    """Keras float8 scales and histories take their gradient as their new
    value; they are neither compressed nor summed (as in Keras)."""
    return bool(getattr(variable, "overwrite_with_gradient", False))


def _without_overwritten(grads, trainable_variables) -> list:
    """`grads` with None for the variables that are overwritten."""
    return [
        None if _overwrites_with_gradient(v) else g
        for g, v in zip(grads, trainable_variables)
    ]


def _with_overwritten(summed, grads, trainable_variables) -> list:
    """`summed`, with the local gradients of the overwritten variables."""
    return [
        g if _overwrites_with_gradient(v) else s
        for s, g, v in zip(summed, grads, trainable_variables)
    ]


def _describe(variable) -> str:
    """The variable's path (Keras) or name (a raw tf.Variable)."""
    return getattr(variable, "path", None) or variable.name


def _check_gradient(grad, variable):
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
            f"{grad.dtype.name} for variable {_describe(variable)!r}; make the "
            "variable non-trainable or cast its gradient."
        )
    if grad.shape.is_fully_defined() and tuple(grad.shape) != tuple(
        variable.shape
    ):
        raise ValueError(
            f"Gradient shape {tuple(grad.shape)} does not match variable "
            f"{_describe(variable)!r} of shape {tuple(variable.shape)}."
        )
    return grad
