"""Shared helpers for compressors that send (values, indices) pairs."""

import tensorflow as tf


def scatter_sum(values, indices, n, dtype):
    """Dense vector of length n with `values` added at `indices`.

    `values` and `indices` may carry a leading workers axis; entries that
    several workers (or one worker twice) sent add up.
    """
    flat_values = tf.reshape(values, [-1])
    flat_indices = tf.reshape(indices, [-1])
    dense = tf.math.unsorted_segment_sum(flat_values, flat_indices, n)
    return tf.cast(dense, dtype)
