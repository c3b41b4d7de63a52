"""Tests of tfgc.ops Golomb-Rice position coding.

Custom op vs pure-TF reference vs the numpy oracle
(custom_ops/cuda_harness/numpy_oracle.py) of the format in
tfgc/ops/golomb_reference.py.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgc.ops
from custom_ops.cuda_harness.numpy_oracle import (
    np_golomb_decode,
    np_golomb_encode,
)
from tfgc.ops import golomb


def py_encode(indices, b: int) -> tuple[bytes, int]:
    """The numpy oracle's stream as bytes, and its number of bits."""
    data, bits = np_golomb_encode(np.asarray(indices, np.int64), b)
    return data.tobytes(), bits


def py_decode(data: bytes, k: int, b: int) -> list[int]:
    """The numpy oracle's k positions of a valid stream."""
    out, error = np_golomb_decode(np.frombuffer(data, np.uint8), k, b, 2**31)
    assert error == (0, 0, 0), error
    return out.tolist()


def sample(n: int, k: int, seed: int, dtype=np.int32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, k, replace=False)).astype(dtype)


def check_round_trip(idx: np.ndarray, n: int, b: int | None = None) -> None:
    """Encodes with tfgc.ops and the reference; checks both against the
    oracle and decodes with both."""
    k = idx.size
    b_used = golomb.golomb_optimal_b(k, n) if b is None else b
    encoded, num_bits = tfgc.ops.golomb_encode(tf.constant(idx), n, b)
    assert encoded.dtype == tf.uint8 and num_bits.dtype == tf.int64
    want, want_bits = py_encode(idx, b_used)
    assert int(num_bits) == want_bits
    assert encoded.numpy().tobytes() == want
    ref, ref_bits = golomb.golomb_encode_reference(tf.constant(idx), n, b)
    assert int(ref_bits) == want_bits
    assert ref.numpy().tobytes() == want
    for decode in (tfgc.ops.golomb_decode, golomb.golomb_decode_reference):
        got = decode(encoded, k, b_used, n)
        assert got.dtype == tf.int32 and got.shape == [k]
        np.testing.assert_array_equal(got.numpy(), idx)


