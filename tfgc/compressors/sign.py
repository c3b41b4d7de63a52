"""Sign compression with real bit packing: scaled (EF-SignSGD) or with
majority vote (signSGD)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgc import _arguments, ops
from tfgc.compressors import base
from tfgc.core.compressor import Compressor, TensorContext
from tfgc.core.wire import num_elements
from tfgc.ops.bits import num_words


class SignPayload(NamedTuple):
    bits: tf.Tensor  # [ceil(n / 32)] int32, bit set where x >= 0
    scale: tf.Tensor  # [1] float32; 1 (or NaN) under majority vote


@base.register
class SignSGD(Compressor):
    """Sends sign(x) at 1 bit per element, plus one scale per tensor.

    `scaled=True`: Karimireddy et al., "Error Feedback Fixes SignSGD and
    other Gradient Compression Schemes" (ICML 2019). Each worker's
    compressed tensor is (||x||_1 / n) * sign(x), error feedback keeps what
    it misses, and the result is the sum over workers of scale_i * sign_i.

    `scaled=False`: signSGD with majority vote, Bernstein, Zhao,
    Azizzadenesheli and Anandkumar, "signSGD with Majority Vote is
    Communication Efficient and Fault Tolerant" (ICLR 2019). The result is
    sign(sum over workers of sign_i), 0 where the votes tie: +-1 per
    element whatever the number of workers (the one exception to the
    contract's sum over workers). Under error feedback a worker's own
    contribution (`local_estimate`) is its own sign(x).

    Zero counts as positive. A tensor with a NaN or infinite entry makes
    the result non-finite, so that it reaches the optimizer: its scale is
    NaN or infinite (mean |x|), or NaN under majority vote, where the scale
    is otherwise 1.

    Signs differ between workers, so the payload is all-gathered and every
    worker's signs are unpacked and summed (with their scales) in one pass.
    Bytes on the wire per worker: 4 * ceil(n / 32) + 4.

    Args:
        scaled: send the mean absolute value with the signs and sum
            scale_i * sign_i (EF-SignSGD); False: majority vote.
    """

    def __init__(self, scaled: bool = True):
        self.scaled = _arguments.check_bool("scaled", scaled)

    def compress(self, x, state, key):
        del key
        flat = tf.reshape(x, [-1])
        if self.scaled:
            scale = tf.reduce_mean(tf.abs(tf.cast(flat, tf.float32)))
        else:  # 1, or NaN to carry a non-finite entry into the vote
            finite = tf.reduce_all(tf.math.is_finite(flat))
            scale = tf.where(finite, 1.0, np.nan)
        payload = SignPayload(ops.pack_bits(flat >= 0), tf.reshape(scale, [1]))
        return payload, TensorContext(x.shape, x.dtype, state)

    def _signed_sum(self, gathered, shape, dtype):
        """sum_i scale_i * sign_i over the gathered rows, in one pass."""
        total = ops.unpack_bits_sum(
            gathered.bits,
            tf.reshape(gathered.scale, [-1]),
            num_elements(shape),
        )
        return tf.reshape(tf.cast(total, dtype), shape)

    def decompress(self, reduced, ctx):
        total = self._signed_sum(reduced, ctx.shape, ctx.dtype)
        if not self.scaled:  # the sum of +-1 (or NaN) votes, exact in fp32
            total = tf.sign(total)
        return total, ctx.state

    def local_estimate(self, payload, ctx):
        # This worker's own scale * sign: under majority vote its own sign.
        own = tf.nest.map_structure(lambda t: t[None], payload)
        return self._signed_sum(own, ctx.shape, ctx.dtype)

    def payload_bytes(self, shape, dtype):
        del dtype
        return 4 * num_words(num_elements(shape)) + 4

    def get_config(self):
        return {"scaled": self.scaled}
