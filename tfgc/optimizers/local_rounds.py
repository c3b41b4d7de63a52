"""Communication delay (SBC): local steps of the inner optimizer, then one
exchange of the weight update per round."""

from __future__ import annotations

import tensorflow as tf

from tfgc.core.wire import no_traffic
from tfgc.optimizers import planning
from tfgc.optimizers.step import Steps


def apply(
    steps: Steps, delay: int, iterations, grads, trainable_variables
) -> None:
    """A local step of the inner optimizer; at a round's end, exchange.

    Every worker applies its own gradient (times the number of replicas:
    Keras divides each replica's loss by it) to its own weights. After
    every `delay` steps each worker compresses its weight update since the
    round started, and all continue from the round-start weights plus the
    mean of the updates.
    """
    # Overwritten variables (float8 scales) take no part in rounds.
    present, plans = steps.plans_of(
        planning.without_overwritten(grads, trainable_variables),
        trainable_variables,
    )
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    step = tf.cast(iterations, tf.int64)

    def when(round_edge, fn, otherwise):
        # With a delay of 1 every step starts and ends a round: no cond,
        # whose branch would hold the whole exchange as one more function.
        if delay == 1:
            return fn()
        return tf.cond(round_edge, fn, otherwise)

    def start_round():
        for i, plan in zip(present, plans):
            plan.round_start.assign(trainable_variables[i])
        return tf.constant(True)

    when(step % delay == 0, start_round, lambda: tf.constant(False))
    local = [
        None if g is None else g * replicas
        for g in planning.without_overwritten(grads, trainable_variables)
    ]
    steps.inner_apply(
        planning.with_overwritten(local, grads, trainable_variables),
        trainable_variables,
    )

    def end_round():
        updates = [None] * len(grads)
        for i, plan in zip(present, plans):
            updates[i] = trainable_variables[i] - plan.round_start
        result = steps.exchange(updates, trainable_variables, step)
        for i, plan in zip(present, plans):
            mean = tf.cast(result.totals[i], plan.round_start.dtype) / replicas
            trainable_variables[i].assign(plan.round_start + mean)
        return result.traffic

    traffic = when((step + 1) % delay == 0, end_round, no_traffic)
    steps.count(traffic)
