"""Top-k sparsification."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc import _arguments, ops
from tfgc.compressors import _sparse, base
from tfgc.core.compressor import TensorContext
from tfgc.core.wire import num_elements


class SparsePayload(NamedTuple):
    values: tf.Tensor  # [k], the gradient's dtype
    indices: tf.Tensor  # [k] int32 positions in the flattened tensor


@base.register
class TopK(base.DensityCompressor):
    """Sends the k = ceil(density * n) entries of largest magnitude.

    Aji and Heafield, "Sparse Communication for Distributed Gradient
    Descent" (EMNLP 2017); with error feedback as in Stich et al.,
    "Sparsified SGD with Memory" (NeurIPS 2018). Exact selection
    (`tfgc.ops.top_k_abs`: the compiled trimmed top-k when the custom ops
    are loaded, `tf.math.top_k` over |x| otherwise). Under `ErrorFeedback`
    with the compiled ops, selection and residual update are one fused op.

    Indices differ between workers, so the payload is all-gathered and
    scatter-added. Bytes on the wire per worker: k * (itemsize + 4).

    Args:
        density: fraction of entries to send, in (0, 1].
        batch_selection: select in every tensor of a bucket with one
            segmented op (`tfgc.ops.top_k_sample_segments`; the same
            selection bit for bit). None (default): where the compiled ops
            run on a GPU, which then launches a dozen kernels for all
            tensors instead of a dozen per tensor. True: whenever the
            compiled ops are loaded (on the CPU it only saves op dispatch
            and copies the gradients into one buffer). False: never.
    """

    #: Whether `compress_with_residual` pays off without the compiled ops.
    _fused_without_custom_ops = False
    #: The `tfgc.ops.top_k_sample` mode that `select` runs when compiled,
    #: and its bisection rounds (trimmed mode has none).
    _selection_mode = "trimmed"
    bisection_rounds = 20

    def __init__(self, density: float = 0.01, batch_selection=None):
        super().__init__(density)
        self.batch_selection = _arguments.check_bool(
            "batch_selection", batch_selection, allow_none=True
        )

    def select(self, x, k, key, residual=None):
        """(values, indices[, new residual]) of the k entries to send."""
        del key
        return ops.top_k_abs(x, k, residual=residual)

    def _selection_seed(self, key):
        """The seed `select` gives `tfgc.ops.top_k_sample` for this key."""
        del key  # exact top-k: nothing random
        return tf.constant(0, tf.int64)

    def compress(self, x, state, key):
        values, indices = self.select(x, self.num_selected(x.shape), key)
        payload = SparsePayload(values, indices)
        return payload, TensorContext(x.shape, x.dtype, state)

    def compress_with_residual(self, x, residual, state, key):
        # The compiled op reads x and the residual once and zeroes what it
        # selects, where the generic path adds, selects, scatters and
        # subtracts. Without it nothing is gained: take the generic path.
        if not (self._fused_without_custom_ops or ops.using_custom_ops()):
            return None
        values, indices, new_residual = self.select(
            x, self.num_selected(x.shape), key, residual=residual
        )
        payload = SparsePayload(values, indices)
        return payload, TensorContext(x.shape, x.dtype, state), new_residual

    def compress_batch(self, xs, states, keys, residuals=None):
        batch = self.batch_selection
        if batch is None:
            batch = ops.selects_segments_on_gpu()
        if (
            not batch
            or not ops.using_custom_ops()
            or xs[0].dtype not in base.SELECTION_DTYPES
        ):
            return None
        sizes = [num_elements(x.shape) for x in xs]
        ks = [self.num_selected(x.shape) for x in xs]
        flat = tf.concat([tf.reshape(x, [-1]) for x in xs], 0)
        residual = None
        if residuals is not None:
            residual = tf.concat([tf.reshape(r, [-1]) for r in residuals], 0)
        selection = ops.top_k_sample_segments(
            flat,
            tf.constant(ks, tf.int64),
            tf.stack([self._selection_seed(key) for key in keys]),
            sizes,
            mode=self._selection_mode,
            rounds=self.bisection_rounds,
            residual=residual,
        )
        values = tf.split(selection.values, ks)
        indices = tf.split(selection.indices, ks)
        out = [
            (SparsePayload(v, i), TensorContext(x.shape, x.dtype, state))
            for v, i, x, state in zip(values, indices, xs, states)
        ]
        if residual is None:
            return out
        new_residuals = tf.split(selection.new_residual, sizes)
        return [
            (payload, ctx, tf.reshape(r, tf.shape(x)))
            for (payload, ctx), r, x in zip(out, new_residuals, xs)
        ]

    def decompress(self, reduced, ctx):
        total = _sparse.dense_total(reduced, ctx.shape, ctx.dtype)
        return total, ctx.state

    def local_estimate(self, payload, ctx):
        return _sparse.dense_total(payload, ctx.shape, ctx.dtype)

    def payload_bytes(self, shape, dtype):
        k = self.num_selected(shape)
        return k * (tf.as_dtype(dtype).size + 4)

    def get_config(self):
        config = super().get_config()
        if self.batch_selection is not None:
            config["batch_selection"] = self.batch_selection
        return config