def test_optimal_b_and_expected_bits_match_the_paper():
    assert golomb.golomb_optimal_b(1, 100) == 6
    assert golomb.golomb_optimal_b(1, 1000) == 9
    assert tfgc.ops.golomb_expected_bits_per_position(
        10_000, 1_000_000
    ) == pytest.approx(8.11, abs=0.005)
    assert tfgc.ops.golomb_expected_bits_per_position(
        1_000, 1_000_000
    ) == pytest.approx(11.5, abs=0.05)
    assert golomb.golomb_optimal_b(0, 10) == 0
    assert golomb.golomb_optimal_b(10, 10) == 0
    assert golomb.golomb_optimal_b(5, 10) == 0  # q = 0.5
    assert golomb.golomb_optimal_b(1, 2**40) == 31  # clamped
    assert golomb.golomb_expected_bits_per_position(0, 10) == 0.0
    assert golomb.golomb_expected_bits_per_position(10, 10) == 1.0


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000, 10**6, 2**31 - 1])
def test_optimal_b_formula_and_graph_twin(n):
    for k in sorted({0, 1, 2, 3, n // 1000, n // 100, n // 3, n // 2, n}):
        if not 0 <= k <= n:
            continue
        b = golomb.golomb_optimal_b(k, n)
        if 0 < k < n:
            ratio = math.log((1 + math.sqrt(5)) / 2 - 1) / math.log(1 - k / n)
            want = 1 + math.floor(math.log2(ratio))
            assert b == min(max(want, 0), 31), (k, n)
        graph = golomb.golomb_optimal_b_tensor(
            tf.constant(k, tf.int64), tf.constant(n, tf.int64)
        )
        assert int(graph) == b, (k, n)


def test_bad_python_arguments():
    with pytest.raises(ValueError, match="k"):
        golomb.golomb_optimal_b(5, 4)
    with pytest.raises(TypeError, match="int"):
        golomb.golomb_optimal_b(1.5, 4)
    with pytest.raises(ValueError, match="b"):
        golomb.max_encoded_bytes(1, 4, 32)
    with pytest.raises(TypeError, match="int32 or int64"):
        tfgc.ops.golomb_encode(tf.constant([1.0]), 4)
    with pytest.raises(ValueError, match="vector"):
        tfgc.ops.golomb_encode(tf.constant([[1]]), 4)
    with pytest.raises(TypeError, match="uint8"):
        tfgc.ops.golomb_decode(tf.constant([1]), 1, 0)


@pytest.mark.parametrize(
    "k,n",
    [(0, 0), (0, 10), (1, 1), (1, 10), (2, 2), (10, 10), (64, 64)]
    + [(3, 1000), (33, 100), (500, 1000), (999, 1000), (1, 10**6)],
)
@pytest.mark.parametrize("b", [None, 0, 1, 3, 8, 31])
def test_matches_oracle(backend, k, n, b):
    del backend
    check_round_trip(sample(n, k, seed=k * 7 + n), n, b)


@pytest.mark.parametrize("first,last", [(True, False), (False, True)])
def test_extreme_positions(backend, first, last):
    del backend
    n = 100_000
    idx = np.array([0] * first + [n // 2] + [n - 1] * last, np.int32)
    for b in (None, 0, 5, 31):
        check_round_trip(idx, n, b)


@pytest.mark.parametrize("density", [0.001, 0.01, 0.05, 0.2, 0.5])
def test_large_random(backend, density):
    del backend
    n = 10**6
    k = int(density * n)
    check_round_trip(sample(n, k, seed=int(density * 1e4)), n)


@pytest.mark.parametrize("b", [0, 1, 5, 13, 31])
def test_many_blocks_any_alignment(backend, b):
    """Blocks of the parallel encoder start at every bit alignment."""
    del backend
    n, k = 2_000_000, 200_000
    idx = sample(n, k, seed=b)
    enc, bits = tfgc.ops.golomb_encode(idx, n, b)
    ref, ref_bits = golomb.golomb_encode_reference(idx, n, b)
    assert int(bits) == int(ref_bits)
    np.testing.assert_array_equal(enc.numpy(), ref.numpy())
    got = tfgc.ops.golomb_decode(enc, k, b, n)
    np.testing.assert_array_equal(got.numpy(), idx)


def test_k_equals_n_large(backend):
    del backend
    n = 300_001
    check_round_trip(np.arange(n, dtype=np.int32), n)


def test_int64_indices_and_k(backend):
    del backend
    idx = sample(50_000, 700, seed=3, dtype=np.int64)
    enc, bits = tfgc.ops.golomb_encode(tf.constant(idx), tf.constant(50_000))
    want, want_bits = py_encode(idx, golomb.golomb_optimal_b(700, 50_000))
    assert enc.numpy().tobytes() == want and int(bits) == want_bits
    b = golomb.golomb_optimal_b(700, 50_000)
    got = tfgc.ops.golomb_decode(enc, tf.constant(700, tf.int64), b)
    np.testing.assert_array_equal(got.numpy(), idx)


def test_oracle_decoder_agrees():
    idx = sample(5000, 123, seed=9)
    data, _ = py_encode(idx, 4)
    assert py_decode(data, 123, 4) == idx.tolist()


def test_static_buffer_and_trailing_bytes(backend):
    del backend
    n, k = 20_000, 150
    b = golomb.golomb_optimal_b(k, n)
    idx = sample(n, k, seed=1)
    enc, bits = tfgc.ops.golomb_encode(idx, n)
    cap = golomb.max_encoded_bytes(k, n, b)
    assert enc.shape[0] == -(-int(bits) // 8) <= cap
    buffer = tf.pad(enc, [[0, cap - enc.shape[0]]], constant_values=0xFF)
    np.testing.assert_array_equal(
        tfgc.ops.golomb_decode(buffer, k, b, n).numpy(), idx
    )


@pytest.mark.parametrize("b", [0, 1, 4, 10])
def test_max_encoded_bytes_is_tight_for_worst_cases(backend, b):
    del backend
    n = 5000
    for idx in (
        np.arange(10, dtype=np.int32),  # consecutive
        np.array([n - 1], np.int32),  # one long gap
        np.array([0, n - 1], np.int32),
        np.arange(n - 10, n, dtype=np.int32),
    ):
        enc, _ = tfgc.ops.golomb_encode(idx, n, b)
        assert enc.shape[0] <= golomb.max_encoded_bytes(idx.size, n, b)
    enc, _ = tfgc.ops.golomb_encode(np.array([n - 1], np.int32), n, b)
    assert enc.shape[0] == golomb.max_encoded_bytes(1, n, b)


@pytest.mark.parametrize("q", [0.01, 0.001])
def test_bits_per_position_within_0_1_of_formula(backend, q):
    del backend
    n = 2_000_000
    k = int(q * n)
    idx = sample(n, k, seed=int(1 / q))
    _, bits = tfgc.ops.golomb_encode(idx, n)
    measured = int(bits) / k
    expected = golomb.golomb_expected_bits_per_position(k, n)
    assert abs(measured - expected) < 0.1, (measured, expected)


def test_round_trip_in_tf_function_with_dynamic_k(backend):
    del backend

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def round_trip(idx):
        enc, bits = tfgc.ops.golomb_encode(idx, 100_000)
        k = tf.size(idx)
        b = golomb.golomb_optimal_b_tensor(k, tf.constant(100_000))
        return tfgc.ops.golomb_decode(enc, k, b, 100_000), bits

    for k in (0, 1, 1000):
        idx = sample(100_000, k, seed=k)
        got, bits = round_trip(tf.constant(idx))
        np.testing.assert_array_equal(got.numpy(), idx)
        b = golomb.golomb_optimal_b(k, 100_000)
        assert int(bits) == py_encode(idx, b)[1]


def test_static_shapes(backend):
    del backend

    @tf.function
    def f(idx, enc):
        e, bits = tfgc.ops.golomb_encode(idx, 1000, 3)
        assert e.shape.as_list() == [None] and bits.shape.as_list() == []
        d = tfgc.ops.golomb_decode(enc, 7, 3)
        assert d.shape.as_list() == [7]
        return e, d

    f(tf.constant([1, 2, 3]), tf.zeros([8], tf.uint8))


def test_not_differentiable(custom_lib):
    # The library's loader registers every Tfgc> op it loads; without the
    # library these op types do not exist.
    del custom_lib
    from tensorflow.python.framework import ops  # noqa: PLC0415

    for op_type in ("Tfgc>GolombEncode", "Tfgc>GolombDecode"):
        assert ops._gradient_registry.lookup(op_type) is None


BAD_ENCODE = [
    ([3, 2], 10, 2, "increasing"),
    ([2, 2], 10, 2, "increasing"),
    ([-1, 2], 10, 2, r"\[0, n\)|increasing"),
    ([1, 10], 10, 2, r"\[0, n\)"),
    ([1], -1, 0, "n"),
    ([1], 10, -1, "b"),
    ([1], 10, 32, "b"),
    ([0, 2**40], 2**41, 0, "larger `b`"),
]


@pytest.mark.parametrize("idx,n,b,match", BAD_ENCODE)
def test_bad_encode_inputs_raise(backend, idx, n, b, match):
    del backend
    idx = tf.constant(idx, tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        tfgc.ops.golomb_encode(idx, n, b)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([], tf.int64),
            tf.TensorSpec([], tf.int32),
        ]
    )
    def encode(i, nn, bb):
        return tfgc.ops.golomb_encode(i, nn, bb)

    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        encode(idx, tf.constant(n, tf.int64), tf.constant(b))


def _bad_decode_cases():
    enc, _ = py_encode([5, 9, 40], 3)
    return [
        (enc[:1], 3, 3, None, "truncated"),
        (b"", 1, 0, None, "truncated"),
        (b"\xff" * 4, 1, 0, None, "truncated"),
        (b"\x00", 2**40, 0, None, "too short"),
        (enc, 3, 3, 40, "n"),
        (enc, -1, 3, None, "k"),
        (enc, 3, 32, None, "b"),
        (enc, 3, -2, None, "b"),
        (b"\xff" * 300 + b"\x00" * 4, 1, 31, None, "int32"),
    ]


@pytest.mark.parametrize("data,k,b,n,match", _bad_decode_cases())
def test_bad_decode_inputs_raise(backend, data, k, b, n, match):
    del backend
    enc = tf.constant(np.frombuffer(data, np.uint8))
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        tfgc.ops.golomb_decode(enc, k, b, n)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.uint8),
            tf.TensorSpec([], tf.int64),
            tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.int64),
        ]
    )
    def decode(e, kk, bb, nn):
        return tfgc.ops.golomb_decode(e, kk, bb, nn)

    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        decode(
            enc,
            tf.constant(k, tf.int64),
            tf.constant(b),
            tf.constant(-1 if n is None else n, tf.int64),
        )


