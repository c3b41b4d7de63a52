"""Tests of tfgc.ops.top_k_sample_segments: each segment as TopKSample alone.

Every test with the `backend` fixture runs the compiled op and the pure-TF
reference; the oracle of each segment is `top_k_sample` on the segment alone
(same backend) and the numpy specification `np_select`.
"""

import importlib

import numpy as np
import pytest
import tensorflow as tf

import tfgc.ops
from custom_ops.cuda_harness.numpy_oracle import np_select, np_select_segments
from custom_ops.cuda_harness.run_harness import (
    resnet50_segments,
    segment_part,
)
from tests.ops.selection_data import hostile, mixed_subnormals

tkss = importlib.import_module("tfgc.ops.top_k_sample_segments")

MODES = ("mstopk", "threshold", "trimmed")
DTYPES = [tf.float32, tf.float16, tf.bfloat16]


def as_float32(x):
    return tf.cast(x, tf.float32).numpy()


def bits(x):
    """float32 bit patterns of a tensor (exact in float32 for every dtype),
    so that NaNs compare equal when their payloads are."""
    return as_float32(x).view(np.uint32)


def split(selection):
    """Per-segment (values, indices) of a SegmentSelection."""
    sizes = selection.sizes.numpy()
    ends = np.cumsum(sizes)
    return [
        (selection.values[e - s : e], selection.indices[e - s : e])
        for s, e in zip(sizes, ends)
    ]


def check_against_single(x, sizes, ks, seeds, mode, got, numpy_too=True):
    """Each segment of `got` is what top_k_sample selects on it alone (same
    backend), bit for bit, and what numpy's specification selects."""
    flat = tf.reshape(x, [-1])
    assert got.sizes.dtype == tf.int64 and got.sizes.shape == [len(sizes)]
    assert got.indices.dtype == tf.int32 and got.values.dtype == x.dtype
    parts = split(got)
    offset = 0
    for i, (n, k, seed) in enumerate(zip(sizes, ks, seeds)):
        seg = flat[offset : offset + n]
        want_v, want_i = tfgc.ops.top_k_sample(seg, k, mode=mode, seed=seed)
        v, idx = parts[i]
        msg = f"segment {i}: n={n} k={k} seed={seed} {mode}"
        np.testing.assert_array_equal(idx.numpy(), want_i.numpy(), msg)
        np.testing.assert_array_equal(bits(v), bits(want_v), msg)
        if numpy_too:
            want = np_select(as_float32(seg), k, mode, seed=seed)
            np.testing.assert_array_equal(idx.numpy(), want, msg)
        if mode != "threshold":
            assert idx.shape[0] == k, msg
        offset += n


def mixed(dtype, seed=0):
    """Segments of every kind of segment_part (NaN and Inf, ties, equal,
    zeros, subnormals, an outlier, 98 % zeros, heavy tails) and sizes,
    with n = 0, k = 0, k = 1, k = n - 1 and k = n among them."""
    rng = np.random.default_rng(seed)
    sizes = [5, 0, 1, 33, 1000, 0, 4097, 64, 2, 300, 12_000, 7]
    parts = [segment_part(rng, n, i) for i, n in enumerate(sizes)]
    ks = [2, 0, 1, 0, 10, 0, 40, 64, 1, 299, 6000, 7]
    seeds = [int(s) for s in rng.integers(-(2**62), 2**62, len(sizes))]
    x = tf.constant(np.concatenate(parts), dtype)
    return x, sizes, ks, seeds


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_each_segment_matches_single_op(backend, mode, dtype):
    del backend
    x, sizes, ks, seeds = mixed(dtype)
    got = tfgc.ops.top_k_sample_segments(x, ks, seeds, sizes, mode=mode)
    assert isinstance(got, tfgc.ops.SegmentSelection)
    check_against_single(x, sizes, ks, seeds, mode, got)


