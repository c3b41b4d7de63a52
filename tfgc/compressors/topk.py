"""Top-k sparsification."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc import ops
from tfgc.compressors import _sparse, base


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
    """

    collective = base.ALL_GATHER
    #: Whether `compress_with_residual` pays off without the compiled ops.
    _fused_without_custom_ops = False

    def select(self, x, k, key, residual=None):
        """(values, indices[, new residual]) of the k entries to send."""
        del key
        return ops.top_k_abs(x, k, residual=residual)

    def compress(self, x, state, key):
        values, indices = self.select(x, self.num_selected(x.shape), key)
        payload = SparsePayload(values, indices)
        return payload, (x.shape, x.dtype, state)

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
        return payload, (x.shape, x.dtype, state), new_residual

    def decompress(self, reduced, ctx):
        shape, dtype, state = ctx
        return _sparse.dense_total(reduced, shape, dtype), state

    def local_estimate(self, payload, ctx):
        shape, dtype, _ = ctx
        return _sparse.dense_total(payload, shape, dtype)

    def payload_bytes(self, shape, dtype):
        k = self.num_selected(shape)
        return k * (tf.as_dtype(dtype).size + 4)
