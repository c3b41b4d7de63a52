"""Tests of tfgc.ops.scatter_add_sum: custom op vs reference vs numpy."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfgc.ops
from tfgc.compressors import _sparse
from tfgc.ops import scatter

FLOATS = [tf.float32, tf.float16, tf.bfloat16]
# The CPU kernel works in tiles of 2^14 elements: sizes around tile edges.
SIZES = [0, 1, 2, 7, 255, 256, 257, 16383, 16384, 16385, 65537, 1_000_003]
INVALID = tf.errors.InvalidArgumentError


@pytest.fixture
def backend(backend):
    """conftest's backend; skips "custom" if the library predates the op."""
    if backend == "custom" and scatter._custom_op() is None:
        pytest.skip("the custom-op library was built without ScatterAddSum")
    return backend


def payload(n, m, seed, workers=1, dtype=tf.float32):
    """`workers` rows of m unique positions each (overlapping across rows)."""
    rng = np.random.default_rng(seed)
    m = min(m, n)
    rows = [rng.choice(n, m, replace=False) for _ in range(workers)]
    idx = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0)
    vals = rng.standard_normal(idx.size).astype(np.float32)
    # Round to the dtype first, so every oracle sees the same inputs.
    vals = tf.cast(tf.cast(vals, dtype), tf.float32).numpy()
    return vals, idx.astype(np.int32)


def serial_float32(vals, idx, n):
    """float32 sums in input order: what the CPU kernel computes exactly."""
    out = np.zeros(n, np.float32)
    np.add.at(out, idx, vals.astype(np.float32))
    return out


def exact(vals, idx, n):
    """float64 oracle (exact for these sizes up to float64's rounding)."""
    out = np.zeros(n, np.float64)
    np.add.at(out, idx, vals.astype(np.float64))
    return out


def as_f64(t):
    return tf.cast(t, tf.float64).numpy()


def within_final_rounding(got, vals, idx, n, dtype):
    """got is the exact sum, rounded once to `dtype`, up to float32's error.

    float32 sums of c values have an error of at most (c - 1) 2^-24 times
    the sum of their magnitudes; rounding to `dtype` adds half an ulp.
    """
    want = exact(vals, idx, n)
    count = np.bincount(idx, minlength=n)
    f32_error = count * 2.0**-24 * exact(np.abs(vals), idx, n)
    mant, emin = {
        tf.float32: (23, -126),
        tf.float16: (10, -14),
        tf.bfloat16: (7, -126),
    }[dtype]
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(np.abs(want) + f32_error))
    half_ulp = np.exp2(np.maximum(exponent, emin) - mant - 1)
    np.testing.assert_array_less(np.abs(got - want), half_ulp + f32_error)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", SIZES)
