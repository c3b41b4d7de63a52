"""Tests of tfgc.ops.new_residual: custom op vs reference, bit for bit."""

import numpy as np
import pytest
import tensorflow as tf

import tfgc.ops
from tfgc.ops import residual

FLOATS = [tf.float32, tf.float16, tf.bfloat16]
# The CPU kernel works in blocks of 2^16 elements: sizes around the edges.
SIZES = [0, 1, 7, 65535, 65536, 65537, 300_001]
BITS = {tf.float32: tf.int32, tf.float16: tf.int16, tf.bfloat16: tf.int16}


def inputs(n, dtype, seed=0):
    """corrected, sent with every special case up front: non-finite on
    either side, subnormal operands and differences, values near the top
    of the range."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal(n).astype(np.float32)
    s = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** (
        rng.integers(-130, 12, n)
    )
    tiny = np.float32(2.0**-126)
    special = [
        (np.inf, 1.0),  # kept: inf - 1
        (1.0, np.inf),  # zeroed
        (1.0, -np.inf),  # zeroed
        (np.nan, 1.0),  # kept: NaN
        (1.0, np.nan),  # zeroed
        (np.inf, np.inf),  # zeroed, not NaN
        (1e-39, 0.0),  # a subnormal operand
        (tiny, 1.5 * tiny / 2),  # a subnormal difference
        (-3e38, 3e38),  # overflows to -inf: kept
        (0.0, 0.0),
    ]
    m = min(n, len(special))
    c[:m] = [a for a, _ in special[:m]]
    s[:m] = [b for _, b in special[:m]]
    return tf.cast(c, dtype), tf.cast(s, dtype)


def bits(x):
    return tf.bitcast(x, BITS[x.dtype]).numpy()


def assert_same(got, want):
    """Bit for bit, but a NaN may carry another payload."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(tf.cast(want, tf.float32).numpy())
    np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan])
    assert np.isnan(tf.cast(got, tf.float32).numpy()[nan]).all()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", SIZES)
def test_custom_op_matches_reference_bit_for_bit(custom_lib, dtype, n):
    # The library in use has the op (else the reference would run twice).
    assert hasattr(custom_lib, "tfgc_new_residual")
    corrected, sent = inputs(n, dtype, seed=n)
    assert_same(
        residual.new_residual(corrected, sent),
        residual.new_residual_reference(corrected, sent),
    )


def test_semantics(backend):
    corrected = tf.constant([5.0, np.inf, 1.0, 1.0, np.nan, 2.0])
    sent = tf.constant([2.0, 1.0, np.inf, np.nan, 1.0, -np.inf])
    got = tfgc.ops.new_residual(corrected, sent).numpy()
    assert got[0] == 3.0 and got[1] == np.inf and np.isnan(got[4])
    # Zeroed where `sent` is not finite: +0, never -0 or NaN.
    np.testing.assert_array_equal(bits(tf.constant(got[[2, 3, 5]])), 0)


def test_keeps_shape_in_and_out_of_tf_function(backend):
    corrected = tf.reshape(tf.range(12.0), [3, 4])
    eager = tfgc.ops.new_residual(corrected, corrected * 0.25)
    traced = tf.function(tfgc.ops.new_residual)(corrected, corrected * 0.25)
    assert eager.shape == traced.shape == [3, 4]
    np.testing.assert_array_equal(eager, corrected * 0.75)
    np.testing.assert_array_equal(traced, eager)


def test_reads_its_input_after_writing_in_place(custom_lib):
    # The output may take the buffer of `corrected` (nothing else reads
    # x + 1 here); every element is still read before it is written.
    x = tf.random.normal([200_003], seed=1)
    sent = tf.random.normal([200_003], seed=2)

    @tf.function
    def step(x, sent):
        return tfgc.ops.new_residual(x + 1.0, sent)

    np.testing.assert_array_equal(step(x, sent), (x + 1.0) - sent)


def test_other_float_dtypes_take_the_reference(custom_lib):
    corrected = tf.constant([1.0, 2.0], tf.float64)
    sent = tf.constant([0.5, np.inf], tf.float64)
    np.testing.assert_array_equal(
        tfgc.ops.new_residual(corrected, sent), [0.5, 0.0]
    )


def test_mismatched_inputs_are_refused(backend):
    with pytest.raises(TypeError, match="same dtype"):
        tfgc.ops.new_residual(tf.zeros([2]), tf.zeros([2], tf.float16))
    with pytest.raises(ValueError, match=r"same shape.*\(3,\).*\(4,\)"):
        tfgc.ops.new_residual(tf.zeros([3]), tf.zeros([4]))


def test_kernel_refuses_shapes_known_only_at_run_time(custom_lib):
    op = tf.function(
        tfgc.ops.new_residual,
        input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None])],
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"corrected.shape=\[3\], sent.shape=\[4\]",
    ):
        op(tf.zeros([3]), tf.zeros([4]))
