"""One exchange of gradients by their plans, and what the step schedules
(`accumulation`, `local_rounds`, `non_finite`) are given to take a step."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfgc.communicators import exchange as communicator_exchange
from tfgc.communicators.communicator import replica_id
from tfgc.core.wire import Traffic, no_traffic
from tfgc.optimizers import plan_clock, planning, replan

# What `no_overlap` has said in this process.
_SAID: set[str] = set()

#: exchange(tensors, trainable_variables, step) -> Exchanged
Exchange = Callable[[list, list, tf.Tensor], "Exchanged"]


class Steps(NamedTuple):
    """The optimizer's parts a step schedule drives.

    Attributes:
        exchange: compresses, exchanges and decompresses gradients
            (`exchange` below, bound to the optimizer's plans).
        exchange_agreeing: the same with each bucket's non-finite
            verdicts, its new states not yet written, for the guard
            (`exchange_in_buckets` below).
        inner_apply: the inner optimizer's step on summed gradients,
            `inner_apply(grads, trainable_variables, buckets=None)`, bucket
            by bucket (lists of indices) when its update is fused.
        count: records a step's `Traffic` in the statistics.
        plans_of: `plans_of(items, trainable_variables)`: the indices of
            the items that are not None and their variables' plans.
    """

    exchange: Exchange
    exchange_agreeing: Callable[[list, list, tf.Tensor], Exchanged]
    inner_apply: Callable[..., None]
    count: Callable[[Traffic], None]
    plans_of: Callable[[list, list], tuple[list[int], list]]

    @classmethod
    def of(cls, optimizer, count: Callable[[Traffic], None]) -> Steps:
        """A built `CompressedOptimizer`'s steps, counted by `count`."""
        bound = (
            optimizer.communicator,
            optimizer.compressor.spec.warmup_steps,
            optimizer.bucket_bytes,
            optimizer._plans_of,
        )
        timing = optimizer._timing
        return cls(
            functools.partial(exchange, *bound, timing=timing),
            functools.partial(
                exchange_in_buckets, *bound, agree_finite=True, timing=timing
            ),
            optimizer._inner_apply,
            count,
            optimizer._plans_of,
        )


def no_overlap(reason: str, bucket_bytes: int | None) -> None:
    """Says once per process why the buckets (if `bucket_bytes`) cannot
    overlap the backward pass: `reason` makes them wait for every
    gradient."""
    if not bucket_bytes or reason in _SAID:
        return
    _SAID.add(reason)
    warnings.warn(
        f"tfgc: {reason}, so the exchange waits for every gradient and its "
        "buckets do not overlap the backward pass (docs/algorithms.md, "
        '"Buckets and the overlap with the backward pass").',
        stacklevel=3,
    )


def plain(steps: Steps, grads, trainable_variables, step) -> None:
    """Exchanges this step's gradients and applies their sum, bucket by
    bucket where the inner optimizer's update is fused."""
    exchanged = planning.without_overwritten(grads, trainable_variables)
    result = steps.exchange(exchanged, trainable_variables, step)
    steps.count(result.traffic)
    steps.inner_apply(
        planning.with_overwritten(result.totals, grads, trainable_variables),
        trainable_variables,
        result.buckets,
    )


def exchange(*args, **kwargs) -> Exchanged:
    """Compresses, exchanges and decompresses `tensors` (None skipped) and
    writes the compressors' new states: `exchange_in_buckets` without the
    non-finite guard."""
    result = exchange_in_buckets(*args, agree_finite=False, **kwargs)
    commit(result.plans, result.states)
    return result


class Exchanged(NamedTuple):
    """One step's exchange (`exchange_in_buckets`), the compressors' new
    states not yet written (`commit`).

    Attributes:
        totals: per tensor the sum over workers (None where it was None).
        traffic: the `Traffic` of the step.
        verdicts: with the guard, [replicas, len(columns)] bool, True
            where the replica's gradient was finite; else None.
        columns: the tensor index of each column of `verdicts`.
        plans: the plans of the exchanged tensors.
        states: each plan's new compressor state.
        buckets: the tensor indices of each bucket, in exchange order.
    """

    totals: list
    traffic: Traffic
    verdicts: tf.Tensor | None
    columns: list[int]
    plans: list
    states: list
    buckets: list[list[int]]


def finite_flags(tensors) -> tf.Tensor:
    """1-D bool: whether each of `tensors` holds only finite values."""
    return tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def commit(plans, states) -> None:
    """Writes the compressors' new states back to their variables."""
    for plan, state in zip(plans, states):
        plan.assign_state(state)


def exchange_in_buckets(
    communicator,
    warmup_steps: int,
    bucket_bytes: int | None,
    plans_of,
    tensors,
    trainable_variables,
    step,
    agree_finite: bool,
    timing: plan_clock.Timing | None = None,
) -> Exchanged:
    """The tensors travel in buckets of about `bucket_bytes` (None: all in
    one exchange; a compressor's own size wins; the planner's buckets
    where it made them), filled from the last tensor backwards. Each
    bucket is an exchange of its own (`_exchange_bucket`) that reads only
    its own tensors, so TensorFlow's executor starts it as soon as they
    exist, while the backward pass still computes the earlier layers'
    gradients; its ops are named `tfgc_bucket_<n>/...`.

    With `agree_finite` (the non-finite guard), each bucket also gathers
    every replica's verdict on its tensors (one small all-gather queued
    before its payloads, so the buckets still start during the backward
    pass), and compresses zeros in place of a tensor with NaN or Inf,
    which the compressors never see; the caller commits the new states
    only if every verdict is finite.

    With `timing` (a plan's), the buckets' exchanges are timed
    (`plan_clock`).
    """
    present, plans = plans_of(tensors, trainable_variables)
    out = list(tensors)
    if not present:
        return Exchanged(out, no_traffic(), None, [], [], [], [])
    step = tf.cast(step, tf.int64)
    groups = _groups(plans, [tensors[i] for i in present], bucket_bytes)
    ready = None
    if timing is not None and len(groups) == len(timing.table):
        # All before any exchange: see plan_clock.
        ready = [
            plan_clock.stamp_after([tensors[present[j]] for j in group])
            for group in groups
        ]
    traffic, verdicts, columns = no_traffic(), [], []
    done_plans, states, buckets = [], [], []
    for number, group in enumerate(groups):
        members = [present[j] for j in group]
        buckets.append(members)
        inputs = [tensors[i] for i in members]
        with tf.name_scope(f"tfgc_bucket_{number}"):
            if agree_finite:
                local = finite_flags(inputs)
                verdicts.append(communicator.gather_flags(local))
                columns += members
                inputs = [
                    tf.where(ok, t, tf.zeros_like(t))
                    for ok, t in zip(tf.unstack(local), inputs)
                ]
            totals, new_states, more = _exchange_bucket(
                communicator,
                warmup_steps,
                [plans[j] for j in group],
                inputs,
                [trainable_variables[i] for i in members],
                step,
            )
        for i, total in zip(members, totals):
            out[i] = total
        done_plans += [plans[j] for j in group]
        states += new_states
        traffic = Traffic(*(a + b for a, b in zip(traffic, more)))
    if ready is not None:
        done = [plan_clock.stamp_after([out[i] for i in b]) for b in buckets]
        if timing.replanner is not None:
            # The last exchange's period (its first bucket ready to this
            # one's), read before `finish` moves the clock's stamp on.
            period = ready[0] - timing.clock.previous
        workers = communicator.group()
        plan_clock.finish(timing, ready, done, workers, replica_id() == 0)
        if timing.replanner is not None:
            replan.step_end(timing, workers, period)
    joined = tf.concat(verdicts, axis=1) if verdicts else None
    return Exchanged(out, traffic, joined, columns, done_plans, states, buckets)


def _groups(plans, tensors, bucket_bytes) -> list[list[int]]:
    """The buckets of `tensors` (positions in `plans`): the planner's
    where it made them (`Plan.bucket`), else cut by `bucket_bytes` and
    the compressors' own sizes, both from the last tensor backwards."""
    if plans[0].bucket is None:
        return communicator_exchange.phase_buckets(
            _phases(plans), tensors, bucket_bytes
        )
    by_bucket: dict[int, list[int]] = {}
    for j in reversed(range(len(plans))):
        by_bucket.setdefault(plans[j].bucket, []).append(j)
    return [by_bucket[b] for b in sorted(by_bucket)]


def _phases(plans) -> list[list]:
    """Per phase of the step (as many as the plan with the most), each
    plan's compressor in it: a plan's phases taken in turn."""
    count = max(len(plan.phases) for plan in plans)
    return [[p.phases[i % len(p.phases)] for p in plans] for i in range(count)]


def _exchange_bucket(
    communicator, warmup_steps: int, plans, inputs, variables, step
) -> tuple[list, list, Traffic]:
    """One bucket's exchange: (totals, new states, traffic). The
    compressors follow the step, which every worker shares: the warm-up
    compressor for the first `warmup_steps` steps, then the phases in
    turn, each a branch of a `tf.switch_case` of this bucket's own. The
    compressor states are read from their variables."""
    states = [plan.state() for plan in plans]
    keys = [planning.key(plan.seed, step) for plan in plans]
    values = None
    if any(c.spec.reads_step_info for p in plans for c in p.phases):
        values = [tf.convert_to_tensor(v) for v in variables]

    def run(compressors):
        return communicator.step(compressors, inputs, states, keys, values)

    if plans[0].options is not None:
        return _switched(run, plans, step)
    branches = [functools.partial(run, phase) for phase in _phases(plans)]
    num_phases = len(branches)
    if warmup_steps:
        branches.insert(0, functools.partial(run, [p.warmup for p in plans]))
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
    return result


def _switched(run, plans, step):
    """Re-planning: a branch per candidate and phase of it, the candidate
    the bucket's selector holds (`Plan.options`, `Plan.selector`), its
    phases taken in turn by the step."""
    branches, first, counts = [], [], []
    for c in range(len(plans[0].options)):
        if plans[0].options[c] is None:  # never chosen: no branch
            first.append(0)
            counts.append(1)
            continue
        count = max(len(p.options[c]) for p in plans)
        first.append(len(branches))
        counts.append(count)
        branches += [
            functools.partial(
                run, [p.options[c][j % len(p.options[c])] for p in plans]
            )
            for j in range(count)
        ]
    choice = plans[0].selector[plans[0].bucket]
    phase = step % tf.gather(tf.constant(counts, tf.int64), choice)
    index = tf.gather(first, choice) + tf.cast(phase, tf.int32)
    return tf.switch_case(index, branches)
