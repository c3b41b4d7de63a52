"""Plans that change as training runs, the same on every worker.

Trials (`Auto(trial_steps=W)`): the contenders (`auto_plan.contenders`:
plans whose predictions the start-up measurement cannot tell apart) take
turns step by step for W rounds (in reverse order every other round),
so that a slow spell of the machine falls on each alike. Each step is
measured by its period, from its first bucket's gradients to the next
step's (known one step later): all the step costs, its exchange and
whatever of the codec's compute delays the next step, and nothing of the
next step's contender, whose exchange starts after that stamp. The
periods are averaged over the workers (each worker's differs from the
others' only by how the workers' skew changed); the contender with the
shortest median wins.

Revisions (`Auto(replan_every=N)`): every N steps after the trials the
planner's predictions are corrected by what each codec measured, and
each bucket gets the candidate fastest by the corrected predictions.

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
    """What trials and revisions read and write.

    Attributes:
        every: steps between revisions (None: no revisions).
        factors: float64 [candidates]: measured / predicted seconds.
        since_busy: float64 [buckets]: the clock's `busy` at the last
            revision (or the end of the trials).
        since_seen: float64: the clock's `seen` then.
        dense: per candidate, whether it sends every element.
        min_speedup: `Auto.min_speedup`.
        contenders: the plans tried in turn in the first counted steps
            (`AutoPlan.contenders`); fewer than two: no trials.
        window: the rounds of the trials (steps each contender runs).
        periods: float64 [window * contenders]: each trial step's
            period, round by round.
    """

    every: int | None
    factors: tf.Variable
    since_busy: tf.Variable
    since_seen: tf.Variable
    dense: tuple[bool, ...]
    min_speedup: float
    contenders: tuple[tuple[int, ...], ...]
    window: int
    periods: tf.Variable

    @classmethod
    def create(
        cls,
        add_variable: Callable[..., tf.Variable],
        auto,
        plan,
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

        contenders = plan.contenders if len(plan.contenders) > 1 else ()
        window = auto.trial_steps or 1
        return cls(
            auto.replan_every,
            made("factors", (len(dense),), "ones"),
            made("since_busy", (len(plan.buckets),)),
            made("since_seen"),
            dense,
            auto.min_speedup,
            contenders,
            window,
            made("periods", (max(len(contenders), 1) * window,)),
        )

    @property
    def trial_steps(self) -> int:
        """Counted steps the trials take (0: none)."""
        if not self.contenders:
            return 0
        return _trial_count(len(self.contenders), self.window)


def _trial_count(contenders: int, window: int) -> int:
    """Counted exchanges of the trials: each contender's window, and one
    more that measures the last one's period."""
    return contenders * window + 1


def enabled(auto, plan) -> bool:
    """Whether `plan`'s choices may change as it runs (trials or
    revisions): asked for, and made from measurements (with one worker
    nothing is exchanged)."""
    if plan.collectives is None:
        return False
    return auto.replan_every is not None or len(plan.contenders) > 1


def trial_exchanges(auto, plan) -> int:
    """The exchanges (training steps, without accumulation) until the
    trials' winner runs: the uncounted ones and every contender's window
    (0 without trials). Revisions may change the plan again later."""
    if not enabled(auto, plan) or len(plan.contenders) < 2:
        return 0
    return plan_clock.SETTLE + _trial_count(
        len(plan.contenders), auto.trial_steps
    )


def used(auto, plan) -> set[int]:
    """The candidates a bucket may run: every one with revisions, else
    those of the contenders."""
    if auto.replan_every is not None:
        return set(range(len(plan.candidates)))
    return {c for contender in plan.contenders for c in contender}


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


def step_end(timing: plan_clock.Timing, group, period: tf.Tensor) -> None:
    """After a timed exchange, `period` seconds after the one before (from
    first bucket ready to first bucket ready): a trial step's record or a
    revision, where one is due (the same steps on every worker: the clock
    counts alike)."""
    if timing.replanner.contenders:
        _trial_step(timing, group, period)
    if timing.replanner.every is not None:
        _revise_when_due(timing, group)


