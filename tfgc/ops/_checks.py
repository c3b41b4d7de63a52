"""Run-time checks that `tf.function` orders with nothing else.

`tf.function` runs every stateful op in program order, and its automatic
control dependencies put every stateful op that takes no resource
(`tf.debugging.Assert`, the `If` guarding a `tf.debugging.assert_*`) into
one chain in the order the ops were traced. Under a `MirroredStrategy` with
several replicas in one process, all replicas trace into one graph, one
replica after another, and tfgc runs each replica's collectives in that
replica's own trace. Checks in the pure-TF reference ops then deadlock
the step: replica 1's checks before its all-gather wait for replica 0's
checks after its all-gather (of the gathered indices, say), which wait for
replica 0's all-gather, which waits for replica 1's. No thread runs; the
process hangs at 0 % CPU. The compiled ops check inside their kernels and
add no such op.

`independent` builds the checks inside the taken branch of a `tf.cond`
that also reads a resource handle of its own. The guard then takes a
resource input, so the automatic control dependencies leave it out of
the chain: it still runs before whatever depends on it, but waits for no
other check, the way `AutomaticControlDependencies.run_independently`
marks an op (TensorFlow offers that method only to its own tracing code).
The checks and their messages are TensorFlow's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from tfgc.ops import _library


def _anchored(fn: Callable[[], object], handle: tf.Tensor):
    """fn, made to read `handle` first (so that a cond captures it)."""

    def branch():
        read = tf.raw_ops.VarIsInitializedOp(resource=handle)
        with tf.control_dependencies([read]):
            return fn()

    return branch


def _anchor() -> tf.Tensor:
    """A resource handle of its own, placed on the current device. Its op
    is stateful too, and chained with the others, but takes no input, so
    the chain waits for nothing that a collective waits for."""
    return tf.raw_ops.VarHandleOp(
        dtype=tf.float32, shape=[], shared_name="", name="check_anchor"
    )


def cond(pred, true_fn, false_fn, name=None):
    """`tf.cond` whose branches may hold checks (or other stateful ops):
    like the checks of `independent`, the `If` waits for no other stateful
    op. Without stateful ops in the branches TensorFlow builds a stateless
    `If`, which is never chained: use `tf.cond` there."""
    if tf.executing_eagerly() or _library.compiling_with_xla():
        return tf.cond(pred, true_fn, false_fn, name=name)
    handle = _anchor()
    return tf.cond(
        pred,
        _anchored(true_fn, handle),
        _anchored(false_fn, handle),
        name=name,
    )


def independent(
    build: Callable[[], Sequence[tf.Operation | tf.Tensor | None]],
) -> list[tf.Operation]:
    """Builds the run-time checks that `build` returns, ordered with no
    other stateful op; returns what to pass to `tf.control_dependencies`.

    Args:
        build: makes the checks (`tf.debugging.assert_*`,
            `tf.debugging.Assert`) from tensors of the caller's graph and
            returns them.

    Returns:
        In a graph, one op that runs after every check and raises their
        error; in eager mode, where a failing check raises at once, and
        while XLA compiles (which drops asserts), the checks themselves.
    """
    if tf.executing_eagerly() or _library.compiling_with_xla():
        return [c for c in build() if c is not None]

    def run():
        checks = [c for c in build() if c is not None]
        with tf.control_dependencies(checks):
            return tf.no_op()

    guard = cond(tf.constant(True), run, tf.no_op, name="checks")
    return [guard if isinstance(guard, tf.Operation) else guard.op]
