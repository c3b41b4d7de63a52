"""Tests of tfgc.ops.top_k_sample: custom op vs pure-TF reference vs numpy."""

import ctypes
import importlib
import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgc.ops
from custom_ops.cuda_harness.numpy_oracle import np_keys, np_select
from tests.ops.selection_data import (
    HOSTILE,
    as_float32,
    hostile,
    mixed_subnormals,
)

tks = importlib.import_module("tfgc.ops.top_k_sample")
MODES = tks.MODES
DTYPES = [tf.float32, tf.float16, tf.bfloat16]
SIZES = [1, 2, 31, 32, 33, 127, 1023, 1024, 1025, 4095, 4097, 65537]


def property_settings(max_examples):
    """Hypothesis settings of the property tests (which take the function-
    scoped `backend` fixture: it only selects the build)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


def check_selection(x, values, indices, k, mode):
    """Properties every selection has."""
    flat = np.asarray(tf.reshape(x, [-1]).numpy())
    idx = indices.numpy()
    assert indices.dtype == tf.int32
    assert values.dtype == x.dtype
    if mode == "threshold":
        assert idx.size >= min(k, flat.size)
    else:
        assert idx.size == k
    assert np.all(np.diff(idx) > 0), "indices increasing and unique"
    np.testing.assert_array_equal(
        values.numpy().astype(np.float32), flat[idx].astype(np.float32)
    )


def gaussian(n, seed=0, dtype=tf.float32):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.standard_normal(n).astype(np.float32), dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", SIZES)
def test_matches_numpy(backend, mode, dtype, n):
    del backend
    x = gaussian(n, seed=n, dtype=dtype)
    for k in sorted({0, 1, max(1, n // 100), n // 2, n}):
        values, indices = tfgc.ops.top_k_sample(x, k, mode=mode, seed=n + k)
        check_selection(x, values, indices, k, mode)
        want = np_select(x.numpy(), k, mode, seed=n + k)
        np.testing.assert_array_equal(indices.numpy(), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_custom_equals_reference(custom_lib, mode, dtype):
    del custom_lib
    rng = np.random.default_rng(1)
    for trial in range(12):
        n = int(rng.integers(1, 30000))
        k = int(rng.integers(0, n + 1)) if trial % 2 else max(1, n // 1000)
        x = rng.standard_normal(n).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x * 4) / 4  # many ties
        x = tf.constant(x, dtype)
        got = tfgc.ops.top_k_sample(x, k, mode=mode, seed=trial)
        want = tks.top_k_sample_reference(x, k, mode=mode, seed=trial)
        np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
        np.testing.assert_array_equal(
            got[0].numpy().astype(np.float32),
            want[0].numpy().astype(np.float32),
        )


def test_empty_input(backend):
    del backend
    for mode in MODES:
        v, i = tfgc.ops.top_k_sample(tf.zeros([0]), 0, mode=mode)
        assert v.shape == [0] and i.shape == [0]


@pytest.mark.parametrize("mode", MODES)
def test_k_equals_n_selects_everything(backend, mode):
    del backend
    x = gaussian(1000)
    _, i = tfgc.ops.top_k_sample(x, 1000, mode=mode)
    np.testing.assert_array_equal(i.numpy(), np.arange(1000))


@pytest.mark.parametrize("mode", ["mstopk", "trimmed"])
def test_all_ties(backend, mode):
    del backend
    x = tf.fill([1000], 0.5)
    _, i = tfgc.ops.top_k_sample(x, 10, mode=mode, seed=3)
    assert i.shape == [10]
    if mode == "trimmed":  # lower index first among ties
        np.testing.assert_array_equal(i.numpy(), np.arange(10))
    else:  # a contiguous slice of the band
        np.testing.assert_array_equal(i.numpy(), i.numpy()[0] + np.arange(10))


def test_mstopk_seed_determinism(backend):
    del backend
    x = tf.fill([1000], 1.0)
    runs = {
        s: tfgc.ops.top_k_sample(x, 10, seed=s)[1].numpy().tolist()
        for s in range(6)
    }
    for s in range(6):
        assert (
            tfgc.ops.top_k_sample(x, 10, seed=s)[1].numpy().tolist()
            == (runs[s])
        )
    assert len({tuple(v) for v in runs.values()}) > 1


@pytest.mark.parametrize("mode", MODES)
def test_non_finite_is_selected_first(backend, mode):
    """NaN and +-Inf count as the largest magnitude (docs/algorithms.md,
    "Non-finite gradients"): selected before any finite value, in both
    builds; among themselves the lower index goes first."""
    del backend
    x = gaussian(1000).numpy()
    special = [3, 7, 10, 20, 30, 500]
    x[special] = [np.inf, -np.inf, np.nan, np.nan, np.nan, np.inf]
    v, i = tfgc.ops.top_k_sample(tf.constant(x), 20, mode=mode)
    assert set(special) <= set(i.numpy().tolist())
    assert np.sum(~np.isfinite(v.numpy())) == len(special)
    for k in (1, 4, 6):
        v, i = tfgc.ops.top_k_sample(tf.constant(x), k, mode=mode, seed=k)
        np.testing.assert_array_equal(i.numpy(), np_select(x, k, mode, seed=k))
        np.testing.assert_array_equal(v.numpy(), x[i.numpy()])
    _, i = tfgc.ops.top_k_sample(tf.constant(x), 4, mode="trimmed")
    np.testing.assert_array_equal(i.numpy(), [3, 7, 10, 20])
    all_nan = tf.fill([64], float("nan"))
    v, i = tfgc.ops.top_k_sample(all_nan, 5, mode=mode)
    assert i.shape[0] >= 5


@pytest.mark.parametrize("dtype", DTYPES + [tf.float64], ids=lambda d: d.name)
def test_top_k_abs_selects_non_finite_first(backend, dtype):
    """`top_k_abs` (the compiled trimmed top-k or `tf.math.top_k`) takes NaN
    and +-Inf first, lower index first among them, and with a residual
    zeroes them there."""
    del backend
    rng = np.random.default_rng(5)
    x = rng.standard_normal(5000).astype(np.float32)
    special = np.sort(rng.choice(5000, 40, replace=False))
    x[special] = np.resize(np.float32([np.nan, np.inf, -np.inf]), 40)
    xt = tf.cast(tf.constant(x), dtype)
    x = tf.cast(xt, tf.float32).numpy()  # as rounded to dtype
    for k in (1, 25, 40, 100):
        want = np_select(x, k, "trimmed")
        v, i = tfgc.ops.top_k_abs(xt, k)
        np.testing.assert_array_equal(np.sort(i.numpy()), want)
        np.testing.assert_array_equal(
            tf.cast(v, tf.float32).numpy(), x[i.numpy()]
        )
        v, i, r = tfgc.ops.top_k_abs(xt, k, residual=tf.zeros_like(xt))
        np.testing.assert_array_equal(np.sort(i.numpy()), want)
        expect = x.copy()
        expect[want] = 0
        np.testing.assert_array_equal(tf.cast(r, tf.float32).numpy(), expect)


# Subnormals (docs/algorithms.md, "Selection and position-coding ops"):
# keys are compared as integers, so a subnormal ranks above zero, in value
# order, although TensorFlow's threads flush denormals in float arithmetic
# and comparisons. float16's subnormals are normal in float32.
SUBNORMAL = {tf.float32: 3e-39, tf.bfloat16: 3e-39, tf.float16: 1e-7}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_one_subnormal_among_zeros(backend, mode, dtype):
    """A 1M gradient of zeros and one subnormal, k = 2000, raised
    "selected 1999 elements but planned 2000" in the compiled trimmed and
    threshold modes (the radix ranked the subnormal above zero, the float
    comparisons, flushed, did not)."""
    del backend
    x = np.zeros(1_000_000, np.float32)
    x[123_456] = SUBNORMAL[dtype]
    xt = tf.constant(x, dtype)
    v, i = tfgc.ops.top_k_sample(xt, 2000, mode=mode, seed=3)
    check_selection(xt, v, i, 2000, mode)
    np.testing.assert_array_equal(
        i.numpy(), np_select(as_float32(xt), 2000, mode, seed=3)
    )
    if mode != "mstopk":
        want = np.append(np.arange(1999), 123_456)
        np.testing.assert_array_equal(i.numpy(), want)
        assert as_float32(v)[-1] == as_float32(xt)[123_456] != 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_subnormal_ranks_above_zero(backend, mode, dtype):
    """[1, 1e-40, 0, 0, 0, 0] with k = 3 raised in the compiled trimmed and
    threshold modes; subnormals of either sign rank above zero and by
    value, in both builds."""
    del backend
    tiny = 1e-7 if dtype == tf.float16 else 1e-40
    cases = [
        ([1.0, tiny, 0, 0, 0, 0], 3, [0, 1, 2]),
        ([0, 0, -tiny, 2 * tiny, 0, 0, 0, 0, 0], 2, [2, 3]),
        ([tiny, 3 * tiny, 0, -2 * tiny, 0.0, -0.0], 2, [1, 3]),
        ([0.0] * 9 + [-tiny] + [0.0] * 7, 1, [9]),
    ]
    for x, k, exact in cases:
        xt = tf.constant(np.float32(x), dtype)
        v, i = tfgc.ops.top_k_sample(xt, k, mode=mode, seed=k)
        check_selection(xt, v, i, k, mode)
        want = np_select(as_float32(xt), k, mode, seed=k)
        np.testing.assert_array_equal(i.numpy(), want, err_msg=str(x))
        if mode == "trimmed":
            np.testing.assert_array_equal(i.numpy(), exact, err_msg=str(x))
        with_r = tfgc.ops.top_k_sample(
            xt, k, mode=mode, seed=k, residual=tf.zeros_like(xt)
        )
        acc = xt + tf.zeros_like(xt)  # TensorFlow's add (flushes on CPU)
        plain = tfgc.ops.top_k_sample(acc, k, mode=mode, seed=k)
        np.testing.assert_array_equal(with_r[1].numpy(), plain[1].numpy())


def check_contract(keys, idx, k, mode):
    """Trimmed: the exact top-k by key, lower index first among equal keys;
    threshold: at least k elements, every selected key at least every
    unselected one."""
    chosen = np.zeros(keys.size, bool)
    chosen[idx] = True
    if mode == "trimmed":
        order = np.lexsort((np.arange(keys.size), -keys))
        np.testing.assert_array_equal(idx, np.sort(order[:k]))
    elif mode == "threshold" and 0 < k:
        assert idx.size >= k
        if not chosen.all():
            assert keys[chosen].min() >= keys[~chosen].max()


@property_settings(max_examples=60)
@given(
    kinds=st.lists(st.integers(0, 5), min_size=1, max_size=300),
    frac=st.floats(0.0, 1.0),
    mode=st.sampled_from(MODES),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_zeros_subnormals_normals(
    backend, kinds, frac, mode, dtype, seed
):
    """Zeros, subnormals of both signs and normals: both builds select
    what numpy selects (all-subnormal inputs included: the statistics
    count subnormals as 0, so they do not depend on flush-to-zero), and
    the fused residual variant what the plain op selects from x + r."""
    del backend
    x = mixed_subnormals(kinds, dtype, seed)
    k = int(round(frac * x.size))
    xt = tf.constant(x, dtype)
    v, i = tfgc.ops.top_k_sample(xt, k, mode=mode, seed=seed)
    check_selection(xt, v, i, k, mode)
    np.testing.assert_array_equal(i.numpy(), np_select(x, k, mode, seed=seed))
    check_contract(np_keys(x), i.numpy(), k, mode)
    r = tf.constant(mixed_subnormals(kinds[::-1], dtype, seed + 1), dtype)
    fused = tfgc.ops.top_k_sample(xt, k, mode=mode, seed=seed, residual=r)
    acc = xt + r  # TensorFlow's add, as both builds take it
    v, i = tfgc.ops.top_k_sample(acc, k, mode=mode, seed=seed)
    np.testing.assert_array_equal(fused[1].numpy(), i.numpy())
    np.testing.assert_array_equal(as_float32(fused[0]), as_float32(v))
    np.testing.assert_array_equal(
        fused[1].numpy(), np_select(as_float32(acc), k, mode, seed=seed)
    )


@pytest.mark.parametrize("dtype", DTYPES + [tf.float64], ids=lambda d: d.name)
def test_top_k_abs_ranks_subnormals_above_zero(backend, dtype):
    """`top_k_abs` (compiled trimmed top-k, or `tf.math.top_k` on integer
    keys, float64 included) ranks subnormals above zero and by value."""
    del backend
    tiny = {tf.float64: 1e-310, tf.float16: 1e-7}.get(dtype, 1e-40)
    x = np.zeros(300)
    x[[7, 50, 120, 260]] = [tiny, -3 * tiny, 2 * tiny, -tiny]
    xt = tf.constant(x, dtype)
    for k, want in [(1, [50]), (3, [7, 50, 120]), (5, [0, 7, 50, 120, 260])]:
        v, i = tfgc.ops.top_k_abs(xt, k)
        np.testing.assert_array_equal(np.sort(i.numpy()), want)
        np.testing.assert_array_equal(v.numpy(), tf.gather(xt, i).numpy())


@pytest.mark.parametrize(
    "dist", ["gaussian", "laplace"], ids=["gaussian", "laplace"]
)
@pytest.mark.parametrize("density", [0.001, 0.01])
def test_recall(backend, dist, density):
    del backend
    n = 200_000
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n) if dist == "gaussian" else rng.laplace(size=n)
    x = tf.constant(x.astype(np.float32))
    k = int(np.ceil(density * n))
    true = set(np.argsort(-np.abs(x.numpy()))[:k].tolist())
    recall = {}
    for mode in MODES:
        _, i = tfgc.ops.top_k_sample(x, k, mode=mode, seed=1)
        recall[mode] = len(true & set(i.numpy().tolist())) / k
        if mode == "threshold":
            assert k < i.shape[0] < 2 * k
    assert recall["trimmed"] == 1.0
    assert recall["threshold"] == 1.0  # a superset of the top-k
    assert recall["mstopk"] >= 0.99, recall


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode", MODES)
def test_residual_variant(backend, mode, dtype):
    del backend
    g = gaussian(5000, seed=1, dtype=dtype)
    r = tf.reshape(gaussian(5000, seed=2, dtype=dtype), [50, 100])
    g = tf.reshape(g, [50, 100])
    v, i, new_r = tfgc.ops.top_k_sample(g, 50, mode=mode, seed=4, residual=r)
    acc = (g + r).numpy().reshape(-1)
    assert new_r.shape == [50, 100] and new_r.dtype == dtype
    want_v, want_i = tfgc.ops.top_k_sample(g + r, 50, mode=mode, seed=4)
    np.testing.assert_array_equal(i.numpy(), want_i.numpy())
    np.testing.assert_array_equal(v.numpy(), want_v.numpy())
    expect = acc.copy()
    expect[i.numpy()] = 0
    np.testing.assert_array_equal(new_r.numpy().reshape(-1), expect)
    # Error feedback conserves mass: sent + kept == accumulated.
    f32 = np.float32
    np.testing.assert_allclose(
        v.numpy().astype(f32).sum() + new_r.numpy().astype(f32).sum(),
        acc.astype(f32).sum(),
        rtol=1e-5,
        atol=1e-3,
    )


@pytest.mark.parametrize("k", [-1, 11])
def test_bad_k_raises_eager(backend, k):
    del backend
    with pytest.raises(tf.errors.InvalidArgumentError, match="k"):
        tfgc.ops.top_k_sample(tf.ones([10]), k)


@pytest.mark.parametrize("k", [-1, 11])
def test_bad_k_raises_in_tf_function(backend, k):
    del backend

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([], tf.int32),
        ]
    )
    def dynamic(x, k):
        return tfgc.ops.top_k_sample(x, k)

    with pytest.raises(tf.errors.InvalidArgumentError, match="k"):
        dynamic(tf.ones([10]), tf.constant(k))

    @tf.function
    def static(x):
        return tfgc.ops.top_k_sample(x, k)

    with pytest.raises(tf.errors.InvalidArgumentError, match="k"):
        static(tf.ones([10]))


def test_non_scalar_k_raises(backend):
    del backend
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar"):
        tfgc.ops.top_k_sample(tf.ones([10]), tf.constant([1, 2]))


def test_bad_python_arguments(backend):
    del backend
    with pytest.raises(ValueError, match="mode"):
        tfgc.ops.top_k_sample(tf.ones([10]), 1, mode="radix")
    with pytest.raises(ValueError, match="rounds"):
        tfgc.ops.top_k_sample(tf.ones([10]), 1, rounds=0)
    with pytest.raises(TypeError, match="dtype"):
        tfgc.ops.top_k_sample(tf.ones([10], tf.int32), 1)


def test_static_shape_in_tf_function(backend):
    del backend

    @tf.function
    def f(x):
        v, i = tfgc.ops.top_k_sample(x, 5, mode="mstopk")
        assert v.shape.as_list() in ([5], [None])
        return v, i

    v, i = f(gaussian(100))
    assert i.shape == [5]


def test_not_differentiable(custom_lib):
    del custom_lib
    x = tf.Variable(gaussian(100))
    with tf.GradientTape() as tape:
        v, _ = tfgc.ops.top_k_sample(x, 5)
        loss = tf.reduce_sum(v)
    assert tape.gradient(loss, x) is None


def test_output_shape_is_static_with_custom_op(custom_lib):
    del custom_lib

    @tf.function
    def f(x):
        v, i = tfgc.ops.top_k_sample(x, 5, mode="mstopk")
        assert v.shape.as_list() == [5] and i.shape.as_list() == [5]
        t, _ = tfgc.ops.top_k_sample(x, 5, mode="threshold")
        assert t.shape.as_list() == [None]
        return v

    f(gaussian(100))


@property_settings(max_examples=40)
@given(
    shape=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    frac=st.floats(0.0, 1.0),
    mode=st.sampled_from(MODES),
    seed=st.integers(-(2**63), 2**63 - 1),
    ties=st.booleans(),
    data_seed=st.integers(0, 2**32 - 1),
)
def test_property_random_shapes(
    backend, shape, frac, mode, seed, ties, data_seed
):
    del backend
    rng = np.random.default_rng(data_seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if ties:
        x = np.round(x)
    n = x.size
    k = int(round(frac * n))
    xt = tf.constant(x)
    v, i = tfgc.ops.top_k_sample(xt, k, mode=mode, seed=seed)
    check_selection(xt, v, i, k, mode)
    np.testing.assert_array_equal(i.numpy(), np_select(x, k, mode, seed=seed))


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_ten_million(backend, mode):
    del backend
    n = 10_000_000
    x = gaussian(n, seed=5)
    k = n // 1000
    v, i = tfgc.ops.top_k_sample(x, k, mode=mode, seed=2)
    check_selection(x, v, i, k, mode)
    np.testing.assert_array_equal(
        i.numpy(), np_select(x.numpy(), k, mode, 20, 2)
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data", ["gaussian", "laplace", "ties"])
def test_large_inputs_match_numpy(backend, mode, data):
    """Inputs above 256 Ki elements take the sampled-prediction path."""
    del backend
    n = 1 << 20
    rng = np.random.default_rng(11)
    if data == "gaussian":
        x = rng.standard_normal(n)
    elif data == "laplace":
        x = rng.laplace(size=n)
    else:
        x = np.round(rng.standard_normal(n) * 2)
    x = x.astype(np.float32)
    for k in [1, 700, 1049, 10_000, 300_000]:
        _, i = tfgc.ops.top_k_sample(tf.constant(x), k, mode=mode, seed=k)
        np.testing.assert_array_equal(
            i.numpy(), np_select(x, k, mode, seed=k), err_msg=f"k={k}"
        )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data", HOSTILE)
def test_sampled_floor_retries_match_numpy(custom_lib, mode, data):
    """Whatever the sample predicts, the selection is the specification's:
    a floor that is too high is lowered (to the bisection's lo threshold,
    to the lowest threshold it visited, or to 0), never trusted."""
    del custom_lib
    n = 1 << 19
    x = hostile(data, n)
    for k in [1, 524, 5243, 26_000]:
        for rounds in [3, 20]:
            _, i = tfgc.ops.top_k_sample(
                tf.constant(x), k, mode=mode, seed=k, rounds=rounds
            )
            np.testing.assert_array_equal(
                i.numpy(),
                np_select(x, k, mode, rounds=rounds, seed=k),
                err_msg=f"k={k} rounds={rounds}",
            )


@pytest.mark.parametrize("mode", MODES)
def test_sampled_floor_with_residual(custom_lib, mode):
    """The fused first pass writes acc = gradient + residual while it
    compacts; the sample reads acc before it is written."""
    del custom_lib
    n = 1 << 19
    g = hostile("sample_too_high", n)
    r = hostile("outlier", n) * np.float32(0.5)
    acc = g + r
    for k in [0, 700, 26_000]:
        v, i, new_r = tfgc.ops.top_k_sample(
            tf.constant(g), k, mode=mode, seed=k, residual=tf.constant(r)
        )
        want = np_select(acc, k, mode, seed=k)
        np.testing.assert_array_equal(i.numpy(), want)
        np.testing.assert_array_equal(v.numpy(), acc[want])
        expect = acc.copy()
        expect[want] = 0
        np.testing.assert_array_equal(new_r.numpy(), expect)


def _live_bytes():
    """Resident memory after glibc gave its free heap back to the system,
    so what is freed does not count."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(
    not os.path.exists("/proc/self/statm"), reason="needs Linux and glibc"
)
def test_candidates_are_not_kept_after_a_huge_call(custom_lib):
    """A call that makes every element a candidate (the exact top-k with k
    above the nonzeros: zeros are selected) must not leave ~20 bytes per
    element with the kernel."""
    del custom_lib
    n = 1 << 23
    x = tf.constant(hostile("mostly_zero", n))
    k = n // 20
    tfgc.ops.top_k_sample(x, 10, mode="trimmed")  # the kernel exists
    before = _live_bytes()
    for _ in range(2):
        v, i = tfgc.ops.top_k_sample(x, k, mode="trimmed")
        del v, i
    grown = _live_bytes() - before
    assert grown < 40 * 2**20, f"the process grew by {grown / 2**20:.0f} MiB"
