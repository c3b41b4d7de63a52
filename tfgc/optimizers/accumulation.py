"""Gradient accumulation: each worker sums its micro-batches locally, and
the sum is exchanged once per update (the inner optimizer's
`gradient_accumulation_steps`)."""

from __future__ import annotations

import tensorflow as tf

from tfgc import _keras_compat
from tfgc.core.wire import no_traffic
from tfgc.optimizers import planning
from tfgc.optimizers.step import Steps


def apply(
    steps: Steps, inner, accumulation_steps: int, grads, trainable_variables
) -> None:
    """Adds the gradients to this worker's accumulators; every
    `accumulation_steps`-th call exchanges the accumulated sum once and
    applies its mean, as the inner optimizer would.

    The choice runs in cross-replica context (as `LossScaleOptimizer`
    does): the inner optimizer's update may use `merge_call`, which refuses
    to run inside a replica's `tf.cond`.
    """
    # Counts micro-batches; `inner.iterations` counts updates.
    calls = _keras_compat.step_counter(inner)

    def exchange_and_apply(grads):
        exchanged = planning.without_overwritten(grads, trainable_variables)
        present, plans = steps.plans_of(exchanged, trainable_variables)
        for i, plan in zip(present, plans):
            exchanged[i] = exchanged[i] + plan.accumulator
        # Warm-up, phases and keys count exchanges, not micro-batches.
        exchange_index = tf.cast(calls, tf.int64) // accumulation_steps
        result = steps.exchange(exchanged, trainable_variables, exchange_index)
        summed = result.totals
        steps.count(result.traffic)
        for i, plan in zip(present, plans):
            summed[i] = summed[i] / accumulation_steps
            plan.accumulator.assign(tf.zeros_like(plan.accumulator))
        summed = planning.with_overwritten(summed, grads, trainable_variables)
        steps.inner_apply(summed, trainable_variables)

    def accumulate(grads):
        exchanged = planning.without_overwritten(grads, trainable_variables)
        present, plans = steps.plans_of(exchanged, trainable_variables)
        for i, plan in zip(present, plans):
            plan.accumulator.assign_add(exchanged[i])
        steps.count(no_traffic())

    def cross_replica(strategy, grads):
        each_replica = strategy.extended.call_for_each_replica

        def update():
            # The inner optimizer takes the accumulated mean as one step;
            # its own accumulation would count it as a micro-batch.
            # Nothing else runs meanwhile: the replicas wait in this
            # merge_call.
            saved = inner.gradient_accumulation_steps
            inner.gradient_accumulation_steps = None
            try:
                each_replica(exchange_and_apply, args=(grads,))
            finally:
                inner.gradient_accumulation_steps = saved

        def add():
            each_replica(accumulate, args=(grads,))
            calls.assign_add(1)

        is_update = (calls + 1) % accumulation_steps == 0
        tf.cond(is_update, update, add)

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(grads,))
