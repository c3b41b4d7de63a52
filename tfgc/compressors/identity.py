"""Dense transmission and plain casts to 16-bit floats."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc.compressors import base


class DensePayload(NamedTuple):
    values: tf.Tensor


@base.register
class Identity(base.Compressor):
    """Sends the tensor as it is, through a (fused) all-reduce.

    Bytes on the wire per worker: n * itemsize (before the all-reduce's own
    2(p-1)/p ring factor).
    """

    collective = base.ALL_REDUCE

    def compress(self, x, state, key):
        del key
        return DensePayload(x), state

    def decompress(self, reduced, ctx):
        return reduced.values, ctx

    def local_estimate(self, payload, ctx):
        return payload.values

    def payload_bytes(self, shape, dtype):
        return base.num_elements(shape) * tf.as_dtype(dtype).size


class _Cast(base.Compressor):
    """Casts to a 16-bit float for the wire and back (linear: all-reduce).

    Bytes on the wire per worker: 2 * n. The sum over workers is taken in the
    16-bit type, as Horovod's fp16 compression does.
    """

    collective = base.ALL_REDUCE
    wire_dtype: tf.DType

    def compress(self, x, state, key):
        del key
        return DensePayload(tf.cast(x, self.wire_dtype)), (x.dtype, state)

    def decompress(self, reduced, ctx):
        dtype, state = ctx
        return tf.cast(reduced.values, dtype), state

    def local_estimate(self, payload, ctx):
        return tf.cast(payload.values, ctx[0])

    def payload_bytes(self, shape, dtype):
        del dtype
        return base.num_elements(shape) * self.wire_dtype.size


@base.register
class FP16(_Cast):
    __doc__ = _Cast.__doc__.replace("a 16-bit float", "float16")
    wire_dtype = tf.float16


@base.register
class BF16(_Cast):
    __doc__ = _Cast.__doc__.replace("a 16-bit float", "bfloat16")
    wire_dtype = tf.bfloat16
