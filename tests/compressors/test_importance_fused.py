"""ImportancePruning's fused error feedback (`compress_with_residual`,
`tfgc.ops.top_k_ratio`) against the generic path: the same positions, the
same values, the same residual and total, on the root and on the other
workers, with the compiled ops and without, in every float dtype; with
ties, NaN and Inf, and zero weights.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import backends
from tests.compressors.common import shared_key
from tfgc import compressors
from tfgc.compressors.error_feedback import ErrorFeedbackState
from tfgc.compressors.importance import IndexPayload, root_worker
from tfgc.core.compressor import NoState, StepInfo

DTYPES = [tf.float32, tf.float16, tf.bfloat16]


@pytest.fixture(params=backends.BACKENDS)
def backend(request, monkeypatch):
    backends.use(request.param, monkeypatch)
    return request.param


def _fused(c, xs, residuals, w, step):
    """Every worker's ErrorFeedback step: (sent positions, values sent,
    total, new residual) per worker, the root's positions broadcast."""
    p = len(xs)
    ef = compressors.ErrorFeedback(c)
    key = shared_key(0, step)
    firsts = [
        ef.compress(x, ErrorFeedbackState(r, NoState()), key, StepInfo(w, i, p))
        for i, (x, r) in enumerate(zip(xs, residuals))
    ]
    root = int(firsts[0][0].root)
    out = []
    for payload, ctx in firsts:
        assert ctx.corrected is None  # the fused path
        assert int(payload.root) == root
        values, ctx = ef.next_round(firsts[root][0], ctx)
        total, state = ef.decompress(values, ctx)
        out.append((ctx.inner.indices, values.values, total, state.residual))
    return out


def _generic(c, xs, residuals, w, step):
    """The same step spelled out: acc, compress, the root's positions, the
    local estimate subtracted where finite."""
    p = len(xs)
    key = shared_key(0, step)
    accs = [x + r for x, r in zip(xs, residuals)]
    firsts = [
        c.compress(acc, NoState(), key, StepInfo(w, i, p))
        for i, acc in enumerate(accs)
    ]
    root = int(firsts[0][0].root)
    out = []
    for acc, (_, ctx) in zip(accs, firsts):
        values, ctx = c.next_round(firsts[root][0], ctx)
        total, _ = c.decompress(values, ctx)
        sent = c.local_estimate(values, ctx)
        residual = tf.where(
            tf.math.is_finite(sent), acc - sent, tf.zeros_like(sent)
        )
        out.append((ctx.indices, values.values, total, residual))
    return out


def _bits(t):
    t = tf.convert_to_tensor(t)
    if t.dtype in (tf.float16, tf.bfloat16):
        return tf.bitcast(t, tf.int16).numpy()
    return tf.bitcast(t, tf.int32).numpy() if t.dtype == tf.float32 else t


def _assert_same(fused, generic):
    assert len(fused) == len(generic)
    for f, g in zip(fused, generic):
        for a, b in zip(f, g):
            # Bit for bit, but a zero's sign and NaN payloads.
            a32 = tf.cast(a, tf.float64).numpy()
            b32 = tf.cast(b, tf.float64).numpy()
            np.testing.assert_array_equal(a32, b32)


def _inputs(shape, dtype, p, seed, special=False):
    rng = np.random.default_rng(seed)

    def draw(scale):
        return rng.standard_normal(shape).astype(np.float32) * scale

    w = draw(0.05)
    w.reshape(-1)[::7] = 0  # zero weights
    xs = [draw(1.0) for _ in range(p)]
    rs = [draw(0.3) for _ in range(p)]
    if special:
        for x in xs:
            flat = x.reshape(-1)
            flat[[1, 4, 9]] = [np.nan, np.inf, -np.inf]
            flat[20:60] = 0.5  # ties
        w.reshape(-1)[30:40] = np.inf
    cast = lambda a: tf.constant(a, dtype)  # noqa: E731
    return [cast(x) for x in xs], [cast(r) for r in rs], cast(w)


def _step_with_root(p, root):
    return next(s for s in range(1000) if int(root_worker(s, p)) == root)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape, density", [((37,), 0.1), ((64, 33), 0.01)])
