"""Tests of tfgc.ops bit packing: custom op vs pure-TF reference vs numpy."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgc.ops
from tfgc.ops import bits

SIZES = [0, 1, 2, 31, 32, 33, 63, 64, 65, 1000, 65535, 65536, 65537, 300001]
FLOATS = [tf.float32, tf.float16, tf.bfloat16]


def np_pack(mask: np.ndarray) -> np.ndarray:
    """numpy oracle: little bit order, little-endian 32-bit words."""
    flat = np.asarray(mask, bool).reshape(-1)
    padded = np.zeros(bits.num_words(flat.size) * 32, bool)
    padded[: flat.size] = flat
    packed = np.packbits(padded, bitorder="little")
    return packed.view("<u4").astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("n", SIZES)
def test_pack_matches_numpy_and_reference(backend, n):
    del backend
    mask = np.random.default_rng(n).random(n) < 0.5
    got = tfgc.ops.pack_bits(tf.constant(mask))
    assert got.dtype == tf.int32 and got.shape == [bits.num_words(n)]
    np.testing.assert_array_equal(got.numpy(), np_pack(mask))
    want = bits.pack_bits_reference(tf.constant(mask))
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("n", SIZES)
def test_unpack_round_trip(backend, n):
    del backend
    mask = np.random.default_rng(n + 1).random([3, n]) < 0.5
    words = np.stack([np_pack(row) for row in mask])
    got = tfgc.ops.unpack_bits(tf.constant(words), n)
    assert got.dtype == tf.bool and got.shape == [3, n]
    np.testing.assert_array_equal(got.numpy(), mask)
    one = tfgc.ops.unpack_bits(tfgc.ops.pack_bits(tf.constant(mask[0])), n)
    np.testing.assert_array_equal(one.numpy(), mask[0])


def test_pack_multidimensional_and_all_ones(backend):
    del backend
    mask = np.ones([5, 7, 3], bool)
    got = tfgc.ops.pack_bits(tf.constant(mask)).numpy()
    np.testing.assert_array_equal(got, np_pack(mask))
    assert got[0] == -1  # all 32 bits set


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [0, 1, 33, 1000, 100003])
@pytest.mark.parametrize("p", [1, 2, 5])
def test_unpack_sum_and_vote(backend, dtype, n, p):
    del backend
    rng = np.random.default_rng(n + p)
    mask = rng.random([p, n]) < 0.5
    scales = rng.random(p).astype(np.float32) + 0.5
    words = tf.constant(np.stack([np_pack(row) for row in mask]))
    signs = np.where(mask, 1.0, -1.0).astype(np.float32)
    scales_t = tf.cast(scales, dtype)
    got = tfgc.ops.unpack_bits_sum(words, scales_t, n)
    assert got.dtype == dtype and got.shape == [n]
    want = (scales_t.numpy().astype(np.float32)[:, None] * signs).sum(0)
    tol = 1e-6 if dtype == tf.float32 else 2e-2
    np.testing.assert_allclose(
        got.numpy().astype(np.float32), want, rtol=tol, atol=tol
    )
    ref = bits.unpack_bits_sum_reference(words, scales_t, n)
    np.testing.assert_allclose(
        got.numpy().astype(np.float32),
        ref.numpy().astype(np.float32),
        rtol=tol,
        atol=tol,
    )
    vote = tfgc.ops.unpack_bits_vote(words, n, dtype)
    assert vote.dtype == dtype
    want_vote = np.where(signs.sum(0) >= 0, 1.0, -1.0)
    np.testing.assert_array_equal(vote.numpy().astype(np.float32), want_vote)


def test_vote_tie_is_plus_one(backend):
    del backend
    words = tf.constant([[0], [-1]], tf.int32)  # one row all 0, one all 1
    vote = tfgc.ops.unpack_bits_vote(words, 32)
    np.testing.assert_array_equal(vote.numpy(), np.ones(32))


def test_bad_inputs_raise(backend):
    del backend
    with pytest.raises(TypeError, match="boolean"):
        tfgc.ops.pack_bits(tf.ones([4]))
    with pytest.raises(TypeError, match="int32"):
        tfgc.ops.unpack_bits(tf.ones([1], tf.int64), 3)
    with pytest.raises(ValueError, match="ceil"):
        tfgc.ops.unpack_bits(tf.ones([2], tf.int32), 3)
    with pytest.raises(ValueError, match="matrix"):
        tfgc.ops.unpack_bits_sum(tf.ones([1], tf.int32), tf.ones([1]), 3)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        tfgc.ops.unpack_bits_sum(tf.ones([2, 1], tf.int32), tf.ones([3]), 3)


def test_kernels_validate_dynamic_shapes(custom_lib):
    """Shapes unknown when tracing are checked by the kernels themselves."""

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int32)])
    def unpack(words):
        return custom_lib.tfgc_unpack_bits(words, n=40)

    with pytest.raises(tf.errors.InvalidArgumentError, match="ceil"):
        unpack(tf.ones([3], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="rank"):
        unpack(tf.constant(1))

    @tf.function(
        input_signature=[
            tf.TensorSpec(None, tf.int32),
            tf.TensorSpec(None, tf.float32),
        ]
    )
    def unpack_sum(words, scales):
        return custom_lib.tfgc_unpack_bits_sum(words, scales, n=40)

    with pytest.raises(tf.errors.InvalidArgumentError, match="scales"):
        unpack_sum(tf.ones([2, 2], tf.int32), tf.ones([3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="matrix"):
        unpack_sum(tf.ones([2], tf.int32), tf.ones([2]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        custom_lib.tfgc_unpack_bits_vote(tf.ones([2, 3], tf.int32), n=40)


def test_shape_inference(custom_lib):
    @tf.function
    def f(mask, words):
        w = custom_lib.tfgc_pack_bits(mask)
        assert w.shape.as_list() == [4]
        u = custom_lib.tfgc_unpack_bits(words, n=100)
        assert u.shape.as_list() == [6, 100]
        s = custom_lib.tfgc_unpack_bits_sum(words, tf.ones([6]), n=100)
        assert s.shape.as_list() == [100]
        return w, u, s

    f(tf.zeros([10, 10], tf.bool), tf.zeros([6, 4], tf.int32))


def test_pack_unpack_in_tf_function(backend):
    del backend

    @tf.function
    def round_trip(x):
        return tfgc.ops.unpack_bits(tfgc.ops.pack_bits(x >= 0), 77)

    x = tf.random.stateless_normal([77], [1, 2])
    np.testing.assert_array_equal(round_trip(x).numpy(), x.numpy() >= 0)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    shape=st.lists(st.integers(0, 70), min_size=1, max_size=3),
    data_seed=st.integers(0, 2**32 - 1),
)
def test_property_round_trip(backend, shape, data_seed):
    del backend
    mask = np.random.default_rng(data_seed).random(shape) < 0.5
    words = tfgc.ops.pack_bits(tf.constant(mask))
    np.testing.assert_array_equal(words.numpy(), np_pack(mask))
    back = tfgc.ops.unpack_bits(words, mask.size)
    np.testing.assert_array_equal(back.numpy(), mask.reshape(-1))