def _counted(clock) -> tf.Tensor:
    return tf.maximum(clock.seen - float(plan_clock.SETTLE), 0.0)


def _agreed(value: tf.Tensor, group) -> tf.Tensor:
    """The mean of the float64 [n] `value` over the workers."""
    if group.size == 1:
        return value
    return group.all_reduce(value) / group.size


def _turn(slot, count: int):
    """The contender of the trials' step `slot` (0-based): in order in
    even rounds, in reverse in odd ones, so that a contender's steps
    alternate in parity round by round and a codec with two phases
    (ACP-SGD's P and Q) runs both, whatever the number of contenders."""
    position = slot % count
    return tf.where((slot // count) % 2 == 0, position, count - 1 - position)


def trial_periods(planner: Replanner) -> tuple[tuple[float, ...], ...]:
    """This worker's periods (seconds) of each contender's trial steps,
    [contenders][rounds], in `contenders` order (zeros for steps not yet
    measured); () without trials. The trials keep the shortest median of
    these, each the mean over the workers. Call outside `tf.function`."""
    if len(planner.contenders) < 2:
        return ()
    rounds = _by_contender(planner.periods, planner.window).numpy()
    return tuple(tuple(float(v) for v in row) for row in rounds.T)


def _by_contender(periods, window: int) -> tf.Tensor:
    """The trial steps' `periods` [window * contenders] as [window,
    contenders], a column per contender (odd rounds ran in reverse)."""
    rounds = tf.reshape(periods, [window, -1])
    even = tf.range(window) % 2 == 0
    return tf.where(even[:, None], rounds, rounds[:, ::-1])


def _trial_step(timing: plan_clock.Timing, group, period: tf.Tensor) -> None:
    """In the trials, counted exchange c ran contender `_turn(c - 1)`;
    its period, from its first bucket's gradients to the next exchange's,
    is known at exchange c + 1, which keeps it. After the last round (one
    exchange later) the contender with the shortest median period (each
    the mean over the workers: the same on every worker) runs from then
    on."""
    clock, planner = timing.clock, timing.replanner
    count, window = len(planner.contenders), planner.window
    step = tf.cast(_counted(clock), tf.int32)  # this exchange's, from 1
    plans = tf.constant(planner.contenders, tf.int32)
    last = _trial_count(count, window)

    def trial():
        # Exchange 1's period is the last uncounted exchange's.
        at = tf.maximum(step - 2, 0)
        kept = tf.tensor_scatter_nd_update(planner.periods, [[at]], [period])
        periods = tf.where(step >= 2, kept, planner.periods)
        planner.periods.assign(periods)

        def next_contender():
            timing.choices.assign(tf.gather(plans, _turn(step, count)))

        def settle():
            rounds = _by_contender(_agreed(periods, group), window)
            ordered = tf.sort(rounds, axis=0)
            median = (ordered[(window - 1) // 2] + ordered[window // 2]) / 2
            best = tf.argmin(median, output_type=tf.int32)
            timing.choices.assign(tf.gather(plans, best))
            # Revisions measure from here on.
            planner.since_busy.assign(clock.busy)
            planner.since_seen.assign(clock.seen)

        tf.cond(step == last, settle, next_contender)

    in_trials = tf.logical_and(step >= 1, step <= last)
    tf.cond(in_trials, trial, lambda: None)


def _revise_when_due(timing: plan_clock.Timing, group) -> None:
    """A revision every `every` steps once the trials are over."""
    clock, planner = timing.clock, timing.replanner
    settle = float(plan_clock.SETTLE)
    counted = _counted(clock) - tf.maximum(planner.since_seen - settle, 0.0)
    due = tf.logical_and(
        clock.seen - planner.since_seen >= planner.every, counted > 0
    )
    if planner.contenders:
        due = tf.logical_and(due, _counted(clock) > planner.trial_steps)

    def revise():
        measured = _agreed(clock.busy - planner.since_busy, group) / counted
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
