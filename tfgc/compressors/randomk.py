"""Random-k sparsification with indices shared by all workers."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc import ops
from tfgc.compressors import _sparse, base
from tfgc.core.compressor import NoState, Spec
from tfgc.core.wire import ALL_REDUCE, num_elements


class RandomKPayload(NamedTuple):
    values: tf.Tensor  # [k], the gradient's dtype


class RandomKContext(NamedTuple):
    shape: tf.TensorShape
    dtype: tf.DType
    indices: tf.Tensor  # [k] int32: the positions every worker sent
    state: NoState


@base.register
class RandomK(base.DensityCompressor):
    """Sends k = ceil(density * n) entries at positions drawn at random.

    Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory" (NeurIPS 2018).
    Every worker draws the same k distinct positions from the shared
    per-step key (`tfgc.ops.index_shuffle`, TensorFlow's stateless index
    shuffle, also under XLA), so only values travel and they are
    all-reduced. Values are not rescaled by n/k: with error
    feedback the unsent part stays in the residual instead.

    Bytes on the wire per worker: k * itemsize.

    Args:
        density: fraction of entries to send, in (0, 1].
    """

    spec = Spec(collectives=(ALL_REDUCE,))

    def indices(self, n, key):
        """The k positions all workers use for this tensor and step."""
        k = self.num_selected((n,))
        if k == 0:  # an empty tensor: no position to draw from
            return tf.zeros([0], tf.int32)
        positions = ops.index_shuffle(
            tf.range(k, dtype=tf.int64), tf.cast(key, tf.int64), n - 1
        )
        return tf.cast(positions, tf.int32)

    def compress(self, x, state, key):
        flat = tf.reshape(x, [-1])
        indices = self.indices(flat.shape[0], key)
        payload = RandomKPayload(tf.gather(flat, indices))
        return payload, RandomKContext(x.shape, x.dtype, indices, state)

    def decompress(self, reduced, ctx):
        n = num_elements(ctx.shape)
        dense = _sparse.scatter_sum(reduced.values, ctx.indices, n, ctx.dtype)
        return tf.reshape(dense, ctx.shape), ctx.state

    def local_estimate(self, payload, ctx):
        return self.decompress(payload, ctx)[0]

    def payload_bytes(self, shape, dtype):
        return self.num_selected(shape) * tf.as_dtype(dtype).size
