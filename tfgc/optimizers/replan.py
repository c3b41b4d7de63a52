"""Re-planning (`Auto(replan_every=N)`): every N steps the planner's
predictions are corrected by what each codec measured, and each bucket
gets the candidate fastest by the corrected predictions, the same on
every worker.

Each bucket's exchange is timed in the step (`plan_clock`). At a
revision, the time each bucket's exchange took since the last one is
averaged over the workers (one all-reduce), and per candidate in use the
ratio of its measured to its predicted seconds, over the buckets it
sent, becomes its correction factor (1 until a candidate is measured).
The buckets' choices (an int32 variable, saved with the optimizer, so a
checkpoint keeps the plan) then follow `auto_plan.pick`'s rule on the
corrected predictions. A variable's residual is shared by every
candidate (`tfgc.compressors.switchable`), so a bucket that changes codec
loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfgc.optimizers import plan_clock


class Replanner(NamedTuple):
    """What a revision reads and writes.

    Attributes:
        every: steps between revisions.
        factors: float64 [candidates]: measured / predicted seconds.
        since_busy: float64 [buckets]: the clock's `busy` at the last
            revision.
        since_seen: float64: the clock's `seen` at the last revision.
        dense: per candidate, whether it sends every element.
        min_speedup: `Auto.min_speedup`.
    """

    every: int
    factors: tf.Variable
    since_busy: tf.Variable
    since_seen: tf.Variable
    dense: tuple[bool, ...]
    min_speedup: float

    @classmethod
    def create(
        cls,
        add_variable: Callable[..., tf.Variable],
        auto,
        buckets: int,
        dense: tuple[bool, ...],
    ) -> Replanner:
        def made(name, shape=(), initializer="zeros"):
            return add_variable(
                shape=shape,
                dtype="float64",
                aggregation="none",
                name=f"replan_{name}",
                initializer=initializer,
            )

        return cls(
            auto.replan_every,
            made("factors", (len(dense),), "ones"),
            made("since_busy", (buckets,)),
            made("since_seen"),
            dense,
            auto.min_speedup,
        )


def enabled(auto, plan) -> bool:
    """Whether `plan` is re-planned: asked for, and made from
    measurements (with one worker nothing is exchanged)."""
    return auto.replan_every is not None and plan.collectives is not None


def pick(corrected: tf.Tensor, dense, min_speedup: float) -> tf.Tensor:
    """`auto_plan.pick` for every bucket at once: `corrected` [buckets,
    candidates] seconds -> int32 [buckets]."""
    fastest = tf.argmin(corrected, axis=1, output_type=tf.int32)
    dense_ids = [i for i, d in enumerate(dense) if d]
    if not dense_ids:
        return fastest
    ids = tf.constant(dense_ids, tf.int32)
    best_dense = tf.gather(
        ids,
        tf.argmin(tf.gather(corrected, ids, axis=1), axis=1),
    )
    at = tf.gather(corrected, fastest, batch_dims=1)
    at_dense = tf.gather(corrected, best_dense, batch_dims=1)
    compresses = tf.logical_not(tf.gather(tf.constant(dense), fastest))
    stay_dense = tf.logical_and(compresses, at * min_speedup > at_dense)
    return tf.where(stay_dense, best_dense, fastest)


def revise_when_due(timing: plan_clock.Timing, group) -> None:
    """A revision, in the steps where one is due (the same steps on every
    worker: the clock counts alike)."""
    clock, planner = timing.clock, timing.replanner
    settle = float(plan_clock.SETTLE)
    counted = tf.maximum(clock.seen - settle, 0.0) - tf.maximum(
        planner.since_seen - settle, 0.0
    )
    due = tf.logical_and(
        clock.seen - planner.since_seen >= planner.every, counted > 0
    )

    def revise():
        window = clock.busy - planner.since_busy
        if group.size > 1:
            window = group.all_reduce(window) / group.size
        measured = window / counted
        table = tf.constant(timing.table, tf.float64)
        current = tf.convert_to_tensor(timing.choices)
        ran = tf.one_hot(current, len(planner.dense), dtype=tf.float64)
        predicted = tf.gather(table, current, batch_dims=1)
        measured_by = tf.reduce_sum(measured[:, None] * ran, axis=0)
        predicted_by = tf.reduce_sum(predicted[:, None] * ran, axis=0)
        factors = tf.where(
            predicted_by > 0,
            measured_by / tf.maximum(predicted_by, 1e-12),
            planner.factors,
        )
        chosen = pick(
            table * factors[None, :], planner.dense, planner.min_speedup
        )
        timing.choices.assign(chosen)
        planner.factors.assign(factors)
        planner.since_busy.assign(clock.busy)
        planner.since_seen.assign(clock.seen)

    tf.cond(due, revise, lambda: None)
