"""Shared helpers for compressors that send (values, indices) pairs."""

import numpy as np
import tensorflow as tf

from tfgc import ops
from tfgc.ops import scatter


def selection_seed(key: tf.Tensor) -> tf.Tensor:
    """One int64 seed from a (2,) stateless key: key[0] ^ (key[1] << 32).

    `tfgc.ops.top_k_sample` hashes it (SplitMix64), so nearby keys give
    unrelated choices.
    """
    key = tf.cast(key, tf.int64)
    return tf.bitwise.bitwise_xor(
        key[0], tf.bitwise.left_shift(key[1], tf.constant(32, tf.int64))
    )


def scatter_sum(values, indices, n, dtype):
    """Dense vector of length n with `values` added at `indices`.

    `values` and `indices` may carry a leading workers axis (ragged for
    payloads of unequal size); entries that several workers (or one
    worker twice) sent add up.

    float32, float16 and bfloat16 values with int32 indices go through
    `tfgc.ops.scatter_add_sum` (float32 accumulation, one rounding; the
    compiled `Tfgc>ScatterAddSum` when loaded). Measured on 2 cores
    (`benchmarks/results/scatter_cpu.md`, P = 2..8 workers, density 0.1 %
    and 1 %): at 25 M elements the fastest TF op (`unsorted_segment_sum`,
    `tensor_scatter_nd_add` or `scatter_nd`) took 3.3x to 32x the time of
    zero-filling the output, the compiled op 1.1x to 2.2x (1.0x to 5.2x and
    0.5x to 1.6x at 1 M, where eager dispatch is much of it). Other dtypes
    use `tfgc.ops.scatter.ordered_segment_sum`. Either way, outside XLA,
    each element's values add up in input order (worker order): the same
    bits on every worker, with or without a GPU.
    """
    if isinstance(values, tf.RaggedTensor):
        values, indices = values.flat_values, indices.flat_values
    flat_values = tf.reshape(values, [-1])
    flat_indices = tf.reshape(indices, [-1])
    if (
        flat_values.dtype in scatter.FLOAT_DTYPES
        and flat_indices.dtype == tf.int32
    ):
        dense = ops.scatter_add_sum(flat_values, flat_indices, n)
    else:
        dense = scatter.ordered_segment_sum(flat_values, flat_indices, n)
    return tf.cast(dense, dtype)


def dense_total(pairs, shape, dtype) -> tf.Tensor:
    """The dense tensor of `shape` that (values, indices) pairs add up to.

    `pairs` has `values` and `indices` fields (one worker's, or every
    worker's stacked or ragged).
    """
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    dense = scatter_sum(pairs.values, pairs.indices, n, dtype)
    return tf.reshape(dense, shape)
