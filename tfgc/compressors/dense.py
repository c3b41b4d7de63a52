"""The dense codecs: the tensor as it is, or cast to a 16-bit float.

`Identity` also sends what a compressor declines (small tensors), and
`DenseWarmup` sends every tensor in a compressor's warm-up steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
import tensorflow as tf

from tfgc.compressors import base
from tfgc.core.compressor import Compressor, Spec
from tfgc.core.wire import ALL_REDUCE, num_elements


class DensePayload(NamedTuple):
    values: tf.Tensor


class DenseContext(NamedTuple):
    dtype: tf.DType  # the tensor's, which the sum is returned in
    state: Any  # passed through unchanged


@base.register
class Identity(Compressor):
    """Sends the tensor as it is, through a (fused) all-reduce.

    Bytes on the wire per worker: n * itemsize (before the all-reduce's own
    2(p-1)/p ring factor).
    """

    spec = Spec(collectives=(ALL_REDUCE,))

    def compress(self, x, state, key):
        del key
        return DensePayload(x), DenseContext(x.dtype, state)

    def decompress(self, reduced, ctx):
        return reduced.values, ctx.state

    def local_estimate(self, payload, ctx):
        return payload.values

    def payload_bytes(self, shape, dtype):
        return num_elements(shape) * tf.as_dtype(dtype).size


@base.register
class DenseWarmup(Identity):
    """Sends a tensor dense on behalf of a compressor, keeping its state.

    The warm-up steps of a compressor with `spec.warmup_steps` use it: the
    tensor is summed exactly (all-reduce) and the wrapped compressor's
    state (residual, factors) passes through unchanged.

    Args:
        compressor: the compressor whose state is kept.
    """

    def __init__(self, compressor: Compressor):
        self.compressor = compressor

    def init_state(self, shape, dtype, key):
        return self.compressor.init_state(shape, dtype, key)

    def get_config(self):
        return {
            "compressor": keras.saving.serialize_keras_object(self.compressor)
        }

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["compressor"]))


class _Cast(Compressor):
    """Casts to a 16-bit float for the wire and back (linear: all-reduce).

    Bytes on the wire per worker: 2 * n. The sum over workers is taken in the
    16-bit type, as Horovod's fp16 compression does.
    """

    spec = Spec(collectives=(ALL_REDUCE,))
    wire_dtype: tf.DType

    def compress(self, x, state, key):
        del key
        payload = DensePayload(tf.cast(x, self.wire_dtype))
        return payload, DenseContext(x.dtype, state)

    def decompress(self, reduced, ctx):
        return tf.cast(reduced.values, ctx.dtype), ctx.state

    def local_estimate(self, payload, ctx):
        return tf.cast(payload.values, ctx.dtype)

    def payload_bytes(self, shape, dtype):
        del dtype
        return num_elements(shape) * self.wire_dtype.size


@base.register
class FP16(_Cast):
    __doc__ = _Cast.__doc__.replace("a 16-bit float", "float16")
    wire_dtype = tf.float16


@base.register
class BF16(_Cast):
    __doc__ = _Cast.__doc__.replace("a 16-bit float", "bfloat16")
    wire_dtype = tf.bfloat16
