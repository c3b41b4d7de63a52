"""`CompressedOptimizer`: compress -> communicate -> decompress, then apply.

The Keras wrapper: arguments, build, dispatch, delegation, saving, config.
docs/architecture.md says which module of this package owns the rest.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfgc import _keras_compat, communicators
from tfgc import compressors as compressors_lib
from tfgc.communicators import topology as topology_lib
from tfgc.optimizers import (
    accumulation,
    auto_plan,
    checks,
    fused_apply,
    local_rounds,
    non_finite,
    plan_clock,
    planning,
    replan,
    replica_state,
    statistics,
    step,
)
from tfgc.optimizers.checks import NON_FINITE_POLICIES

__all__ = ["DEFAULT_BUCKET_BYTES", "NON_FINITE_POLICIES", "CompressedOptimizer"]
#: Uncompressed bytes per exchange bucket unless asked otherwise.
DEFAULT_BUCKET_BYTES = 25 * 2**20


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

    Clipping and weight decay of the inner optimizer act on the summed
    gradient; its gradient accumulation sums locally and exchanges once
    per update; for `mixed_float16` wrap the other way round:
    `LossScaleOptimizer(CompressedOptimizer(...))`. docs/user_guide.md
    covers every Keras composition.

    Args:
        inner_optimizer: the `keras.optimizers.Optimizer` to wrap.
        compressor: a `tfgc.compressors.Compressor`, a name ("topk") or a
            Keras config dict; "auto" (or `tfgc.compressors.Auto(...)`):
            a codec per bucket, the one predicted fastest from
            measurements of this cluster at build (`plan`).
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
        bucket_bytes: gradients travel in buckets of about this many
            uncompressed bytes, filled from the last variable backwards,
            each with its own collectives (25 MiB, as PyTorch DDP; a
            compressor's own preference, ACP-SGD's, wins); None: one
            fused exchange of every gradient.
        fused_update: update each bucket's variables, as soon as its sums
            arrive, with one fused operator (`tfgc.ops.fused_update`),
            bit for bit Keras's own update, for Keras's SGD (momentum,
            Nesterov), Adam and AdamW; other optimizers, and False, keep
            Keras's per-variable update.
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
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        fused_update: bool = True,
        name: str | None = None,
        **kwargs,
    ):
        _keras_compat.check_versions()
        checks.check_keywords(kwargs, CompressedOptimizer.__init__)
        checks.check_inner_optimizer(inner_optimizer, CompressedOptimizer)
        checks.check_bare_compressor(compressor)
        error_feedback, min_compress_size, seed, bucket_bytes, fused_update = (
            checks.check_values(
                error_feedback,
                min_compress_size,
                seed,
                non_finite,
                bucket_bytes,
                fused_update,
            )
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
        self.bucket_bytes = bucket_bytes
        self.fused_update = fused_update
        checks.check_combination(
            self.compressor, self.communicator, error_feedback, inner_optimizer
        )
        if isinstance(self.compressor, compressors_lib.Auto):
            auto_plan.check_arguments(
                self.compressor, self.communicator, error_feedback
            )
        # Last, so that a refused configuration leaves the user's optimizer
        # as it was. Both act only inside this wrapper's calls.
        _keras_compat.sum_gradients_unless_summed(inner_optimizer)
        _keras_compat.agree_on_finite_gradients()
        # Where `import tfgc` came before TensorFlow and this class was
        # imported from its module, nothing has installed the fix yet.
        _keras_compat.patch_multi_worker_fit()

    @_keras_compat.no_automatic_dependency_tracking
    def build(self, var_list):
        topology = topology_lib.current()
        # Saving gathers the per-replica state through it.
        self._strategy = tf.distribute.get_strategy()
        # Checked before anything is created or communicated.
        checks.check_step_counter(self.inner_optimizer, topology)
        self.inner_optimizer.build(var_list)
        # Read at build, as Keras does: tfgc accumulates in its place.
        self._accumulation_steps = (
            self.inner_optimizer.gradient_accumulation_steps or 0
        )
        self.communicator.build(topology)
        net = planning.network(self.compressor, self.communicator)
        self._network_cost = net.cost
        settings = planning.Settings.of(self)
        self._auto_plan = self._selector = assigned = None
        self._plan_variables = []
        if isinstance(self.compressor, compressors_lib.Auto):
            self._auto_plan, self._selector, assigned = self._plan_buckets(
                settings, var_list, net
            )
        self._plans = planning.make_plans(
            settings, var_list, net, self.add_variable, assigned
        )
        self._counters = statistics.Counters.create(self.add_variable)
        self._timing = self._plan_timing()
        self._dense_bytes = planning.dense_bytes(var_list)
        self._fusion = (
            fused_apply.Fusion.of(self.inner_optimizer, var_list)
            if self.fused_update
            else fused_apply.Fusion(None, "fused_update=False")
        )
        self._steps = step.Steps.of(self, self._counters.count)
        super().build(var_list)
        self._saver = replica_state.Saver(
            self._strategy,
            lambda: self.variables,
            self._regroup_replica_state,
            self.name,
            lambda: self._plan_variables,
        )
        # tf.train.Checkpoint saves one replica's value of each variable;
        # this entry adds every replica's (restored after the variables).
        replica_state.track(self, self._saver.checkpoint_entry())

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    # Called from a user's tf.function, AutoGraph would convert every tfgc
    # function of the step (seconds of tracing). Keras's own step in `fit`
    # converts none of them; a custom loop now runs the same code.
    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        replica_context = tf.distribute.get_replica_context()
        checks.check_replica_context(replica_context)
        if trainable_variables is None:
            checks.check_built(self.built)
            trainable_variables = self._trainable_variables
        grads = list(grads)
        trainable_variables = list(trainable_variables)
        checks.check_lengths(grads, trainable_variables)
        if not self.built:
            checks.check_may_build_here(replica_context)
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        grads = [
            checks.check_gradient(g, v)
            for g, v in zip(grads, trainable_variables)
        ]
        spec = self.compressor.spec
        plain = not (spec.compresses_updates or self._accumulation_steps)
        if self.non_finite == "propagate":
            self._apply_checked(grads, trainable_variables)
        elif plain:
            non_finite.apply_in_buckets(
                self.non_finite,
                self.communicator,
                self._counters.skipped_steps,
                self._steps,
                grads,
                trainable_variables,
                self.iterations,
            )
        else:
            step.no_overlap(
                f"non_finite={self.non_finite!r} with local rounds or "
                "gradient accumulation agrees first",
                self.bucket_bytes,
            )
            non_finite.apply(
                self.non_finite,
                self.communicator,
                self._counters.skipped_steps,
                self._apply_checked,
                grads,
                trainable_variables,
            )

    def _apply_checked(self, grads, trainable_variables):
        """Exchanges and applies gradients that passed the checks, by the
        schedule the compressor and the inner optimizer ask for."""
        steps, spec = self._steps, self.compressor.spec
        if spec.compresses_updates:
            local_rounds.apply(
                steps, spec.delay, self.iterations, grads, trainable_variables
            )
        elif self._accumulation_steps:
            accumulation.apply(
                steps,
                self.inner_optimizer,
                self._accumulation_steps,
                grads,
                trainable_variables,
            )
        else:
            step.plain(steps, grads, trainable_variables, self.iterations)

    def apply_gradients(self, grads_and_vars):
        grads, trainable_variables = zip(*grads_and_vars)
        self.apply(grads, trainable_variables)
        # The step counter that counts is the inner optimizer's.
        return self.iterations

    def _inner_apply(self, grads, trainable_variables, buckets=None):
        """The inner optimizer's step on gradients that are already summed:
        fused, one op per bucket of indices (all in one without them), where
        `fused_apply` can stand in for Keras's update."""
        if fused_apply.usable(self._fusion, grads):
            fused_apply.apply(
                self.inner_optimizer,
                self._fusion.rule,
                grads,
                trainable_variables,
                fused_apply.covering(buckets, len(grads)),
            )
            return
        with _keras_compat.gradients_already_summed():
            self.inner_optimizer.apply(grads, trainable_variables)

    def _plans_of(self, items, trainable_variables):
        index_of = self._get_variable_index
        return planning.plans_of(
            self._plans, index_of, items, trainable_variables
        )

    def scale_loss(self, loss):
        # The inner optimizer divides by its `loss_scale_factor`, so it
        # also scales.
        return self.inner_optimizer.scale_loss(loss)

    def agree_finite(self, finite):
        """True on every worker if `finite` (this worker's scalar bool
        verdict) is True on all: `LossScaleOptimizer` calls it so that
        every worker skips the same steps."""
        step.no_overlap(
            "LossScaleOptimizer checks every gradient first", self.bucket_bytes
        )
        return self.communicator.all_true(finite)

    def compression_stats(self) -> dict[str, float]:
        """Bytes this worker sent in the last step, against dense.

        `sent_bytes` is measured from the payloads; `overhead_bytes` is
        what went on the wire beyond them (headers and padding of gathers
        whose payloads differ in size between workers);
        `intra_host_bytes` stayed inside the host (hierarchical
        communicator, whose `intra_host_reduce` names the collective
        that summed inside the host); `dense_bytes` is what an
        uncompressed all-reduce carries; `compression_ratio` is dense /
        (sent + overhead). The
        `run_` values count every step since the optimizer was built:
        `run_steps` the steps, `run_mean_bytes` (sent + overhead) per step
        and `run_compression_ratio` dense / that (with SBC's communication
        delay, most steps send nothing). All are before the collective's
        own transport factor. Call outside `tf.function`.
        """
        if not self.built:
            return {}
        return self._counters.stats(self._dense_bytes)

    @property
    def skipped_steps(self) -> int:
        """Steps skipped everywhere for a non-finite gradient
        (`non_finite="skip"`). Call outside `tf.function`."""
        if not self.built:
            return 0
        return int(self._counters.skipped_steps.numpy())

    def _plan_buckets(self, settings, var_list, net):
        """`compressor="auto"`: (the plan, the buckets' candidate variable
        with re-planning or None, the variables' assignments)."""
        plan = auto_plan.make(
            settings, var_list, self.communicator, self.bucket_bytes
        )
        if (
            self.compressor.verbose
            and self._strategy.extended.should_checkpoint
        ):
            print(plan.table(), flush=True)
        if not replan.enabled(self.compressor, plan):
            return plan, None, auto_plan.assignments(plan, len(var_list))
        selector = self._add_plan_variable(
            shape=(len(plan.buckets),),
            dtype="int32",
            aggregation="none",
            name="plan_choices",
            initializer=lambda shape, dtype: tf.constant(
                plan.bucket_choices, dtype
            ),
        )
        assigned = auto_plan.switchable_assignments(
            settings,
            plan,
            var_list,
            net,
            selector,
            replan.used(self.compressor, plan),
        )
        return plan, selector, assigned

    def _plan_timing(self):
        """The timing of a measured plan's exchanges (and its re-planner),
        else None."""
        plan = self._auto_plan
        if plan is None or plan.collectives is None:
            return None
        clock = plan_clock.Clock.create(
            self._add_plan_variable, len(plan.buckets)
        )
        table = tuple(b.seconds for b in plan.buckets)
        compute = tuple(b.compute for b in plan.buckets)
        if self._selector is None:
            return plan_clock.Timing(
                clock,
                table,
                plan.bucket_choices,
                self.compressor.check_after,
                compute=compute,
            )
        planner = replan.Replanner.create(
            self._add_plan_variable,
            self.compressor,
            plan,
            tuple(auto_plan.is_dense(c) for c in plan.candidates),
        )
        return plan_clock.Timing(
            clock,
            table,
            self._selector,
            self.compressor.check_after,
            planner,
            compute,
        )

    def _add_plan_variable(self, **kwargs):
        """A variable of the plan's buckets (its choices, timings and
        trials): its shape follows this run's measurements, so a checkpoint
        of another plan keeps it as built (`replica_state.Saver`)."""
        variable = self.add_variable(**kwargs)
        self._plan_variables.append(variable)
        return variable

    def plan_report(self):
        """With a measured `plan`: its predicted exchange against the
        measured one, means over the steps so far (`PlanReport`: `text()`,
        `error`; with trials, each contender's periods in `trials`); None
        before any step was counted or without such a plan. Call outside
        `tf.function`."""
        timing = getattr(self, "_timing", None)
        if timing is None:
            return None
        found = plan_clock.report(
            [v.numpy() for v in timing.clock.sums()],
            timing.predicted().numpy().tolist(),
            timing.predicted_compute().numpy().tolist(),
        )
        if found is None or timing.replanner is None:
            return found
        return found._replace(trials=replan.trial_periods(timing.replanner))

    @property
    def plan(self):
        """With `compressor="auto"`, the `AutoPlan`: each bucket's codec
        (with re-planning, the one in force now: call outside
        `tf.function`), its predicted times, `table()` and `choices`
        (None otherwise, or before build)."""
        plan = getattr(self, "_auto_plan", None)
        if plan is None or self._selector is None:
            return plan
        return auto_plan.with_choices(plan, self._selector.numpy().tolist())

    @property
    def network_cost(self):
        """The `CostModel` measured at build (or None if none was)."""
        return getattr(self, "_network_cost", None)

    def save_own_variables(self, store):
        """Keras saving (`save_weights`, `.keras`, `BackupAndRestore`) with
        every replica's compressor state (`replica_state.Saver.save`):
        every worker must save at the same step."""
        self._saver.save(store)

    def load_own_variables(self, store):
        """Gives each replica its own saved state back
        (`replica_state.Saver.load`); saved with another number of
        replicas, the compressor state starts afresh, with a warning."""
        if not self._saver.load(store):
            super().load_own_variables(store)

    def _regroup_replica_state(self, stacked: list, replicas: int) -> list:
        """The per-replica variables' saved rows (`stacked`, in the saver's
        order, from another number of replicas) for `replicas` replicas:
        the compressor state by `planning.regroup`, the rest (counters,
        SBC's round start, the same on every replica) the first row's."""
        variables = self._saver.per_replica_variables()
        rows = {id(v): s for v, s in zip(variables, stacked)}
        new = planning.regroup(self._plans, rows, replicas)
        return [
            new.get(id(v), np.repeat(s[:1], replicas, axis=0))
            for v, s in zip(variables, stacked)
        ]

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
            "bucket_bytes": self.bucket_bytes,
            "fused_update": self.fused_update,
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