def test_kernels_validate_ranks(custom_lib):
    @tf.function(
        input_signature=[
            tf.TensorSpec(None, tf.int32),
            tf.TensorSpec(None, tf.int64),
            tf.TensorSpec(None, tf.int32),
        ]
    )
    def encode(idx, n, b):
        return custom_lib.tfgc_golomb_encode(idx, n, b)

    with pytest.raises(tf.errors.InvalidArgumentError, match="vector"):
        encode(tf.ones([2, 2], tf.int32), tf.constant(9, tf.int64), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar"):
        encode(tf.constant([1]), tf.constant([9], tf.int64), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar"):
        encode(tf.constant([1]), tf.constant(9, tf.int64), [1])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    n=st.integers(0, 5000),
    density=st.floats(0.0, 1.0),
    b=st.one_of(st.none(), st.integers(0, 31)),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_round_trip(backend, n, density, b, seed):
    del backend
    k = min(n, int(round(density * n)))
    idx = sample(n, k, seed)
    b_used = golomb.golomb_optimal_b(k, n) if b is None else b
    enc, bits = tfgc.ops.golomb_encode(idx, n, b)
    want, want_bits = py_encode(idx, b_used)
    assert enc.numpy().tobytes() == want and int(bits) == want_bits
    got = tfgc.ops.golomb_decode(enc, k, b_used, n)
    np.testing.assert_array_equal(got.numpy(), idx)
