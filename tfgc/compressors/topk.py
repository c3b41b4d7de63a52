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

    def compress(self, x, state, key):
        del key
        values, indices = ops.top_k_abs(x, self.num_selected(x.shape))
        payload = SparsePayload(values, indices)
        return payload, (x.shape, x.dtype, state)

    def compress_with_residual(self, x, residual, state, key):
        # The compiled op reads x and the residual once and zeroes what it
        # selects, where the generic path adds, selects, scatters and
        # subtracts. Without it nothing is gained: take the generic path.
        if not ops.using_custom_ops():
            return None
        del key
        values, indices, new_residual = ops.top_k_abs(
            x, self.num_selected(x.shape), residual=residual
        )
        payload = SparsePayload(values, indices)
        return payload, (x.shape, x.dtype, state), new_residual

    def decompress(self, reduced, ctx):
        shape, dtype, state = ctx
        n = base.num_elements(shape)
        dense = _sparse.scatter_sum(reduced.values, reduced.indices, n, dtype)
        return tf.reshape(dense, shape), state

    def local_estimate(self, payload, ctx):
        return self.decompress(payload, ctx)[0]

    def payload_bytes(self, shape, dtype):
        k = self.num_selected(shape)
        return k * (tf.as_dtype(dtype).size + 4)