def test_matches_numpy_and_reference(backend, dtype, n):
    del backend
    vals, idx = payload(n, max(1, n // 50), seed=n, workers=3, dtype=dtype)
    got = tfgc.ops.scatter_add_sum(tf.cast(vals, dtype), idx, n)
    assert got.dtype == dtype and got.shape == [n]
    # float32 accumulation in input order, rounded once to the dtype.
    want = tf.cast(serial_float32(vals, idx, n), dtype)
    np.testing.assert_array_equal(as_f64(got), as_f64(want))
    ref = scatter.scatter_add_sum_reference(tf.cast(vals, dtype), idx, n)
    np.testing.assert_array_equal(as_f64(got), as_f64(ref))
    within_final_rounding(as_f64(got), vals, idx, n, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [3, 50_000])  # dense and sparse CPU tiles
def test_many_duplicates_round_once(backend, dtype, n):
    """1 + 1000 * 2^-12: float16 per-add rounding would give exactly 1."""
    del backend
    small = 2.0**-12 if dtype == tf.float16 else 2.0**-9
    vals = np.array([1.0] + [small] * 1000 + [3.0], np.float32)
    idx = np.array([0] * 1001 + [n - 1], np.int32)
    got = as_f64(tfgc.ops.scatter_add_sum(tf.cast(vals, dtype), idx, n))
    assert got[0] > 1.0
    within_final_rounding(got, vals, idx, n, dtype)
    np.testing.assert_array_equal(got[1:-1], 0.0)
    assert got[-1] == 3.0


@pytest.mark.parametrize("n", [1, 100, 40_000])
def test_all_values_at_one_index_and_long_input(backend, n):
    del backend
    rng = np.random.default_rng(n)
    m = 70_000  # more than one input chunk of the CPU kernel
    idx = rng.integers(0, n, m).astype(np.int32)
    idx[: m // 2] = n - 1
    vals = rng.standard_normal(m).astype(np.float32)
    got = tfgc.ops.scatter_add_sum(vals, idx, n).numpy()
    np.testing.assert_array_equal(got, serial_float32(vals, idx, n))


def test_empty_values(backend):
    del backend
    empty = tf.zeros([0], tf.float32)
    no_idx = tf.zeros([0], tf.int32)
    for n in (0, 5, 100_000):
        got = tfgc.ops.scatter_add_sum(empty, no_idx, n)
        assert got.shape == [n]
        np.testing.assert_array_equal(got.numpy(), np.zeros(n, np.float32))


def test_n_as_int64_tensor_and_signed_zero(backend):
    del backend
    got = tfgc.ops.scatter_add_sum(
        tf.constant([-0.0, 2.5, -2.5]),
        tf.constant([1, 3, 3]),
        tf.constant(5, tf.int64),
    )
    np.testing.assert_array_equal(got.numpy(), [0, 0, 0, 0, 0])
    assert not np.signbit(got.numpy()).any()  # sums start from +0


def test_nan_and_inf_propagate(backend):
    del backend
    vals = tf.constant([np.nan, 1.0, np.inf, 1.0, np.inf, -np.inf])
    got = tfgc.ops.scatter_add_sum(vals, tf.constant([0, 0, 1, 1, 2, 2]), 4)
    np.testing.assert_array_equal(got.numpy(), [np.nan, np.inf, np.nan, 0])


def test_deterministic(backend):
    del backend
    vals, idx = payload(300_000, 30_000, seed=5, workers=8)
    first = tfgc.ops.scatter_add_sum(vals, idx, 300_000).numpy()
    for _ in range(3):
        again = tfgc.ops.scatter_add_sum(vals, idx, 300_000).numpy()
        np.testing.assert_array_equal(
            again.view(np.int32), first.view(np.int32)
        )


@pytest.mark.parametrize(
    "idx, n, match",
    [
        ([0, 5, 10], 10, r"indices\[2\]=10 with n=10"),
        ([3, -1, 2, -7], 10, r"indices\[1\]=-1 with n=10"),
        ([0], 0, r"indices\[0\]=0 with n=0"),
    ],
)
def test_out_of_range_index_raises(backend, idx, n, match):
    del backend
    vals = tf.ones([len(idx)])
    with pytest.raises(INVALID, match=match):
        tfgc.ops.scatter_add_sum(vals, tf.constant(idx, tf.int32), n)

    @tf.function(
        input_signature=[
            tf.TensorSpec(None, tf.float32),
            tf.TensorSpec(None, tf.int32),
            tf.TensorSpec(None, tf.int64),
        ]
    )
    def traced(v, i, size):
        return tfgc.ops.scatter_add_sum(v, i, size)

    with pytest.raises(INVALID, match=match):
        traced(vals, tf.constant(idx, tf.int32), tf.constant(n, tf.int64))


BAD_SHAPES = [
    (tf.ones([2, 2]), tf.zeros([4], tf.int32), 3, "vector"),
    (tf.ones([3]), tf.zeros([3, 1], tf.int32), 3, "vector"),
    (tf.ones([3]), tf.zeros([4], tf.int32), 3, "same length"),
    (tf.ones([3]), tf.zeros([3], tf.int32), [3], "scalar"),
    (tf.ones([3]), tf.zeros([3], tf.int32), -1, "non-negative"),
]


@pytest.mark.parametrize("values, indices, n, match", BAD_SHAPES)
def test_bad_arguments_raise_in_eager(backend, values, indices, n, match):
    del backend
    with pytest.raises(INVALID, match=match):
        tfgc.ops.scatter_add_sum(values, indices, n)


@pytest.mark.parametrize("values, indices, n, match", BAD_SHAPES)
def test_bad_arguments_raise_in_tf_function(backend, values, indices, n, match):
    """Static shapes (checked when tracing) and dynamic ones (at run time)."""
    del backend
    n = tf.constant(n, tf.int64)

    @tf.function
    def static(v, i, size):
        return tfgc.ops.scatter_add_sum(v, i, size)

    with pytest.raises(INVALID, match=match):
        static(values, indices, n)

    @tf.function(
        input_signature=[
            tf.TensorSpec(None, tf.float32),
            tf.TensorSpec(None, tf.int32),
            tf.TensorSpec(None, tf.int64),
        ]
    )
    def dynamic(v, i, size):
        return tfgc.ops.scatter_add_sum(v, i, size)

    with pytest.raises(INVALID, match=match):
        dynamic(values, indices, n)


def test_kernel_validates_dynamic_shapes(custom_lib):
    """The op itself, without the wrapper's static checks."""
    op = getattr(custom_lib, "tfgc_scatter_add_sum", None)
    if op is None:
        pytest.skip("the custom-op library was built without ScatterAddSum")

    @tf.function(
        input_signature=[
            tf.TensorSpec(None, tf.float32),
            tf.TensorSpec(None, tf.int32),
            tf.TensorSpec(None, tf.int32),
        ]
    )
    def run(v, i, size):
        return op(v, i, size)

    for values, indices, n, match in BAD_SHAPES:
        with pytest.raises(INVALID, match=match):
            run(values, indices, tf.constant(n))
    with pytest.raises(INVALID, match=r"indices\[1\]=9 with n=4"):
        run(tf.ones([2]), tf.constant([0, 9]), tf.constant(4))
    np.testing.assert_array_equal(
        run(tf.ones([2]), tf.constant([3, 3]), tf.constant(4)).numpy(),
        [0, 0, 0, 2],
    )


def test_shape_inference(custom_lib):
    op = getattr(custom_lib, "tfgc_scatter_add_sum", None)
    if op is None:
        pytest.skip("the custom-op library was built without ScatterAddSum")

    @tf.function
    def f(v, i, size):
        known = op(v, i, 7)
        assert known.shape.as_list() == [7]
        unknown = op(v, i, size)
        assert unknown.shape.as_list() == [None]
        return known, unknown

    f(tf.ones([3]), tf.constant([0, 1, 2]), tf.constant(7))

    @tf.function
    def mismatched(v, i):
        return op(v, i, 7)

    with pytest.raises(ValueError):  # shape inference, when tracing
        mismatched(tf.ones([3]), tf.constant([0, 1]))


def test_type_errors(backend):
    del backend
    with pytest.raises(TypeError, match="float32"):
        tfgc.ops.scatter_add_sum(tf.ones([2], tf.float64), [0, 1], 2)
    with pytest.raises(TypeError, match="int32"):
        tfgc.ops.scatter_add_sum(tf.ones([2]), tf.constant([0, 1], tf.int64), 2)
    with pytest.raises(TypeError, match="`n`"):
        tfgc.ops.scatter_add_sum(tf.ones([2]), [0, 1], 2.0)


def test_not_differentiable(backend):
    """Registered without a gradient (the reference has one; the op not)."""
    if backend == "reference":
        pytest.skip("the pure-TF reference is differentiable")
    values = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        out = tfgc.ops.scatter_add_sum(values, [0, 0], 1)
    assert tape.gradient(out, values) is None


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_sparse_scatter_sum_uses_it(backend, dtype):
    """The compressors' helper: [workers, k] payloads, cast to `dtype`."""
    del backend
    vals, idx = payload(1000, 40, seed=1, workers=4, dtype=dtype)
    got = _sparse.scatter_sum(
        tf.reshape(tf.cast(vals, dtype), [4, 40]),
        tf.reshape(idx, [4, 40]),
        1000,
        dtype,
    )
    assert got.dtype == dtype and got.shape == [1000]
    want = tf.cast(serial_float32(vals, idx, 1000), dtype)
    np.testing.assert_array_equal(as_f64(got), as_f64(want))


def test_sparse_scatter_sum_other_dtypes():
    got = _sparse.scatter_sum(
        tf.constant([[1.0, 2.0]], tf.float64),
        tf.constant([[1, 1]], tf.int64),
        3,
        tf.float64,
    )
    np.testing.assert_array_equal(got.numpy(), [0.0, 3.0, 0.0])


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("m, n", [(0, 5), (1, 1), (5000, 300), (3000, 3000)])
def test_ordered_segment_sum_gpu_path_equals_cpu_op(
    monkeypatch, dtype, id_dtype, m, n
):
    """The rank-by-rank sum TF takes where it sees a GPU, run on the CPU:
    the CPU kernel's input-order sums, bit for bit, eager and traced."""
    monkeypatch.setattr(scatter, "_gpu_visible", lambda: True)
    rng = np.random.default_rng(m + n)
    idx = tf.constant(rng.integers(0, n, m), id_dtype)
    magnitudes = 2.0 ** rng.integers(-20, 21, m)
    vals = tf.constant(rng.standard_normal(m) * magnitudes, dtype)
    want = tf.math.unsorted_segment_sum(vals, idx, n).numpy()
    for fn in (
        scatter.ordered_segment_sum,
        tf.function(scatter.ordered_segment_sum),
    ):
        got = fn(vals, idx, n).numpy()
        assert got.dtype == want.dtype and got.shape == (n,)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_reference_gpu_path_equals_serial_float32(monkeypatch):
    monkeypatch.setattr(scatter, "_gpu_visible", lambda: True)
    vals, idx = payload(1000, 300, seed=3, workers=5)
    # Element 1000: 2^24 + 1 rounds to 2^24, so the order shows (0, not 1).
    vals = np.concatenate([[2.0**24, 1.0, -(2.0**24)], vals]).astype("f4")
    idx = np.concatenate([[1000] * 3, idx]).astype(np.int32)
    got = scatter.scatter_add_sum_reference(vals, idx, 1001).numpy()
    want = serial_float32(vals, idx, 1001)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    assert got[1000] == 0.0


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    n=st.integers(0, 40_000),
    m=st.integers(0, 3000),
    dtype=st.sampled_from(FLOATS),
    data_seed=st.integers(0, 2**32 - 1),
)
def test_property_matches_numpy(backend, n, m, dtype, data_seed):
    del backend
    rng = np.random.default_rng(data_seed)
    m = m if n > 0 else 0
    # Few distinct positions, so duplicates are common.
    spread = int(rng.integers(1, n + 1)) if n else 1
    idx = rng.integers(0, spread, m).astype(np.int32)
    vals = rng.standard_normal(m).astype(np.float32)
    vals = tf.cast(tf.cast(vals, dtype), tf.float32).numpy()
    got = tfgc.ops.scatter_add_sum(tf.cast(vals, dtype), idx, n)
    want = tf.cast(serial_float32(vals, idx, n), dtype)
    np.testing.assert_array_equal(as_f64(got), as_f64(want))
    within_final_rounding(as_f64(got), vals, idx, n, dtype)
