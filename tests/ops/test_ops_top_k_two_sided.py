"""Tests of tfgc.ops.top_k_two_sided (`Tfgc>TopKTwoSided`): the compiled op
bit for bit the pure-TF reference (today's SBC selection: top_k_abs of
relu(x) and of relu(-x), kept where > 0 or NaN) and the numpy oracle
(`np_select_two_sided`), with NaN patterns of both signs, +-Inf, zeros of
both signs, subnormals, ties, one sign only, k above the entries of a side
and data that misleads the CPU kernel's sample; float64 takes the
reference; bad k raises in eager and in `tf.function`."""

import importlib

import numpy as np
import pytest
import tensorflow as tf

import tfgc.ops
from custom_ops.cuda_harness.numpy_oracle import (
    np_flip_sign,
    np_select_two_sided,
)
from tests.ops.selection_data import (
    HOSTILE,
    as_float32,
    hostile,
    mixed_subnormals,
)

tks = importlib.import_module("tfgc.ops.top_k_sample")
DTYPES = [tf.float32, tf.float16, tf.bfloat16]
INTS = {2: tf.uint16, 4: tf.uint32, 8: tf.uint64}
# NaN bit patterns of both signs, quiet and signalling, with payloads.
NAN_BITS = {
    tf.float32: [0xFFC00000, 0x7FC00123, 0xFF800001, 0x7F800001],
    tf.float16: [0xFE00, 0x7E12, 0xFC01, 0x7C01],
    tf.bfloat16: [0xFFC0, 0x7FC1, 0xFF81, 0x7F81],
    tf.float64: [0xFFF8000000000000, 0x7FF0000000000001],
}


def _bits(t):
    return tf.bitcast(t, INTS[t.dtype.size]).numpy()


def _with_nan_bits(x, at):
    """x (flat) with NAN_BITS of its dtype written at positions `at`."""
    ints = INTS[x.dtype.size]
    bits = tf.bitcast(x, ints).numpy().copy()
    patterns = NAN_BITS[x.dtype]
    bits[np.asarray(at)[: len(patterns)]] = patterns[: len(at)]
    return tf.bitcast(tf.constant(bits, ints), x.dtype)