@pytest.mark.parametrize("mode", MODES)
def test_k_equals_n_everywhere(backend, mode):
    del backend
    sizes = [3, 0, 17, 1, 100]
    x = tf.constant(np.random.default_rng(2).standard_normal(121), tf.float32)
    got = tfgc.ops.top_k_sample_segments(x, sizes, [0] * 5, sizes, mode=mode)
    want = np.concatenate([np.arange(n) for n in sizes])
    np.testing.assert_array_equal(got.indices.numpy(), want)
    np.testing.assert_array_equal(got.values.numpy(), x.numpy())
    np.testing.assert_array_equal(got.sizes.numpy(), sizes)


@pytest.mark.parametrize("mode", MODES)
def test_no_segment_and_only_empty_ones(backend, mode):
    del backend
    got = tfgc.ops.top_k_sample_segments(
        tf.zeros([0]), tf.zeros([0], tf.int32), tf.zeros([0], tf.int64), []
    )
    assert got.values.shape == [0] and got.sizes.shape == [0]
    x = tf.ones([9])
    got = tfgc.ops.top_k_sample_segments(
        x, [0, 0, 0], [1, 2, 3], [0, 9, 0], mode=mode
    )
    assert got.values.shape == [0] and got.indices.shape == [0]
    np.testing.assert_array_equal(got.sizes.numpy(), [0, 0, 0])


