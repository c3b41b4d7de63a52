"""Importance-weighted pruning with one index set per step (ring all-reduce)."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc import _arguments, ops
from tfgc.compressors import _sparse, base
from tfgc.core.compressor import NoState, Spec
from tfgc.core.wire import ALL_REDUCE, BROADCAST, num_elements
from tfgc.ops.top_k_sample import slice_start_reference


class IndexPayload(NamedTuple):
    root: tf.Tensor  # int32 scalar: the sender (not sent)
    indices: tf.Tensor  # [k] int32: the positions, used from the root


class ValuePayload(NamedTuple):
    values: tf.Tensor  # [k] this worker's entries at the root's positions


class _Context(NamedTuple):
    shape: tf.TensorShape
    dtype: tf.DType
    flat: tf.Tensor  # this worker's input, flattened
    indices: tf.Tensor | None  # the root's positions, once known
    state: NoState


def root_worker(step: tf.Tensor, num_peers: int) -> tf.Tensor:
    """The root of a step, the same on every worker: uniform in [0, p).

    SplitMix64 of the step (the hash MSTopK's band slice uses), so a
    numpy reference can draw the same root.
    """
    return tf.cast(
        slice_start_reference(tf.cast(step, tf.int64), num_peers - 1),
        tf.int32,
    )


@base.register
class ImportancePruning(base.DensityCompressor):
    """Sends the entries that one worker finds most important, from all.

    Cheng and Xu, "Bandwidth Reduction using Importance Weighted Pruning on
    Ring AllReduce" (arXiv 1901.01544); docs/algorithms.md, section
    "Importance-weighted pruning", says what is reconstructed. With error
    feedback (the optimizer's default) each worker keeps acc = residual +
    g. Every step a root worker is drawn from the step (the same on every
    worker, no message); the root ranks its entries by importance
    |acc| / (|w| + epsilon), w the variable's value, and broadcasts its
    k = ceil(density * n) most important positions (measured cheaper than
    an all-reduce in which the others send zeros, or an all-gather:
    docs/algorithms.md). All workers then all-reduce their acc at those
    positions; what was sent leaves the residual. One index set per step:
    ring all-reduce compatible.

    Bytes on the wire per worker: k * 4 (positions, broadcast; on a ring
    every worker but one forwards them) + k * itemsize (values,
    all-reduced), in two dependent collectives.

    Args:
        density: fraction of entries sent (the paper's 1 / ratio), in (0, 1].
        epsilon: added to |w| so zero weights do not divide by zero.
    """

    spec = Spec(collectives=(BROADCAST, ALL_REDUCE), reads_step_info=True)

    def __init__(self, density: float = 0.01, epsilon: float = 1e-8):
        super().__init__(density)
        eps = _arguments.check_number("epsilon", epsilon, "a number > 0")
        if not eps > 0:
            raise ValueError(
                f"`epsilon` must be a number > 0. Received: epsilon={epsilon!r}"
            )
        self.epsilon = eps

    def compress(self, x, state, key, info=None):
        if info is None:
            raise ValueError(
                "ImportancePruning reads the variable's value (importance is "
                "|acc| / (|w| + epsilon)); use it through "
                "tfgc.CompressedOptimizer, which passes it."
            )
        flat = tf.reshape(x, [-1])
        w = tf.reshape(tf.cast(info.variable, tf.float32), [-1])
        importance = tf.abs(tf.cast(flat, tf.float32)) / (
            tf.abs(w) + self.epsilon
        )
        _, indices = ops.top_k_abs(importance, self.num_selected(x.shape))
        indices = tf.sort(indices)
        root = root_worker(key[1], info.num_peers)
        return IndexPayload(root, indices), _Context(
            x.shape, x.dtype, flat, None, state
        )

    def next_round(self, reduced, ctx):
        indices = reduced.indices  # the root's
        values = tf.gather(ctx.flat, indices)
        return ValuePayload(values), ctx._replace(indices=indices)

    def decompress(self, reduced, ctx):
        n = num_elements(ctx.shape)
        total = _sparse.scatter_sum(reduced.values, ctx.indices, n, ctx.dtype)
        return tf.reshape(total, ctx.shape), ctx.state

    def local_estimate(self, payload, ctx):
        return self.decompress(payload, ctx)[0]

    def payload_bytes(self, shape, dtype):
        return self.num_selected(shape) * (4 + tf.as_dtype(dtype).size)

    def get_config(self):
        return {"density": self.density, "epsilon": self.epsilon}