def _specials(n, dtype, seed):
    """Gaussian data with ties, zeros of both signs, subnormals of float32
    and of dtype (both signs), +-Inf and NaN patterns of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if n > 40:
        x[rng.integers(0, n, n // 10 + 1)] = np.round(x[0], 1)  # ties
        x[[0, 1, 2, 3]] = [0.0, -0.0, 1e-40, -3e-39]
        x[[4, 5, 6, 7]] = [6e-8, -1.2e-7, np.inf, -np.inf]
    x = tf.constant(x, dtype)
    return _with_nan_bits(x, [8, 9, 10, 11]) if n > 40 else x


def check(x, k, out=None):
    """The op (or `out`) equals the reference bit for bit and the oracle."""
    out = tfgc.ops.top_k_two_sided(x, k) if out is None else out
    ref = tks.top_k_two_sided_reference(x, k)
    assert isinstance(out, tfgc.ops.TwoSidedSelection)
    for got, want in zip(out, ref):
        assert got.dtype == want.dtype and got.shape.rank == 1
        np.testing.assert_array_equal(_bits(got), _bits(want))
    flat = tf.reshape(x, [-1])
    if x.dtype != tf.float64:
        pos, neg = np_select_two_sided(as_float32(flat), int(k))
        np.testing.assert_array_equal(out.positive_indices.numpy(), pos)
        np.testing.assert_array_equal(out.negative_indices.numpy(), neg)
        raw = _bits(flat)
        np.testing.assert_array_equal(_bits(out.positive_values), raw[pos])
        np.testing.assert_array_equal(
            _bits(out.negative_values), np_flip_sign(raw[neg])
        )
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize(
    "n, k",
    [(1, 1), (2, 1), (33, 5), (1025, 10), (4097, 4097), (4097, 2049)]
    + [(70001, 70), (300_001, 300), (300_001, 150_001)],
)
def test_matches_reference_and_oracle(backend, dtype, n, k):
    del backend
    check(_specials(n, dtype, seed=n), k)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", HOSTILE)
def test_data_that_misleads_the_sample(backend, dtype, name):
    """Above the sampled size (256 Ki): the sample sees only large values
    (fewer candidates than k: one more pass), only zeros, mostly zeros (k
    above a side's entries), one key per side."""
    del backend
    n = 300_001
    x = tf.constant(hostile(name, n), dtype)
    for k in (n // 1000, n // 20):
        check(x, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_one_sign_zeros_and_nan_only(backend, dtype):
    """(x, k, entries on the positive and the negative side)."""
    del backend
    n = 3000
    rng = np.random.default_rng(4)
    pos = np.abs(rng.standard_normal(n)).astype(np.float32) + 0.25
    few = np.where(rng.random(n) < 0.02, pos, -pos)  # k above positives
    for x, k, sizes in [
        (pos, 10, (10, 0)),
        (-pos, 10, (0, 10)),
        (pos, n, (n, 0)),
        (np.zeros(n, np.float32), 5, (0, 0)),
        (np.full(n, -0.0, np.float32), 5, (0, 0)),
        (np.full(n, np.nan, np.float32), 7, (7, 7)),
        (few, 300, (int((few > 0).sum()), 300)),
    ]:
        out = check(tf.constant(x, dtype), k)
        assert (
            out.positive_indices.shape[0],
            out.negative_indices.shape[0],
        ) == (sizes)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_ties_go_to_the_lower_index(backend, dtype):
    del backend
    x = tf.constant(np.resize(np.float32([1, -1, 0.5, -2]), 4000), dtype)
    out = check(x, 700)
    np.testing.assert_array_equal(out.positive_indices, np.arange(700) * 4)
    np.testing.assert_array_equal(out.negative_indices, np.arange(700) * 4 + 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_subnormals(backend, dtype):
    """Zeros, subnormals of dtype of both signs and normals near the
    smallest: float32 and bfloat16 subnormals are on neither side (as
    `values > 0` compares on TensorFlow's flushing threads), float16's are
    normal in float32 and on their side."""
    del backend
    n = 6000
    x = tf.constant(mixed_subnormals(np.arange(n) % 6, dtype, seed=3), dtype)
    for k in (1, 100, n):
        out = check(x, k)
    kept = np.abs(as_float32(out.positive_values))
    smallest_normal = 2.0**-14 if dtype == tf.float16 else 2.0**-126
    assert (kept < smallest_normal).any() == (dtype == tf.float16)


@pytest.mark.parametrize("dtype", DTYPES + [tf.float64], ids=lambda d: d.name)
def test_nan_in_both_sides_in_graphs_too(backend, dtype):
    """NaN (any sign, any payload) is on both sides, its bits kept (the
    negative side's sign bit flipped, as relu(-x)), in eager mode and in a
    tf.function alike; the reference's test is not `~(values <= 0)`,
    which Grappler rewrites to `values > 0` in graphs."""
    del backend
    x = tf.cast(tf.constant([1.0, -2.0, 0.0, 3.0, -4.0, 0.5] * 5), dtype)
    x = _with_nan_bits(x, [2, 7, 13, 20])
    eager = check(x, 3)
    graph = tf.function(lambda x: tfgc.ops.top_k_two_sided(x, 3))(x)
    reference = tf.function(lambda x: tks.top_k_two_sided_reference(x, 3))(x)
    for got, ref, want in zip(graph, reference, eager):
        np.testing.assert_array_equal(_bits(got), _bits(want))
        np.testing.assert_array_equal(_bits(ref), _bits(want))
    nan = np.isnan(as_float32(eager.positive_values))
    assert nan.sum() == min(3, len(NAN_BITS[dtype]))


def test_float64_takes_the_reference():
    """float64 has no kernel: the reference, whose keys are float64's bits
    (subnormals below 2^-1022 on neither side)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(5000)
    x[:6] = [1e-310, -1e-310, 0.0, -0.0, np.inf, -np.inf]
    x[6:] = np.where(rng.random(4994) < 0.1, np.round(x[6:], 1), x[6:])
    x = tf.constant(x, tf.float64)
    for k in (1, 50, 5000):
        out = check(x, k)
        for side, values, indices in ((1, *out[:2]), (-1, *out[2:])):
            a = side * x.numpy()
            on = np.flatnonzero(a >= 2.0**-1022)
            want = np.sort(on[np.argsort(-a[on], kind="stable")[:k]])
            np.testing.assert_array_equal(indices.numpy(), want)
            np.testing.assert_array_equal(values.numpy(), a[want])


@pytest.mark.parametrize("k_dtype", [tf.int32, tf.int64])
def test_k_as_a_tensor(backend, k_dtype):
    del backend
    x = _specials(1000, tf.float32, seed=1)
    out = tf.function(lambda x, k: tfgc.ops.top_k_two_sided(x, k))(
        x, tf.constant(17, k_dtype)
    )
    check(x, 17, out)


def test_any_shape_and_unknown_lengths(custom_lib):
    del custom_lib
    x = tf.reshape(_specials(1200, tf.float32, seed=2), [30, 40])

    @tf.function(input_signature=[tf.TensorSpec([None, 40], tf.float32)])
    def select(x):
        out = tfgc.ops.top_k_two_sided(x, 12)
        assert all(t.shape.as_list() == [None] for t in out)
        return out

    check(x, 12, select(x))


@pytest.mark.parametrize("k", [-1, 31])
def test_bad_k_raises(backend, k):
    """In eager mode and in a tf.function (the reference's tf.math.top_k
    may refuse k while tracing: ValueError)."""
    del backend
    x = tf.constant(np.arange(30, dtype=np.float32) - 15)
    errors = (tf.errors.InvalidArgumentError, ValueError)
    with pytest.raises(errors):
        tfgc.ops.top_k_two_sided(x, k)
    with pytest.raises(errors):
        tf.function(lambda x: tfgc.ops.top_k_two_sided(x, k))(x)


def test_empty(backend):
    del backend
    out = check(tf.zeros([0]), 0)
    assert all(t.shape == [0] for t in out)


def test_runs_one_compiled_op(custom_lib):
    del custom_lib
    f = tf.function(lambda x: tfgc.ops.top_k_two_sided(x, 3))
    graph = f.get_concrete_function(tf.TensorSpec([10, 4])).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("Tfgc>TopKTwoSided") == 1
    assert "Relu" not in types and "Tfgc>TopKSample" not in types


def test_bad_k_values_are_named(custom_lib):
    x = tf.zeros([30])
    with pytest.raises(tf.errors.InvalidArgumentError, match="k=31, n=30"):
        custom_lib.tfgc_top_k_two_sided(x, 31)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar"):
        custom_lib.tfgc_top_k_two_sided(x, [1, 2])


def test_repeated_calls_reuse_their_buffers(custom_lib):
    """The kernel keeps its buffers between calls: a huge selection, then
    small ones, all exact."""
    del custom_lib
    big = tf.constant(hostile("mostly_zero", 1_000_003))
    check(big, 400_000)
    for seed in range(3):
        check(_specials(5000, tf.float32, seed), 50)