@pytest.mark.parametrize("relative_epsilon", [0.0, 1.0])
def test_one_worker_matches_the_generic_path(
    backend, dtype, shape, density, relative_epsilon
):
    del backend
    c = compressors.ImportancePruning(
        density, relative_epsilon=relative_epsilon
    )
    xs, rs, w = _inputs(shape, dtype, 1, seed=1)
    _assert_same(_fused(c, xs, rs, w, 3), _generic(c, xs, rs, w, 3))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("root", [0, 1, 2])
@pytest.mark.parametrize("special", [False, True])
def test_every_worker_matches_the_generic_path(backend, dtype, root, special):
    """On the others than the root the root's positions overlap their own
    choice in part: values and residual come from both."""
    del backend
    p = 3
    c = compressors.ImportancePruning(0.2)
    xs, rs, w = _inputs((150,), dtype, p, seed=root, special=special)
    step = _step_with_root(p, root)
    fused = _fused(c, xs, rs, w, step)
    _assert_same(fused, _generic(c, xs, rs, w, step))
    positions = [set(f[0].numpy()) for f in fused]
    assert positions[0] == positions[1] == positions[2]


def test_in_tf_function_the_root_is_decided_in_the_graph(backend):
    del backend
    p, c = 2, compressors.ImportancePruning(0.1)
    xs, rs, w = _inputs((200,), tf.float32, p, seed=5)
    for root in range(p):
        step = _step_with_root(p, root)
        fused = tf.function(lambda s=step: _fused_graph(c, xs, rs, w, s))()
        generic = _generic(c, xs, rs, w, step)
        _assert_same(fused, generic)


def _fused_graph(c, xs, rs, w, step):
    """_fused with the root read in the graph (no int() of a tensor)."""
    p = len(xs)
    ef = compressors.ErrorFeedback(c)
    key = tf.constant([0, step], tf.int64)
    firsts = [
        ef.compress(x, ErrorFeedbackState(r, NoState()), key, StepInfo(w, i, p))
        for i, (x, r) in enumerate(zip(xs, rs))
    ]
    root = root_worker(key[1], p)
    indices = tf.switch_case(root, [lambda f=f: f[0].indices for f in firsts])
    broadcast = IndexPayload(root, indices)
    out = []
    for _, ctx in firsts:
        values, ctx = ef.next_round(broadcast, ctx)
        total, state = ef.decompress(values, ctx)
        out.append((ctx.inner.indices, values.values, total, state.residual))
    return out


def test_runs_one_fused_op_and_no_dense_subtraction(monkeypatch):
    """A regression to the generic path (acc, rank, local estimate,
    subtract) fails here."""
    backends.use("custom", monkeypatch)
    c = compressors.ImportancePruning(0.01)
    spec = tf.TensorSpec((1000, 10), tf.float32)

    @tf.function
    def step(x, r, w):
        ef = compressors.ErrorFeedback(c)
        state = ErrorFeedbackState(r, NoState())
        payload, ctx = ef.compress(
            x, state, shared_key(0, 0), StepInfo(w, 0, 1)
        )
        values, ctx = ef.next_round(payload, ctx)
        return ef.decompress(values, ctx)

    graph = step.get_concrete_function(spec, spec, spec).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("Tfgc>TopKRatioWithResidual") == 1
    assert "Tfgc>TopKSample" not in types
    dense = [
        op.type
        for op in graph.get_operations()
        if op.type in ("AddV2", "Sub", "Select", "SelectV2", "RealDiv")
        and any(t.shape.num_elements() == 10_000 for t in op.outputs)
    ]
    assert not dense


def test_weights_of_another_dtype_take_the_generic_path():
    c = compressors.ImportancePruning(0.1)
    x = tf.ones(20, tf.float16)
    info = StepInfo(tf.ones(20, tf.float32), 0, 1)
    assert (
        c.compress_with_residual(
            x, tf.zeros_like(x), (), shared_key(0, 0), info
        )
        is None
    )


def test_fused_path_needs_the_variable():
    with pytest.raises(ValueError, match="reads the variable's value"):
        compressors.ImportancePruning().compress_with_residual(
            tf.ones(10), tf.zeros(10), (), shared_key(0, 0)
        )
