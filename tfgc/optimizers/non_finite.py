"""The non-finite guard: a step whose gradients hold NaN or Inf on any
replica is skipped, or fails, on every worker alike
(`CompressedOptimizer(non_finite="skip" | "raise")`)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfgc.ops import _checks
from tfgc.optimizers import planning
from tfgc.optimizers import step as step_lib
from tfgc.optimizers.checks import describe


def apply(
    policy: str,
    communicator,
    skipped_steps,
    apply_checked: Callable[[list, list], None],
    grads,
    trainable_variables,
) -> None:
    """Runs `apply_checked` only if every replica's gradients are finite;
    else skips the step on every worker (counting it in `skipped_steps`),
    or fails it on every worker (`policy` "raise").

    Every replica decides from the same gathered verdicts, so all take the
    same branch: a worker that skipped or failed alone would leave the
    others waiting in their collectives.
    """
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return apply_checked(grads, trainable_variables)
    local = step_lib.finite_flags([grads[i] for i in present])
    verdicts = communicator.gather_flags(local)
    finite = tf.reduce_all(verdicts)
    if policy == "raise":
        names = [describe(trainable_variables[i]) for i in present]
        grads = _raise_unless(finite, verdicts, names, grads)
        return apply_checked(grads, trainable_variables)

    _step_or_skip(
        finite, skipped_steps, apply_checked, (grads, trainable_variables)
    )


def _step_or_skip(finite, skipped_steps, take_step, args) -> None:
    """`take_step(*args)` in every replica if `finite` (the same on every
    replica), else one more skipped step. The choice runs in cross-replica
    context, as gradient accumulation's does."""

    def cross_replica(strategy, finite, args):
        finite = strategy.experimental_local_results(finite)[0]

        def finish():
            strategy.extended.call_for_each_replica(take_step, args=args)
            return tf.constant(True)

        def skip():
            skipped_steps.assign_add(1)
            return tf.constant(False)

        tf.cond(finite, finish, skip)

    tf.distribute.get_replica_context().merge_call(
        cross_replica, args=(finite, args)
    )


def apply_in_buckets(
    policy: str,
    communicator,
    skipped_steps,
    steps: step_lib.Steps,
    grads,
    trainable_variables,
    step,
) -> None:
    """`step.plain` under the guard, its verdicts travelling with the
    buckets (`Steps.exchange_agreeing`), so that the exchange still
    overlaps the backward pass; the same decision as `apply` on every
    worker.

    Once every bucket's verdicts are in, a finite step writes the
    compressors' new states and runs the inner optimizer; otherwise
    neither happens (counted in `skipped_steps`), or the step fails
    naming the replica and the variable (`policy` "raise"). The bytes
    were sent either way and are counted.
    """
    exchanged = planning.without_overwritten(grads, trainable_variables)
    agreed = steps.exchange_agreeing(exchanged, trainable_variables, step)
    steps.count(agreed.traffic)
    verdicts, columns = [], list(agreed.columns)
    if agreed.verdicts is not None:
        verdicts.append(agreed.verdicts)
    # Gradients that overwrite their variable skip the exchange: their
    # verdicts take one more small gather.
    direct = [
        i
        for i, (g, e) in enumerate(zip(grads, exchanged))
        if g is not None and e is None
    ]
    if direct:
        local = step_lib.finite_flags([grads[i] for i in direct])
        verdicts.append(communicator.gather_flags(local))
        columns += direct
    summed = planning.with_overwritten(
        agreed.totals, grads, trainable_variables
    )
    if not verdicts:  # nothing to check
        step_lib.commit(agreed.plans, agreed.states)
        return steps.inner_apply(summed, trainable_variables, agreed.buckets)
    verdicts = tf.concat(verdicts, axis=1)
    finite = tf.reduce_all(verdicts)

    def take_step(summed, states):
        step_lib.commit(agreed.plans, states)
        steps.inner_apply(summed, trainable_variables, agreed.buckets)

    if policy == "raise":
        names = [describe(trainable_variables[i]) for i in columns]
        summed, states = _raise_unless(
            finite, verdicts, names, (summed, agreed.states)
        )
        return take_step(summed, states)

    _step_or_skip(finite, skipped_steps, take_step, (summed, agreed.states))


def _raise_unless(finite, verdicts, names, tensors):
    """`tensors` (a structure; None entries stay None) once `finite` is
    checked: the step fails with `_report` where it is False."""
    failed = _checks.independent(
        lambda: [
            tf.debugging.Assert(finite, [_report(verdicts, names)], summarize=1)
        ]
    )
    with tf.control_dependencies(failed):
        return tf.nest.map_structure(
            lambda t: None if t is None else tf.identity(t), tensors
        )


def _report(verdicts, names) -> tf.Tensor:
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
