"""ErrorFeedback's fused path (`compress_with_residual`) against the generic.

The fused path must be invisible except in speed: same payload, same
residual, same total as x + residual -> compress -> subtract the local
estimate. It is checked with the compiled ops loaded (fused) and with them
switched off (`TFGC_DISABLE_CUSTOM_OPS`, where ErrorFeedback must take the
generic path itself).
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import backends
from tfgc import compressors, ops
from tfgc.compressors.error_feedback import ErrorFeedbackState
from tfgc.core import wire
from tfgc.core.compressor import NoState

FUSED_OP = "Tfgc>TopKSampleWithResidual"

# (shape, density): n = 1; k = 1; k = n; a few sizes between.
CASES = [
    ((1,), 1.0),
    ((37,), 0.01),
    ((37,), 1.0),
    ((64, 33), 0.1),
    ((8, 3, 3, 4), 0.3),
    ((5000,), 0.001),
]
DTYPES = [tf.float32, tf.float16, tf.bfloat16]


@pytest.fixture
def library_on(monkeypatch):
    backends.use("custom", monkeypatch)


@pytest.fixture
def library_off(monkeypatch):
    backends.use("reference", monkeypatch)


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return tf.cast(rng.normal(size=shape).astype("float32"), dtype)


def _gathered(payload):
    return tf.nest.map_structure(lambda t: t[None], payload)


def _ef_step(compressor, x, residual):
    """One ErrorFeedback step for one worker: (payload, total, residual)."""
    ef = compressors.ErrorFeedback(compressor)
    state = ErrorFeedbackState(residual, NoState())
    payload, ctx = ef.compress(x, state, tf.constant([1, 2], tf.int64))
    total, new_state = ef.decompress(_gathered(payload), ctx)
    return payload, total, new_state.residual


def _generic_step(compressor, x, residual):
    """The same step spelled out, as ErrorFeedback did before fusing."""
    corrected = x + tf.cast(residual, x.dtype)
    payload, ctx = compressor.compress(corrected, NoState(), None)
    total, _ = compressor.decompress(_gathered(payload), ctx)
    sent = compressor.local_estimate(payload, ctx)
    return payload, total, corrected - sent


def _by_index(payload):
    order = np.argsort(payload.indices.numpy())
    values = tf.cast(payload.values, tf.float32).numpy()[order]
    return payload.indices.numpy()[order], values


def _assert_same(a, b, exact_order=True):
    payload_a, total_a, residual_a = a
    payload_b, total_b, residual_b = b
    if exact_order:
        np.testing.assert_array_equal(
            payload_a.indices.numpy(), payload_b.indices.numpy()
        )
    idx_a, val_a = _by_index(payload_a)
    idx_b, val_b = _by_index(payload_b)
    np.testing.assert_array_equal(idx_a, idx_b)
    np.testing.assert_array_equal(val_a, val_b)
    assert payload_a.values.dtype == payload_b.values.dtype
    for ta, tb in ((total_a, total_b), (residual_a, residual_b)):
        assert ta.dtype == tb.dtype
        assert ta.shape == tb.shape
        np.testing.assert_array_equal(
            tf.cast(ta, tf.float32).numpy(), tf.cast(tb, tf.float32).numpy()
        )


def _steps(compressor, shape, dtype, step_fn, residual_dtype=None):
    """Three steps from a random residual; the outputs of each."""
    residual = _random(shape, residual_dtype or dtype, seed=100)
    out = []
    for step in range(3):
        x = _random(shape, dtype, seed=step)
        result = step_fn(compressor, x, residual)
        residual = tf.cast(result[2], residual.dtype)
        out.append(result)
    return out


def _ties(shape, dtype):
    """Many equal magnitudes of both signs, so ties decide the selection."""
    n = wire.num_elements(shape)
    pattern = np.float32([1, -1, 0.5, 1, -0.5, -1, 0.25, 1])
    x = np.resize(pattern, n).reshape(shape)
    return tf.constant(x, dtype)


@pytest.mark.parametrize("shape, density", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_fused_matches_generic_with_library(library_on, shape, density, dtype):
    del library_on
    topk = compressors.TopK(density)
    fused = _steps(topk, shape, dtype, _ef_step)
    generic = _steps(topk, shape, dtype, _generic_step)
    for f, g in zip(fused, generic):
        _assert_same(f, g)


@pytest.mark.parametrize("shape, density", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_fused_matches_library_off(monkeypatch, shape, density, dtype):
    """Fused (library on) equals ErrorFeedback without the library, whose
    `tf.math.top_k` may order the same set differently."""
    backends.use("custom", monkeypatch)
    topk = compressors.TopK(density)
    fused = _steps(topk, shape, dtype, _ef_step)
    backends.use("reference", monkeypatch)
    generic = _steps(topk, shape, dtype, _ef_step)
    for f, g in zip(fused, generic):
        _assert_same(f, g, exact_order=False)


@pytest.mark.parametrize("backend", ["library_on", "library_off"])
@pytest.mark.parametrize("shape, density", [((8,), 0.25), ((7, 5), 0.2)])
def test_ties_go_to_the_lower_index(request, backend, shape, density):
    request.getfixturevalue(backend)
    topk = compressors.TopK(density)
    x = _ties(shape, tf.float32)
    zero = tf.zeros(shape)
    fused = _ef_step(topk, x, zero)
    _assert_same(fused, _generic_step(topk, x, zero), exact_order=False)
    k = topk.num_selected(shape)
    flat = x.numpy().ravel()
    # Stable sort by descending magnitude: equal magnitudes keep index order.
    expected = np.sort(np.argsort(-np.abs(flat), kind="stable")[:k])
    np.testing.assert_array_equal(_by_index(fused[0])[0], expected)


@pytest.mark.parametrize("backend", ["library_on", "library_off"])
def test_residual_kept_in_another_dtype(request, backend):
    """A float32 residual with bfloat16 gradients: arithmetic in bfloat16."""
    request.getfixturevalue(backend)
    topk = compressors.TopK(0.1)
    shape = (64, 33)
    fused = _steps(topk, shape, tf.bfloat16, _ef_step, tf.float32)
    generic = _steps(topk, shape, tf.bfloat16, _generic_step, tf.float32)
    for f, g in zip(fused, generic):
        assert f[2].dtype == tf.bfloat16
        _assert_same(f, g)


def test_float64_with_library_uses_pure_tf_fusion(library_on):
    """The op has no float64 kernel; `top_k_abs` fuses in pure TF then."""
    del library_on
    topk = compressors.TopK(0.1)
    fused = _steps(topk, (64, 33), tf.float64, _ef_step)
    generic = _steps(topk, (64, 33), tf.float64, _generic_step)
    for f, g in zip(fused, generic):
        _assert_same(f, g, exact_order=False)


@pytest.mark.parametrize("backend", ["library_on", "library_off"])
def test_same_inside_tf_function(request, backend):
    request.getfixturevalue(backend)
    topk = compressors.TopK(0.05)
    shape = (300,)
    x = _random(shape, tf.float32, seed=1)
    r = _random(shape, tf.float32, seed=2)
    fused = tf.function(lambda x, r: _ef_step(topk, x, r))(x, r)
    generic = tf.function(lambda x, r: _generic_step(topk, x, r))(x, r)
    _assert_same(fused, generic)


@pytest.mark.parametrize("backend", ["library_on", "library_off"])
def test_mass_is_conserved(request, backend):
    request.getfixturevalue(backend)
    shape = (64, 33)
    residual = tf.zeros(shape)
    sent, inputs = tf.zeros(shape), tf.zeros(shape)
    for step in range(5):
        x = _random(shape, tf.float32, seed=step)
        _, total, residual = _ef_step(compressors.TopK(0.05), x, residual)
        sent += total
        inputs += x
    np.testing.assert_allclose(
        (sent + residual).numpy(), inputs.numpy(), atol=1e-5
    )


def _graph_ops(compressor, shape):
    spec = tf.TensorSpec(shape, tf.float32)
    fn = tf.function(lambda x, r: _ef_step(compressor, x, r))
    return fn.get_concrete_function(spec, spec).graph.get_operations()


def _dense_arithmetic(graph_ops, n):
    """Additions and subtractions over whole tensors of n elements."""
    return [
        op.name
        for op in graph_ops
        if op.type in ("AddV2", "Sub")
        and any(t.shape.num_elements() == n for t in op.outputs)
    ]


def test_error_feedback_topk_runs_the_fused_op(library_on):
    """A regression to the generic path (x + residual, select, local
    estimate, subtract) fails here."""
    del library_on
    graph_ops = _graph_ops(compressors.TopK(0.01), (1000, 10))
    types = [op.type for op in graph_ops]
    assert types.count(FUSED_OP) == 1
    assert "Tfgc>TopKSample" not in types
    assert not _dense_arithmetic(graph_ops, 10_000)


def test_without_library_the_generic_path_runs(library_off):
    del library_off
    assert (
        compressors.TopK(0.01).compress_with_residual(
            tf.ones(4), tf.zeros(4), (), None
        )
        is None
    )
    graph_ops = _graph_ops(compressors.TopK(0.01), (1000, 10))
    types = [op.type for op in graph_ops]
    assert not [t for t in types if t.startswith("Tfgc>")]
    assert "TopKV2" in types
    assert len(_dense_arithmetic(graph_ops, 10_000)) == 2


@pytest.mark.parametrize("backend", ["library_on", "library_off"])
def test_a_selected_infinity_leaves_the_residual(request, backend):
    """Where a sent entry is not finite the residual is 0: the fused op
    zeroes it, the generic path does not subtract it (inf - inf = NaN)."""
    request.getfixturevalue(backend)
    x = tf.constant([0.5, np.inf, -2.0, 0.1])
    _, total, residual = _ef_step(compressors.TopK(0.5), x, tf.zeros(4))
    np.testing.assert_array_equal(total.numpy(), [0, np.inf, -2.0, 0])
    np.testing.assert_array_equal(
        residual.numpy(), np.float32([0.5, 0, 0, 0.1])
    )


class _SpyPowerSGD(compressors.PowerSGD):
    calls = 0

    def compress_with_residual(self, x, residual, state, key):
        type(self).calls += 1
        return None  # no fused path


def test_multi_round_compressors_without_a_fused_path_are_generic():
    """Asked (the contract allows several rounds), a compressor that
    answers None gets the generic path."""
    compressor = compressors.ErrorFeedback(_SpyPowerSGD(rank=1))
    shape = (6, 4)
    key = tf.constant([3, 0], tf.int64)
    state = compressor.init_state(shape, tf.float32, key)
    x = _random(shape, tf.float32, seed=0)
    payload, ctx = compressor.compress(x, state, key)
    payload, ctx = compressor.next_round(payload, ctx)
    total, new_state = compressor.decompress(payload, ctx)
    assert _SpyPowerSGD.calls == 1
    np.testing.assert_allclose(
        (total + new_state.residual).numpy(), x.numpy(), atol=1e-5
    )


def test_base_compressor_has_no_fused_path():
    assert (
        compressors.RandomK(0.1).compress_with_residual(
            tf.ones(4), tf.zeros(4), (), tf.constant([0, 0], tf.int64)
        )
        is None
    )


@pytest.mark.parametrize("backend", ["library_on", "library_off"])
@pytest.mark.parametrize("dtype", DTYPES + [tf.float64], ids=lambda d: d.name)
def test_top_k_abs_with_residual(request, backend, dtype):
    """`ops.top_k_abs(x, k, residual)` selects from x + residual and zeroes
    the selection, compiled or in pure TF."""
    request.getfixturevalue(backend)
    shape, k = (40, 7), 13
    x = _random(shape, dtype, seed=3)
    r = _random(shape, dtype, seed=4)
    values, indices, new = ops.top_k_abs(x, k, residual=r)
    acc = x + r
    ref_values, ref_indices = ops.top_k_abs(acc, k)
    assert new.shape == x.shape and new.dtype == x.dtype
    np.testing.assert_array_equal(
        np.sort(indices.numpy()), np.sort(ref_indices.numpy())
    )
    np.testing.assert_array_equal(
        np.sort(tf.cast(values, tf.float64).numpy()),
        np.sort(tf.cast(ref_values, tf.float64).numpy()),
    )
    expected = tf.cast(acc, tf.float64).numpy().ravel()
    expected[indices.numpy()] = 0
    np.testing.assert_array_equal(
        tf.cast(new, tf.float64).numpy().ravel(), expected
    )
