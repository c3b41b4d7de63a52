"""Writes at a few positions of a large dense vector, in its own buffer.

`tf.tensor_scatter_nd_update` (and `_add`, `_sub`) copy the whole tensor
every time: TensorFlow's kernel offers to reuse the buffer of its
`updates` input, never that of the tensor. `ScatterNdNonAliasingAdd`
reuses the tensor's buffer whenever nothing else holds it, so a residual
or a momentum with k entries changed costs k writes instead of a copy of
n (6.25 M float32 elements: about 2 ms on a 2-core machine).

An addition writes the same bits as the assignment it stands for: x - v
is x + (-v) in IEEE arithmetic, and x + (-x) is +0 for finite x. Where a
value is not finite that no longer holds (inf - inf is NaN, not the 0 the
callers write there), so those steps take the copying path; the result is
the same either way. Indices must be distinct: an addition at a repeated
index would apply twice where an assignment applies once. XLA has no
kernel for the op (and reuses buffers itself): there the copying path.
"""

from __future__ import annotations

import tensorflow as tf

from tfgc.ops import _library


def _add_in_place(flat, indices, delta, copied):
    """`flat` + `delta` at `indices` in flat's buffer where every delta is
    finite (the bits of `copied()`, which runs otherwise)."""
    if _library.compiling_with_xla():
        return copied()
    return tf.cond(
        tf.reduce_all(tf.math.is_finite(delta)),
        lambda: tf.raw_ops.ScatterNdNonAliasingAdd(
            input=flat, indices=indices[:, None], updates=delta
        ),
        copied,
    )


def subtract_at(flat, indices, values):
    """`flat` with `values` subtracted at `indices` (distinct), and 0 at an
    index whose value is not finite."""
    flat = tf.convert_to_tensor(flat)
    values = tf.cast(values, flat.dtype)

    def copied():
        kept = tf.where(
            tf.math.is_finite(values),
            tf.gather(flat, indices) - values,
            tf.zeros_like(values),
        )
        return tf.tensor_scatter_nd_update(flat, indices[:, None], kept)

    return _add_in_place(flat, indices, -values, copied)


def zero_at(flat, indices):
    """`flat` with 0 at `indices` (distinct)."""
    flat = tf.convert_to_tensor(flat)
    old = tf.gather(flat, indices)

    def copied():
        return tf.tensor_scatter_nd_update(
            flat, indices[:, None], tf.zeros_like(old)
        )

    return _add_in_place(flat, indices, -old, copied)
