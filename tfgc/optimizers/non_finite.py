"""The non-finite guard: a step whose gradients hold NaN or Inf on any
replica is skipped, or fails, on every worker alike
(`CompressedOptimizer(non_finite="skip" | "raise")`)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

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
    others waiting in their collectives. The choice runs in cross-replica
    context, as gradient accumulation's does.
    """
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return apply_checked(grads, trainable_variables)
    local = tf.stack(
        [tf.reduce_all(tf.math.is_finite(grads[i])) for i in present]
    )
    verdicts = communicator.gather_flags(local)
    finite = tf.reduce_all(verdicts)
    if policy == "raise":
        names = [describe(trainable_variables[i]) for i in present]
        failed = tf.debugging.Assert(
            finite, [_report(verdicts, names)], summarize=1
        )
        with tf.control_dependencies([failed]):
            grads = [None if g is None else tf.identity(g) for g in grads]
        return apply_checked(grads, trainable_variables)

    def cross_replica(strategy, grads, finite):
        # Every replica holds the same verdict.
        finite = strategy.experimental_local_results(finite)[0]

        def take_step():
            strategy.extended.call_for_each_replica(
                apply_checked, args=(grads, trainable_variables)
            )
            return tf.constant(True)

        def skip():
            skipped_steps.assign_add(1)
            return tf.constant(False)

        tf.cond(finite, take_step, skip)

    tf.distribute.get_replica_context().merge_call(
        cross_replica, args=(grads, finite)
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
