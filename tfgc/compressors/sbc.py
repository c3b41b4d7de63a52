"""Sparse Binary Compression: one sign, one value, Golomb-coded positions."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc import _arguments, ops
from tfgc.compressors import _sparse, base
from tfgc.core.compressor import NoState, Spec
from tfgc.core.wire import ALL_GATHER_RAGGED, num_elements


class SBCPayload(NamedTuple):
    values: tf.Tensor  # [1] the kept side's mean, signed; [count] unbinarized
    count: tf.Tensor  # [1] int32, the number of positions
    positions: tf.Tensor  # [bytes] uint8, Golomb-Rice coded gaps


class _Context(NamedTuple):
    shape: tf.TensorShape
    dtype: tf.DType
    indices: tf.Tensor  # this worker's positions, increasing
    values: tf.Tensor  # the value sent at each of them
    state: NoState


@base.register
class SBC(base.DensityCompressor):
    """Sparse Binary Compression of weight updates.

    Sattler, Wiedemann, Mueller and Samek, "Sparse Binary Compression:
    Towards Distributed Deep Learning with minimal Communication" (IJCNN
    2019, arXiv 1805.08768); docs/algorithms.md, section "SBC", says what is
    reconstructed.

    SBC compresses the change of the weights over `delay` local steps, not
    a gradient: the optimizer lets every worker take `delay` steps of the
    inner optimizer on its own weights, then sends the compressed update
    (plus the residual, with error feedback) and every worker continues
    from the round-start weights plus the mean of the updates.

    Per tensor, of the update A: the k = ceil(density * n) largest positive
    entries and the k most negative ones; the side with the larger mean
    magnitude is kept, and every kept position carries that mean (with its
    sign). One float and the positions travel, the positions as
    Golomb-Rice coded gaps (`tfgc.ops.golomb_encode`, parameter b* of the
    paper for k of n). With `binarize=False` the k largest |A| are sent
    with their values (sparse top-k with coded positions). Payloads differ
    in size between workers.

    Bytes on the wire per worker and round: 4 (value) + 4 (count) + the
    coded positions, about k b* + k / (1 - (1 - k/n)^(2^b*)) bits (8.1 bits
    a position at density 1 %, 11.5 at 0.1 %); + 4 per position with
    `binarize=False`.

    Args:
        density: fraction of entries per side, in (0, 1].
        delay: local steps per communication round, >= 1.
        binarize: keep one sign with one magnitude (the paper's SBC).
    """

    def __init__(
        self, density: float = 0.01, delay: int = 1, binarize: bool = True
    ):
        super().__init__(density)
        self.delay = base.check_positive_int("delay", delay)
        self.binarize = _arguments.check_bool("binarize", binarize)

    @property
    def spec(self) -> Spec:
        return Spec(
            collectives=(ALL_GATHER_RAGGED,),
            compresses_updates=True,
            delay=self.delay,
        )

    def _golomb_b(self, shape) -> int:
        n = num_elements(shape)
        return ops.golomb_optimal_b(self.num_selected(shape), n)

    def _select(self, flat, k):
        """(indices, sent): the positions sent, increasing, and the values
        that travel: one (the kept side's signed mean) or one a position."""
        if not self.binarize:
            values, indices = ops.top_k_abs(flat, k)
            order = tf.argsort(indices)
            return tf.gather(indices, order), tf.gather(values, order)
        # The k largest positive entries and the k most negative ones (NaN
        # on both sides, as the largest magnitude), in one pass.
        pos_values, pos_indices, neg_values, neg_indices = ops.top_k_two_sided(
            flat, k
        )

        def mean(v):
            count = tf.maximum(tf.size(v), 1)
            return tf.reduce_sum(v) / tf.cast(count, v.dtype)

        pos_mean, neg_mean = mean(pos_values), mean(neg_values)
        positive = pos_mean >= neg_mean
        mu = tf.where(positive, pos_mean, -neg_mean)
        # The kept side's indices, sliced out of both sides one after the
        # other (a tf.cond would add a function per tensor).
        both = tf.concat([pos_indices, neg_indices], 0)
        pos_count = tf.size(pos_indices)
        start = tf.where(positive, 0, pos_count)
        length = tf.where(positive, pos_count, tf.size(neg_indices))
        return both[start : start + length], mu[None]

    def compress(self, x, state, key):
        del key
        flat = tf.reshape(x, [-1])
        n = num_elements(x.shape)
        indices, sent = self._select(flat, self.num_selected(x.shape))
        # The values travel in float32: the local estimate takes them as
        # sent, so that error feedback keeps what float64 rounding lost.
        sent = tf.cast(sent, tf.float32)
        values = tf.cast(sent, x.dtype)
        if self.binarize:  # the one value sent, at every position
            values = tf.fill(tf.shape(indices), values[0])
        positions, _ = ops.golomb_encode(indices, n, self._golomb_b(x.shape))
        count = tf.size(indices, out_type=tf.int32)[None]
        payload = SBCPayload(sent, count, positions)
        return payload, _Context(x.shape, x.dtype, indices, values, state)

    def compress_with_residual(self, x, residual, state, key):
        # Only the k sent positions change: acc minus the value sent there
        # (0 where that value is not finite), written into acc's own buffer
        # where the generic path scatters the local estimate over a dense
        # tensor of zeros, subtracts it everywhere and tests every entry.
        acc = x + residual
        payload, ctx = self.compress(acc, state, key)
        new_residual = ops.subtract_at(
            tf.reshape(acc, [-1]), ctx.indices, ctx.values
        )
        return payload, ctx, tf.reshape(new_residual, x.shape)

    def decompress(self, reduced, ctx):
        n = num_elements(ctx.shape)
        b = self._golomb_b(ctx.shape)
        workers = reduced.count.shape[0]
        if workers is None:
            raise ValueError("SBC needs the number of workers while tracing.")
        # The rows are read through their splits: indexing a RaggedTensor
        # row by row costs dozens of ops, and a bucket holds many tensors.
        counts = tf.unstack(reduced.count.flat_values, num=workers)
        coded = tf.split(
            reduced.positions.flat_values,
            reduced.positions.row_lengths(),
            num=workers,
        )
        indices = [
            ops.golomb_decode(coded[w], counts[w], b, n) for w in range(workers)
        ]
        if self.binarize:  # one value from every worker
            means = tf.unstack(reduced.values.flat_values, num=workers)
            values = tf.concat(
                [tf.fill([counts[w]], means[w]) for w in range(workers)], 0
            )
        else:
            values = reduced.values.flat_values
        total = _sparse.scatter_sum(values, tf.concat(indices, 0), n, ctx.dtype)
        return tf.reshape(total, ctx.shape), ctx.state

    def local_estimate(self, payload, ctx):
        n = num_elements(ctx.shape)
        sent = _sparse.scatter_sum(ctx.values, ctx.indices, n, ctx.dtype)
        return tf.reshape(sent, ctx.shape)

    def xla_unsupported(self):
        return (
            "SBC sends Golomb-Rice coded positions, whose length depends on "
            "the data"
        )

    def payload_bytes(self, shape, dtype):
        del dtype
        n = num_elements(shape)
        k = self.num_selected(shape)
        coded = ops.golomb_max_encoded_bytes(k, n, self._golomb_b(shape))
        return 8 + coded + (0 if self.binarize else 4 * (k - 1))

    def get_config(self):
        return {
            "density": self.density,
            "delay": self.delay,
            "binarize": self.binarize,
        }
