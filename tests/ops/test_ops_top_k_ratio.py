"""Tests of tfgc.ops.top_k_ratio (`Tfgc>TopKRatioWithResidual`): the
compiled op and its pure-TF fallback against the numpy oracle
(`np_select_ratio`), with ties, zeros in the weights, NaN and Inf, and
subnormals; bad inputs raise in eager and in `tf.function`."""

import importlib

import numpy as np
import pytest
import tensorflow as tf

import tfgc.ops
from custom_ops.cuda_harness.numpy_oracle import (
    np_ratio_scores,
    np_select_ratio,
)
from tests.ops.selection_data import as_float32, mixed_subnormals

tks = importlib.import_module("tfgc.ops.top_k_sample")
DTYPES = [tf.float32, tf.float16, tf.bfloat16]


def _data(n, dtype, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return tf.constant(
        (rng.standard_normal(n) * scale).astype(np.float32), dtype
    )


def check(x, residual, weights, floor, k, out):
    """out = (values, indices, new residual) is what the oracle selects."""
    values, indices, new_residual = out
    acc = tf.reshape(x + tf.cast(residual, x.dtype), [-1])
    acc32 = as_float32(acc)
    expected = np_select_ratio(acc32, as_float32(weights), floor, k)
    np.testing.assert_array_equal(indices.numpy(), expected)
    assert indices.dtype == tf.int32 and values.dtype == x.dtype
    # acc's values, not the scores, bit for bit (NaN payloads aside).
    np.testing.assert_array_equal(as_float32(values), acc32[expected])
    kept = acc32.copy()
    kept[expected] = 0
    assert new_residual.shape == x.shape
    np.testing.assert_array_equal(
        as_float32(tf.reshape(new_residual, [-1])), kept
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize(
    "n, k", [(1, 1), (2, 1), (33, 5), (1025, 10), (4097, 4097), (70001, 70)]
)
def test_matches_numpy(backend, dtype, n, k):
    del backend
    x, r = _data(n, dtype, 1), _data(n, dtype, 2, 0.5)
    w = _data(n, dtype, 3, 0.05).numpy()
    w[::5] = 0  # zero weights: ranked by |acc| / floor
    w = tf.constant(w, dtype)
    check(x, r, w, 1e-3, k, tfgc.ops.top_k_ratio(x, k, w, 1e-3, r))


def test_ranks_by_ratio_and_returns_acc(backend):
    del backend
    x = tf.constant([1.0, 1.0, 0.1, 4.0, 0.2, 0.0, 3.0, 0.5])
    w = tf.constant([10.0, 0.1, 0.001, 100.0, 1.0, 1.0, 1.0, 0.05])
    # |x| / |w|: 0.1, 10, 100, 0.04, 0.2, 0, 3, 10: 2, then 1 (lower index).
    values, indices, residual = tfgc.ops.top_k_ratio(x, 2, w, 0.0, tf.zeros(8))
    np.testing.assert_array_equal(indices.numpy(), [1, 2])
    np.testing.assert_array_equal(values.numpy(), np.float32([1.0, 0.1]))
    np.testing.assert_array_equal(
        residual.numpy(), np.float32([1.0, 0, 0, 4.0, 0.2, 0.0, 3.0, 0.5])
    )


def test_ties_go_to_the_lower_index(backend):
    del backend
    n = 3000
    x = tf.fill([n], 2.0)
    w = tf.constant(np.where(np.arange(n) % 2, 1.0, 3.0), tf.float32)
    out = tfgc.ops.top_k_ratio(x, 700, w, 0.0, tf.zeros(n))
    np.testing.assert_array_equal(out[1].numpy(), np.arange(1, 1400, 2))
    check(x, tf.zeros(n), w, 0.0, 700, out)


def test_non_finite_scores_go_first(backend):
    """NaN and +-Inf in acc, Inf in w, and 0 / 0 (w = 0, floor = 0)."""
    del backend
    x = tf.constant([1.0, np.nan, 2.0, np.inf, -np.inf, 0.0, 5.0, 1.0])
    w = tf.constant([1.0, 1.0, np.inf, 1.0, np.inf, 0.0, 1.0, 0.0])
    out = tfgc.ops.top_k_ratio(x, 5, w, 0.0, tf.zeros(8))
    # Scores: 1, NaN, 0, inf, NaN, NaN (0/0), 5, inf (1/0).
    np.testing.assert_array_equal(out[1].numpy(), [1, 3, 4, 5, 7])
    check(x, tf.zeros(8), w, 0.0, 5, out)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_subnormals_flush(backend, dtype):
    """Subnormal acc, weights, floor and scores count as zeros, as on a
    CPU thread with FTZ and DAZ, on every implementation alike."""
    del backend
    n = 600
    kinds = np.arange(n) % 6
    acc = mixed_subnormals(kinds, dtype, seed=1)
    w = mixed_subnormals(np.roll(kinds, 1), dtype, seed=2)
    for floor in [0.0, 1e-40, 1e-3, 2.0**100]:
        x = tf.constant(acc, dtype)
        out = tfgc.ops.top_k_ratio(x, 77, tf.constant(w, dtype), floor, 0 * x)
        check(x, 0 * x, tf.constant(w, dtype), floor, 77, out)


def test_scores_match_the_oracle():
    rng = np.random.default_rng(0)
    acc = rng.standard_normal(1000).astype(np.float32)
    w = (rng.standard_normal(1000) * 1e-3).astype(np.float32)
    acc[:4] = [3e-39, -1e-40, np.nan, np.inf]
    w[4:8] = [0.0, 3e-39, np.inf, -0.0]
    got = tfgc.ops.ratio_scores(acc, w, 1e-38).numpy()
    np.testing.assert_array_equal(got, np_ratio_scores(acc, w, 1e-38))


@pytest.mark.parametrize("k", [0, 1, 999, 1000])
def test_k_bounds(backend, k):
    del backend
    x, r, w = (
        _data(1000, tf.float32, 4),
        _data(1000, tf.float32, 5),
        _data(1000, tf.float32, 6),
    )
    check(x, r, w, 0.1, k, tfgc.ops.top_k_ratio(x, k, w, 0.1, r))


def test_empty(backend):
    del backend
    e = tf.zeros([0])
    values, indices, residual = tfgc.ops.top_k_ratio(e, 0, e, 1.0, e)
    assert values.shape == [0] and indices.shape == [0]
    assert residual.shape == [0]


@pytest.mark.parametrize("data", ["gaussian", "ties", "outlier"])
def test_large_inputs(backend, data):
    """Large enough for the sampled candidate floor, and for its retry at
    floor 0 when every score ties (the sample cannot tell)."""
    del backend
    n, k = 1_000_003, 1000
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n).astype(np.float32)
    w = (rng.standard_normal(n) * 0.05).astype(np.float32)
    if data == "ties":
        x[:] = 1.0
        w[:] = 0.5
    elif data == "outlier":
        x[n // 2] = 1e30
    x, w = tf.constant(x), tf.constant(w)
    r = tf.zeros(n)
    check(x, r, w, 1e-4, k, tfgc.ops.top_k_ratio(x, k, w, 1e-4, r))


def test_custom_equals_fallback(custom_lib, monkeypatch):
    del custom_lib
    x, r = _data(50_001, tf.float32, 8), _data(50_001, tf.float32, 9)
    w = _data(50_001, tf.float32, 10, 0.01)
    compiled = tfgc.ops.top_k_ratio(x, 500, w, 1e-3, r)
    monkeypatch.setenv("TFGC_DISABLE_CUSTOM_OPS", "1")
    fallback = tfgc.ops.top_k_ratio(x, 500, w, 1e-3, r)
    for a, b in zip(compiled, fallback):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_runs_the_compiled_op(custom_lib):
    del custom_lib

    @tf.function
    def f(x, r, w):
        return tfgc.ops.top_k_ratio(x, 3, w, 1.0, r)

    spec = tf.TensorSpec([10, 4], tf.float32)
    graph = f.get_concrete_function(spec, spec, spec).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("Tfgc>TopKRatioWithResidual") == 1
    # The output lengths are static when k is.
    assert graph.outputs[0].shape == [3]


def _bad(fn):
    errors = (tf.errors.InvalidArgumentError, ValueError)
    with pytest.raises(errors):
        fn()
    with pytest.raises(errors):
        tf.function(fn)()


@pytest.mark.parametrize("k", [-1, 11])
def test_bad_k_raises(backend, k):
    del backend
    x = tf.ones(10)
    _bad(lambda: tfgc.ops.top_k_ratio(x, k, x, 1.0, x))


def test_bad_shapes_raise(backend):
    del backend
    x = tf.ones(10)
    _bad(lambda: tfgc.ops.top_k_ratio(x, 1, tf.ones(9), 1.0, x))
    _bad(lambda: tfgc.ops.top_k_ratio(x, 1, x, 1.0, tf.ones(11)))


def test_op_messages_name_the_values(custom_lib):
    x = tf.ones(10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="k=11, n=10"):
        custom_lib.tfgc_top_k_ratio_with_residual(x, x, x, 1.0, 11)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"weights.shape=\[9\]"
    ):
        custom_lib.tfgc_top_k_ratio_with_residual(x, x, tf.ones(9), 1.0, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`floor`"):
        custom_lib.tfgc_top_k_ratio_with_residual(x, x, x, [1.0, 2.0], 1)
