"""`tfgc.ops.index_shuffle`: TensorFlow's permutation, also under XLA."""

import numpy as np
import pytest
import tensorflow as tf

from tfgc import ops
from tfgc.ops import shuffle

# Small domains (a 16-bit block walked by pointer doubling), 2^16 and 2^20
# (a block one bit short, as TensorFlow's), and blocks of 18 and 22 bits.
MAX_INDICES = [0, 1, 9, 1000, 2**16, 2**16 + 1, 70_000, 2**20, 3_000_000]


@pytest.mark.parametrize("max_index", MAX_INDICES)
def test_reference_equals_tensorflow(max_index):
    rng = np.random.default_rng(max_index)
    index = tf.range(min(max_index + 1, 500), dtype=tf.int64)
    for seed in ([0, 0], [-1, 2**40 + 3], rng.integers(-(2**62), 2**62, 2)):
        seed = tf.constant(seed, tf.int64)
        want = tf.random.experimental.index_shuffle(index, seed, max_index)
        got = shuffle.index_shuffle_reference(index, seed, max_index)
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_reference_keeps_tensorflows_short_block():
    """For max_index = 2^16 TensorFlow reads index 2^16 as 0."""
    index = tf.constant([0, 2**16], tf.int64)
    seed = tf.constant([3, 4], tf.int64)
    want = tf.random.experimental.index_shuffle(index, seed, 2**16)
    got = shuffle.index_shuffle_reference(index, seed, 2**16)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert got[0] == got[1]


def test_under_xla_equals_tensorflow_and_is_a_permutation():
    seed = tf.constant([12, -7], tf.int64)
    compiled = tf.function(
        lambda s: ops.index_shuffle(tf.range(50, dtype=tf.int32), s, 49),
        jit_compile=True,
    )
    got = compiled(seed).numpy()
    want = tf.random.experimental.index_shuffle(tf.range(50), seed, 49)
    np.testing.assert_array_equal(got, want.numpy())
    assert sorted(got.tolist()) == list(range(50))
    assert got.dtype == np.int32


def test_bad_max_index_raises():
    index = tf.range(3)
    with pytest.raises(ValueError, match="max_index"):
        ops.index_shuffle(index, [1, 2], -1)
    with pytest.raises(TypeError, match="int32 or int64"):
        ops.index_shuffle(tf.range(3.0), [1, 2], 5)