@pytest.mark.parametrize("mode", MODES)
def test_resnet50_like_many_small_segments(backend, mode):
    """ResNet-50's 161 tensors (those above 4096 elements divided by 256),
    k at 1 %, float32."""
    del backend
    x, rows = resnet50_segments(256, np.random.default_rng(3))
    sizes = rows[:, 1].tolist()
    ks, seeds = rows[:, 2].tolist(), rows[:, 3].tolist()
    got = tfgc.ops.top_k_sample_segments(
        tf.constant(x), tf.constant(ks, tf.int64), seeds, sizes, mode=mode
    )
    assert got.sizes.shape == [161]
    want = np_select_segments(x, rows, mode)
    parts = split(got)
    for i, (w, (v, idx)) in enumerate(zip(want, parts)):
        off = rows[i, 0]
        np.testing.assert_array_equal(idx.numpy(), w, f"segment {i}")
        np.testing.assert_array_equal(v.numpy(), x[off + w], f"segment {i}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_subnormals_and_zeros(backend, mode, dtype):
    del backend
    rng = np.random.default_rng(4)
    sizes = [40, 1, 0, 257, 90]
    x = np.concatenate(
        [
            mixed_subnormals(rng.integers(0, 6, n), dtype, i)
            for i, n in enumerate(sizes)
        ]
    )
    ks = [7, 1, 0, 100, 90]
    seeds = [11, 12, 13, 14, 15]
    xt = tf.constant(x, dtype)
    got = tfgc.ops.top_k_sample_segments(xt, ks, seeds, sizes, mode=mode)
    check_against_single(xt, sizes, ks, seeds, mode, got)


@pytest.mark.parametrize("mode", MODES)
def test_hostile_data(custom_lib, mode):
    """The CPU kernel's sampled floor and its retries (segments above
    256 Ki elements), next to small segments."""
    del custom_lib
    n = 1 << 18
    parts = [hostile(name, n) for name in ("outlier", "sample_too_low")]
    parts += [hostile("two_values", 1000), hostile("mostly_zero", n)]
    sizes = [p.size for p in parts]
    x = tf.constant(np.concatenate(parts))
    for rounds in (3, 20):
        ks = [1, 2600, 17, 26_000]
        seeds = [5, 6, 7, 8]
        got = tfgc.ops.top_k_sample_segments(
            x, ks, seeds, sizes, mode=mode, rounds=rounds
        )
        want = np_select_segments(
            x.numpy(),
            [
                (sum(sizes[:i]), n, k, s)
                for i, (n, k, s) in enumerate(zip(sizes, ks, seeds))
            ],
            mode,
            rounds,
        )
        for i, (w, (_, idx)) in enumerate(zip(want, split(got))):
            np.testing.assert_array_equal(idx.numpy(), w, f"segment {i}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_custom_equals_reference(custom_lib, mode, dtype):
    del custom_lib
    x, sizes, ks, seeds = mixed(dtype, seed=5)
    r = tf.constant(np.random.default_rng(6).standard_normal(x.shape[0]), dtype)
    got = tfgc.ops.top_k_sample_segments(
        x, ks, seeds, sizes, mode=mode, residual=r
    )
    want = tkss.top_k_sample_segments_reference(
        x, ks, seeds, sizes, mode=mode, residual=r
    )
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(
            bits(g) if g.dtype.is_floating else g.numpy(),
            bits(w) if w.dtype.is_floating else w.numpy(),
        )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_residual_variant(backend, mode, dtype):
    del backend
    x, sizes, ks, seeds = mixed(dtype, seed=7)
    r = tf.constant(np.random.default_rng(8).standard_normal(x.shape[0]), dtype)
    got = tfgc.ops.top_k_sample_segments(
        x, ks, seeds, sizes, mode=mode, residual=r
    )
    assert isinstance(got, tfgc.ops.SegmentSelectionWithResidual)
    acc = x + r  # TensorFlow's add, as both builds take it
    plain = tfgc.ops.top_k_sample_segments(acc, ks, seeds, sizes, mode=mode)
    check_against_single(acc, sizes, ks, seeds, mode, got, numpy_too=False)
    np.testing.assert_array_equal(got.indices.numpy(), plain.indices.numpy())
    expect = as_float32(acc)
    offsets = np.repeat(np.cumsum([0] + sizes[:-1]), got.sizes.numpy())
    expect[got.indices.numpy() + offsets] = 0
    assert got.new_residual.dtype == dtype
    np.testing.assert_array_equal(as_float32(got.new_residual), expect)


def test_int64_k_and_tensor_seeds(backend):
    del backend
    x, sizes, ks, seeds = mixed(tf.float32, seed=9)
    a = tfgc.ops.top_k_sample_segments(x, ks, seeds, sizes)
    b = tfgc.ops.top_k_sample_segments(
        x, tf.constant(ks, tf.int64), tf.constant(seeds, tf.int64), sizes
    )
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_static_shapes_in_tf_function(backend):
    del backend
    sizes = [10, 20, 30]

    @tf.function
    def f(x):
        exact = tfgc.ops.top_k_sample_segments(x, [1, 2, 3], [0, 0, 0], sizes)
        assert exact.values.shape.as_list() == [6]
        assert exact.indices.shape.as_list() == [6]
        assert exact.sizes.shape.as_list() == [3]
        t = tfgc.ops.top_k_sample_segments(
            x, [1, 2, 3], [0, 0, 0], sizes, mode="threshold"
        )
        assert t.values.shape.as_list() == [None]
        return exact.indices

    assert f(tf.ones([60])).shape == [6]


def test_dynamic_k_in_tf_function(backend):
    del backend

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([None], tf.int32),
        ]
    )
    def f(x, k):
        return tfgc.ops.top_k_sample_segments(
            x, k, [1, 2], [4, 6], mode="trimmed"
        )

    x = tf.constant(np.arange(10, dtype=np.float32))
    got = f(x, tf.constant([2, 3]))
    np.testing.assert_array_equal(got.indices.numpy(), [2, 3, 3, 4, 5])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"k\[i\]"):
        f(x, tf.constant([2, 7]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`k`"):
        f(x, tf.constant([2, 3, 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="add up"):
        f(tf.ones([11]), tf.constant([2, 3]))


def test_bad_python_arguments(backend):
    del backend
    x = tf.ones([10])
    run = tfgc.ops.top_k_sample_segments
    with pytest.raises(ValueError, match=r"k\[1\]=7, segment_sizes\[1\]=6"):
        run(x, [1, 7], [0, 0], [4, 6])
    with pytest.raises(ValueError, match=r"k\[0\]=-1"):
        run(x, [-1, 1], [0, 0], [4, 6])
    with pytest.raises(ValueError, match=r"sum\(segment_sizes\)=9"):
        run(x, [1, 1], [0, 0], [4, 5])
    with pytest.raises(ValueError, match="`k` must be a vector"):
        run(x, [1, 1, 1], [0, 0], [4, 6])
    with pytest.raises(ValueError, match="`seeds` must be a vector"):
        run(x, [1, 1], [0], [4, 6])
    with pytest.raises(ValueError, match=r"segment_sizes\[1\]=-6"):
        run(x, [1, 1], [0, 0], [16, -6])
    with pytest.raises(ValueError, match=r"2\^31"):
        run(x, [1, 1], [0, 0], [4, 2**31])
    with pytest.raises(TypeError, match="segment_sizes"):
        run(x, [1, 1], [0, 0], [4.0, 6])
    with pytest.raises(TypeError, match="segment_sizes"):
        run(x, [1, 1], [0, 0], tf.constant([4, 6]))
    with pytest.raises(ValueError, match="mode"):
        run(x, [1, 1], [0, 0], [4, 6], mode="radix")
    with pytest.raises(ValueError, match="rounds"):
        run(x, [1, 1], [0, 0], [4, 6], rounds=0)
    with pytest.raises(ValueError, match="residual"):
        run(x, [1, 1], [0, 0], [4, 6], residual=tf.ones([11]))


def test_kernel_rejects_bad_input(custom_lib):
    """The kernel's own checks (OP_REQUIRES), with the values: the raw op,
    past the Python checks."""
    op = custom_lib.tfgc_top_k_sample_segments
    x = tf.ones([10])
    cases = [
        (([1, 7], [0, 0]), [4, 6], r"k\[1\]=7, segment_sizes\[1\]=6"),
        (([1, -1], [0, 0]), [4, 6], r"k\[1\]=-1"),
        (([1, 1], [0, 0]), [4, 5], r"sum\(segment_sizes\)=9"),
        (([1, 1, 1], [0, 0, 0]), [4, 6], r"len\(segment_sizes\)=2"),
        (([1, 1], [0]), [4, 6], r"seeds.shape=\[1\]"),
        (([1, 1], [0, 0]), [16, -6], r"segment_sizes\[1\]=-6"),
        (([1, 1], [0, 0]), [4, 2**31], r"segment_sizes\[1\]=2147483648"),
    ]
    for (k, seeds), sizes, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            op(x, k, seeds, segment_sizes=sizes)
    with pytest.raises(tf.errors.InvalidArgumentError, match="same shape"):
        custom_lib.tfgc_top_k_sample_segments_with_residual(
            x, tf.ones([11]), [1, 1], [0, 0], segment_sizes=[4, 6]
        )


def test_not_differentiable(custom_lib):
    del custom_lib
    x = tf.Variable(tf.ones([10]))
    with tf.GradientTape() as tape:
        got = tfgc.ops.top_k_sample_segments(x, [1, 1], [0, 0], [4, 6])
        loss = tf.reduce_sum(got.values)
    assert tape.gradient(loss, x) is None


def test_xla_uses_the_reference_and_refuses_threshold():
    @tf.function(jit_compile=True)
    def exact(x):
        return tfgc.ops.top_k_sample_segments(
            x, [1, 2], [3, 4], [4, 6], mode="trimmed"
        )

    x = tf.constant(np.arange(10, dtype=np.float32))
    np.testing.assert_array_equal(exact(x).indices.numpy(), [3, 4, 5])

    @tf.function(jit_compile=True)
    def threshold(x):
        return tfgc.ops.top_k_sample_segments(
            x, [1, 2], [3, 4], [4, 6], mode="threshold"
        )

    with pytest.raises(ValueError, match="XLA"):
        threshold(x)
