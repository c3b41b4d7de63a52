"""What the planner's buckets did, timed inside the training step, to set
beside what it predicted (`CompressedOptimizer.plan_report`).

Per exchange and bucket, a timestamp when the bucket's gradients exist
(`ready`) and one when its sums do (`done`). The ready stamps are made
before any bucket's exchange and the done stamps after all of them:
TensorFlow runs stateful ops that touch no resource (timestamps) in
program order, so each kind stays in bucket order without waiting on the
other. The step's period is the time between two exchanges' first ready
stamps. Sums over the counted exchanges are kept in variables; the first
`SETTLE` exchanges (tracing, first allocations) are not counted. The
exchange left after the last gradient is also summed as the worker whose
gradients were ready last saw it: the other workers' includes their wait
for that one, the workers' skew, which the prediction keeps as measured,
as it keeps the backward pass. Each worker keeps its own of the last
`SHARE_EVERY` exchanges, and after every `SHARE_EVERY`-th one the workers
share them (`share_when_due`: one all-gather of that many numbers).
Shared every step, the gather added a collective to every step; made at
a step's start, it held up a bucket whose exchange is a switch (trials,
revisions, a codec with phases), compression included, until it
completed, which on loaded cores was late in the backward pass
(automatic control dependencies order every user of the collectives'
ordering token).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgc import ops
from tfgc.core import bucket_costs

#: Exchanges not counted at the start.
SETTLE = 3
#: Counted exchanges between two shares of the workers' exposed parts.
SHARE_EVERY = 8
#: How far (a fraction of the measured step) the predicted step may be
#: off before the check warns.
TOLERANCE = 0.25


class Clock(NamedTuple):
    """float64 variables, one value per replica (B: the plan's buckets).

    Attributes:
        seen: exchanges timed so far.
        previous: the last exchange's first ready stamp (seconds).
        period: sum of the counted exchanges' periods.
        offsets: [B] sum of each bucket's ready stamp after the first.
        busy: [B] sum of each bucket's exchange, from when it could start
            (its gradients ready and the previous bucket done) to its end.
        exposed: sum of the time from the last ready stamp to the last
            done stamp: the exchange the backward pass did not hide.
        critical: the same on the worker whose gradients were ready last
            (each exchange's shortest over the workers): `exposed` less
            this worker's wait for that one, the workers' skew; summed
            `SHARE_EVERY` exchanges at a time (`share_when_due`).
        unshared: [SHARE_EVERY] this worker's exposed part of the counted
            exchanges since the last share, in order.
    """

    seen: tf.Variable
    previous: tf.Variable
    period: tf.Variable
    offsets: tf.Variable
    busy: tf.Variable
    exposed: tf.Variable
    critical: tf.Variable
    unshared: tf.Variable

    @classmethod
    def create(cls, add_variable: Callable[..., tf.Variable], buckets: int):
        def made(name, shape=()):
            return add_variable(
                shape=shape,
                dtype="float64",
                aggregation="none",
                name=f"plan_clock_{name}",
            )

        return cls(
            made("seen"),
            made("previous"),
            made("period"),
            made("offsets", (buckets,)),
            made("busy", (buckets,)),
            made("exposed"),
            made("critical"),
            made("unshared", (SHARE_EVERY,)),
        )

    def sums(self) -> list:
        """The values `report` reads, in its order."""
        return [
            self.seen,
            self.period,
            self.offsets,
            self.busy,
            self.exposed,
            self.critical,
        ]


class Timing(NamedTuple):
    """What a step needs to time its exchange against a plan.

    Attributes:
        clock: the sums' variables.
        table: [buckets][candidates] predicted exchange seconds.
        choices: each bucket's candidate: a tuple, or (re-planning) the
            int32 variable [buckets] that holds them.
        check_after: warn (`warn_if_off`) once this many exchanges are
            counted; None: never.
        replanner: a `replan.Replanner`, or None.
        compute: like `table`, the part of each that the codec computes
            (`BucketChoice.compute`); empty: not known.
    """

    clock: Clock
    table: tuple[tuple[float, ...], ...]
    choices: object
    check_after: int | None
    replanner: object = None
    compute: tuple[tuple[float, ...], ...] = ()

    def predicted(self) -> tf.Tensor:
        """float64 [buckets]: each bucket's predicted seconds under its
        candidate now."""
        return self._chosen(self.table)

    def predicted_compute(self) -> tf.Tensor:
        """float64 [buckets]: the codec's part of `predicted` (zeros where
        not known)."""
        if not self.compute:
            return tf.zeros_like(self.predicted())
        return self._chosen(self.compute)

    def _chosen(self, table) -> tf.Tensor:
        choices = self.choices
        if isinstance(choices, tuple):
            choices = tf.constant(choices, tf.int32)
        return tf.gather(tf.constant(table, tf.float64), choices, batch_dims=1)


def stamp_after(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """The time (float64 seconds) once every one of `tensors` exists;
    refused while tracing for XLA, which has no kernel for it."""
    _refuse_xla()
    with tf.control_dependencies(list(tensors)):
        return tf.timestamp()


def _refuse_xla() -> None:
    ops.refuse_xla(
        "compressor='auto' times each bucket's exchange with tf.timestamp "
        "(to check its predictions and run its trials), which XLA has no "
        "kernel for (a plan given as Auto(choices=...) is not timed)",
        data_dependent_shape=False,
    )


def record(clock: Clock, ready: Sequence, done: Sequence) -> None:
    """Adds one exchange's stamps (per bucket, in exchange order)."""
    ready, done = tf.stack(ready), tf.stack(done)
    free = tf.concat([ready[:1], done[:-1]], axis=0)  # wire free again
    busy = done - tf.maximum(ready, free)
    counted = clock.seen >= SETTLE
    weight = tf.cast(counted, tf.float64)
    clock.period.assign_add(weight * (ready[0] - clock.previous))
    clock.offsets.assign_add(weight * (ready - ready[0]))
    clock.busy.assign_add(weight * busy)
    exposed = done[-1] - tf.reduce_max(ready)
    clock.exposed.assign_add(weight * exposed)
    slot = tf.cast(tf.maximum(clock.seen - SETTLE, 0.0), tf.int32)
    kept = tf.tensor_scatter_nd_update(
        clock.unshared, [[slot % SHARE_EVERY]], [exposed]
    )
    clock.unshared.assign(tf.where(counted, kept, clock.unshared))
    clock.previous.assign(ready[0])
    clock.seen.assign_add(1.0)


def shared_count(counted: int) -> int:
    """Of `counted` exchanges, how many `critical` holds."""
    return counted - counted % SHARE_EVERY


def share_when_due(clock: Clock, group) -> None:
    """After `record`, every `SHARE_EVERY` counted exchanges: adds their
    exposed parts as the worker ready last saw them (each the shortest
    over the workers of `group`) to `critical`. Refused under XLA, as the
    stamps are (before this gather, which XLA refuses on CPUs for another
    reason)."""
    _refuse_xla()
    counted = clock.seen - SETTLE

    def share():
        unshared = tf.convert_to_tensor(clock.unshared)
        shortest = shortest_over_workers(unshared, group)
        clock.critical.assign_add(tf.reduce_sum(shortest))

    every = tf.math.floormod(counted, SHARE_EVERY) == 0
    due = tf.logical_and(counted > 0, every)
    tf.cond(due, share, lambda: None)


def shortest_over_workers(value: tf.Tensor, group) -> tf.Tensor:
    """Per element of the float64 [n] `value` (a time from a bucket's
    gradients to its sums), the shortest over the workers of `group`: the
    time on the worker ready last, which waits for no other."""
    if group.size == 1:
        return value
    return tf.reduce_min(group.all_gather(value), axis=0)


class PlanReport(NamedTuple):
    """Measured against predicted, per exchange (seconds, means over
    `exchanges`).

    Attributes:
        exchanges: the exchanges measured.
        step: the measured period between exchanges (one training step,
            or one accumulation of steps).
        predicted_step: the same with the exchange the plan predicts in
            place of the measured one (`critical`), from the same
            backward pass (when each bucket's gradients were ready) and
            the same wait for the other workers.
        busy: per bucket, its measured exchange.
        predicted_busy: per bucket, its predicted exchange.
        exposed: the measured exchange after the last gradient.
        predicted_exposed: the predicted one.
        critical: `exposed` on the worker ready last, which waits for no
            other: the exchange's own part of it (the rest is this
            worker's wait for that one, which no plan changes).
        trials: with trials, this worker's period of each contender's
            trial steps, [contenders][rounds] (`replan.trial_periods`).
    """

    exchanges: int
    step: float
    predicted_step: float
    busy: tuple[float, ...]
    predicted_busy: tuple[float, ...]
    exposed: float
    predicted_exposed: float
    critical: float
    trials: tuple[tuple[float, ...], ...] = ()

    @property
    def error(self) -> float:
        """(predicted - measured) / measured step."""
        return (self.predicted_step - self.step) / self.step

    def text(self) -> str:
        def ms(seconds):
            return f"{1e3 * seconds:.1f} ms"

        return (
            f"tfgc Auto plan over {self.exchanges} steps: measured step "
            f"{ms(self.step)}, predicted {ms(self.predicted_step)} "
            f"({100 * self.error:+.0f} %); exchange {ms(sum(self.busy))} "
            f"measured, {ms(sum(self.predicted_busy))} predicted; after the "
            f"last gradient {ms(self.exposed)} measured (of which "
            f"{ms(self.exposed - self.critical)} waiting for other "
            f"workers), {ms(self.predicted_exposed)} predicted."
        )


def report(
    sums, predicted: Sequence[float], compute: Sequence[float] | None = None
) -> PlanReport | None:
    """The means of a clock's `sums` (`Clock.sums`, as numbers or eager
    tensors) against `predicted` (each bucket's exchange seconds, of
    which `compute` on the device, where known); None before any
    exchange was counted."""
    seen, period, offsets, busy, exposed, critical = (
        np.asarray(v) for v in sums
    )
    n = int(seen) - SETTLE
    if n <= 0:
        return None
    offsets = offsets / n
    step = float(period) / n
    exposed = float(exposed) / n
    shared = shared_count(n)
    critical = float(critical) / shared if shared else exposed
    end = bucket_costs.pipelined_seconds(
        offsets.tolist(),
        list(predicted),
        None if compute is None else list(compute),
    )
    predicted_exposed = max(end - float(np.max(offsets)), 0.0)
    return PlanReport(
        n,
        step,
        step - critical + predicted_exposed,
        tuple((busy / n).tolist()),
        tuple(float(p) for p in predicted),
        exposed,
        predicted_exposed,
        critical,
    )


def warn_if_off(found: PlanReport | None) -> None:
    """Warns when the predicted step is off the measured one by more than
    `TOLERANCE`."""
    if found is not None and abs(found.error) > TOLERANCE:
        warnings.warn(
            f"{found.text()} The prediction is off by more than "
            f"{TOLERANCE:.0%}: the plan may not be the fastest. "
            'docs/algorithms.md, "The planner", says what is measured.',
            stacklevel=2,
        )


def finish(timing: Timing, ready, done, group, checks: bool) -> None:
    """Records an exchange's stamps and shares them with the workers of
    `group` when due; with `checks` (one replica of the chief) also checks
    the prediction when due."""
    record(timing.clock, ready, done)
    share_when_due(timing.clock, group)
    if checks and timing.check_after is not None:
        check_when_due(
            timing.clock,
            timing.check_after,
            timing.predicted(),
            timing.predicted_compute(),
        )


def check_when_due(
    clock: Clock, after: int, predicted: tf.Tensor, compute: tf.Tensor
) -> None:
    """Once `after` exchanges have been counted, `warn_if_off` (one host
    call, in the step where it is due; `report`'s arguments)."""

    def check(predicted, compute, *sums):
        found = report(
            [s.numpy() for s in sums],
            predicted.numpy().tolist(),
            compute.numpy().tolist(),
        )
        warn_if_off(found)

    def due():
        inputs = [predicted, compute, *clock.sums()]
        tf.py_function(check, inputs, Tout=[])

    tf.cond(tf.equal(clock.seen, SETTLE + after), due, lambda: None)
