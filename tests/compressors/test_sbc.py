"""SBC in one process: one sign with its mean, Golomb-coded positions at the
paper's rate, rounds that end with identical replicas and the mean
update, bad arguments. Against numpy on real workers:
tests/multiworker/test_paper_algorithms.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests import backends
from tests.compressors.common import heavy_tailed, replica_copies, shared_key
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import communicators, compressors, ops


def _gathered(payload):
    """One worker's payload as the ragged gather delivers it."""
    return tf.nest.map_structure(
        lambda t: tf.RaggedTensor.from_tensor(t[None]), payload
    )


def _np_binarize(a, k):
    """SBC's binarization in numpy: (positions, value)."""
    order = np.argsort(-a, kind="stable")
    pos = [i for i in order[:k] if a[i] > 0]
    order = np.argsort(a, kind="stable")
    neg = [i for i in order[:k] if a[i] < 0]
    mu_pos = np.mean(a[pos]) if pos else 0.0
    mu_neg = -np.mean(a[neg]) if neg else 0.0
    if mu_pos >= mu_neg:
        return np.sort(pos), np.float32(mu_pos)
    return np.sort(neg), np.float32(-mu_neg)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sbc_keeps_one_sign_with_its_mean(seed):
    a = heavy_tailed((4000,), seed, df=3)
    if seed == 2:
        a = -np.abs(a)  # no positive entry at all
    c = compressors.SBC(density=0.01)
    payload, ctx = c.compress(tf.constant(a), (), shared_key(0, 0))
    positions, value = _np_binarize(a, 40)
    np.testing.assert_array_equal(ctx.indices.numpy(), positions)
    np.testing.assert_allclose(payload.values.numpy(), [value], rtol=1e-6)
    assert payload.count.numpy().tolist() == [len(positions)]
    total, _ = c.decompress(_gathered(payload), ctx)
    expected = np.zeros_like(a)
    expected[positions] = value
    np.testing.assert_allclose(total.numpy(), expected, rtol=1e-6)
    # Exactly one sign is kept.
    signs = set(np.sign(total.numpy()[total.numpy() != 0]))
    assert len(signs) == 1


def test_sbc_a_worker_with_a_zero_update_sends_no_position():
    c = compressors.SBC(density=0.01)
    zero, ctx0 = c.compress(tf.zeros([500]), (), shared_key(0, 0))
    assert zero.count.numpy().tolist() == [0]
    assert zero.values.numpy().tolist() == [0.0]
    assert zero.positions.shape[0] == 0
    other, _ = c.compress(
        tf.constant(heavy_tailed((500,), 1, df=3)), (), shared_key(0, 0)
    )
    gathered = tf.nest.map_structure(
        lambda a, b: tf.ragged.stack([a, b]), zero, other
    )
    total, _ = c.decompress(gathered, ctx0)
    alone, _ = c.decompress(_gathered(other), ctx0)
    np.testing.assert_array_equal(total.numpy(), alone.numpy())


def test_sbc_positions_are_golomb_coded_at_the_papers_rate():
    n, density = 200_000, 0.01
    a = heavy_tailed((n,), 5, df=3)
    c = compressors.SBC(density=density)
    payload, ctx = c.compress(tf.constant(a), (), shared_key(0, 0))
    positions = ctx.indices.numpy()
    b = ops.golomb_optimal_b(2000, n)
    gaps = np.diff(np.concatenate([[-1], positions])) - 1
    bits = int(np.sum((gaps >> b) + 1 + b))
    assert payload.positions.shape[0] == -(-bits // 8)
    # About k b* + k / (1 - (1-q)^2^b*) bits: 8.1 per position at 1 %.
    per_position = 8 * payload.positions.shape[0] / len(positions)
    expected = ops.golomb_expected_bits_per_position(2000, n)
    assert abs(per_position - expected) < 0.25, (per_position, expected)


def test_sbc_without_binarization_sends_top_k_values():
    a = heavy_tailed((1000,), 3, df=3)
    c = compressors.SBC(density=0.02, binarize=False)
    payload, ctx = c.compress(tf.constant(a), (), shared_key(0, 0))
    top = np.sort(np.argsort(-np.abs(a), kind="stable")[:20])
    np.testing.assert_array_equal(ctx.indices.numpy(), top)
    np.testing.assert_array_equal(payload.values.numpy(), a[top])
    total, _ = c.decompress(_gathered(payload), ctx)
    expected = np.zeros_like(a)
    expected[top] = a[top]
    np.testing.assert_array_equal(total.numpy(), expected)


@pytest.mark.parametrize("delay", [0, -1, 1.5, True])
def test_sbc_bad_delay(delay):
    with pytest.raises(ValueError, match="`delay`"):
        compressors.SBC(delay=delay)


def _local_sgd(strategy, compressor, steps, lr=0.05):
    """Linear regression, a different batch per replica and step.

    Returns the weights of every replica after every step.
    """
    p = strategy.num_replicas_in_sync
    with strategy.scope():
        w = keras.Variable(np.zeros((40, 30), "float32"))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(lr), compressor, min_compress_size=0
        )
        opt.build([w])

    def data(r, s):
        x = tf.random.stateless_normal((8, 40), seed=[r, s])
        y = tf.random.stateless_normal((8, 30), seed=[r + 100, s])
        return x, y

    @tf.function
    def step(s):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            x, y = data(r, s)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((x @ w - y) ** 2) / p
            opt.apply(tape.gradient(loss, [w]), [w])

        strategy.run(replica_fn)

    history = []
    for s in range(steps):
        step(tf.constant(s))
        history.append(replica_copies(w))
    return history, data, opt


def test_sbc_rounds_end_with_identical_replicas_and_the_mean_update(mirrored):
    delay, steps, lr = 3, 6, 0.05
    sbc = compressors.SBC(density=1.0, delay=delay, binarize=False)
    history, data, opt = _local_sgd(mirrored, sbc, steps, lr)
    # numpy: local SGD on each replica's own mean gradient, then the round
    # start plus the mean of the updates (density 1: nothing is dropped).
    p = NUM_LOGICAL_CPUS
    start = np.zeros((40, 30), np.float32)
    local = [start.copy() for _ in range(p)]
    for s in range(steps):
        for r in range(p):
            x, y = (t.numpy() for t in data(r, s))
            grad = 2 * x.T @ (x @ local[r] - y) / (8 * 30)
            local[r] = local[r] - lr * grad
        if (s + 1) % delay == 0:
            start = start + np.mean([u - start for u in local], axis=0)
            local = [start.copy() for _ in range(p)]
            for replica in history[s]:
                np.testing.assert_allclose(replica, start, atol=2e-6)
        else:  # mid-round: every replica on its own weights
            assert not np.allclose(history[s][0], history[s][1])
            for r in range(p):
                np.testing.assert_allclose(history[s][r], local[r], atol=2e-6)
    # Bytes: only the round's last step sends.
    stats = opt.compression_stats()
    assert stats["run_steps"] == steps
    per_round = stats["sent_bytes"] + stats["overhead_bytes"]
    assert stats["run_mean_bytes"] == pytest.approx(
        per_round * (steps // delay) / steps
    )


def test_sbc_delay_one_density_one_unbinarized_is_dense_sgd(mirrored):
    sbc = compressors.SBC(density=1.0, delay=1, binarize=False)
    got, _, _ = _local_sgd(mirrored, sbc, 3)
    dense, _, _ = _local_sgd(mirrored, compressors.Identity(), 3)
    for a, b in zip(got[-1], dense[-1]):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for replica in got[-1][1:]:
        np.testing.assert_array_equal(replica, got[-1][0])


def test_sbc_binarized_rounds_keep_replicas_bitwise_equal(mirrored):
    history, _, opt = _local_sgd(mirrored, compressors.SBC(0.05, delay=2), 4)
    for s in (1, 3):
        for replica in history[s][1:]:
            np.testing.assert_array_equal(replica, history[s][0])
    assert opt.compression_stats()["run_compression_ratio"] > 20


def _generic_error_feedback(compressor, x, residual):
    """ErrorFeedback's generic step spelled out: (payload, residual)."""
    corrected = x + residual
    payload, ctx = compressor.compress(corrected, (), None)
    sent = compressor.local_estimate(payload, ctx)
    kept = tf.where(
        tf.math.is_finite(sent), corrected - sent, tf.zeros_like(sent)
    )
    return payload, kept


def _with_specials(x):
    """x with NaN, +-Inf and a run of equal values in it."""
    x = x.numpy().copy()
    flat = x.reshape(-1)
    flat[[3, 50]] = np.nan
    flat[7], flat[11] = np.inf, -np.inf
    flat[100:140] = flat[100]
    return tf.constant(x)


@pytest.mark.parametrize("binarize", [True, False])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("case", ["normal", "specials", "zeros", "ties"])
def test_sbc_fused_residual_is_the_generic_one(binarize, dtype, case):
    """`compress_with_residual` sends what `compress(x + residual)` sends
    and keeps, bit for bit, what ErrorFeedback's generic path keeps: acc
    minus the local estimate, 0 where the value sent is not finite."""
    sbc = compressors.SBC(density=0.01, binarize=binarize)
    rng = np.random.default_rng(5)
    shape = (40, 50)
    x = tf.constant(heavy_tailed(shape, 1, df=3))
    residual = tf.constant(rng.normal(size=shape).astype("float32") * 0.3)
    if case == "specials":
        x = _with_specials(x)
    elif case == "zeros":
        x, residual = tf.zeros(shape), tf.zeros(shape)
    elif case == "ties":
        x = tf.constant(np.resize(np.float32([1, -1, 0.5]), shape))
        residual = tf.zeros(shape)
    x, residual = tf.cast(x, dtype), tf.cast(residual, dtype)
    payload, ctx, fused = sbc.compress_with_residual(x, residual, (), None)
    expected_payload, expected = _generic_error_feedback(sbc, x, residual)
    for got, want in zip(payload, expected_payload):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert fused.dtype == dtype and fused.shape == x.shape
    np.testing.assert_array_equal(
        tf.cast(fused, tf.float32).numpy(),
        tf.cast(expected, tf.float32).numpy(),
    )
    # Not vacuous: the sent positions changed and the rest is acc.
    acc = tf.cast(x + residual, tf.float32).numpy().reshape(-1)
    changed = np.flatnonzero(
        ~(tf.cast(fused, tf.float32).numpy().reshape(-1) == acc)
        & ~np.isnan(acc)
    )
    assert set(changed) <= set(ctx.indices.numpy())
    if case != "zeros":
        assert changed.size > 0


def test_sbc_under_error_feedback_takes_the_fused_path():
    """ErrorFeedback hands SBC the residual (no corrected tensor kept for
    a later subtraction)."""
    ef = compressors.ErrorFeedback(compressors.SBC(density=0.01))
    x = tf.constant(heavy_tailed((30, 30), 2, df=3))
    state = tfgc.compressors.error_feedback.ErrorFeedbackState(
        tf.zeros_like(x), ()
    )
    _, ctx = ef.compress(x, state, None)
    assert ctx.corrected is None and ctx.residual is not None


# --- The compiled two-sided selection sends what SBC sent before it -------


def _todays_largest(x, k):
    """SBC's one-sign selection before `ops.top_k_two_sided`, verbatim."""
    values, indices = ops.top_k_abs(tf.nn.relu(x), k)
    keep = ~(values <= 0)  # relu(NaN) is NaN: it is sent
    values, indices = values[keep], indices[keep]
    order = tf.argsort(indices)
    return tf.gather(values, order), tf.gather(indices, order)


def _todays_two_sides(flat, k):
    """What SBC._select took its two sides from before: two one-sign
    selections, of flat and of -flat."""
    return ops.TwoSidedSelection(
        *_todays_largest(flat, k), *_todays_largest(-flat, k)
    )


TWO_SIDED_CASES = (
    "normal",
    "specials",
    "nan_bits",
    "ties",
    "zeros",
    "positive",
    "negative",
    "few_positive",
    "subnormals",
    "sampled",
)
_NAN_BITS = {  # both signs, quiet and signalling, with payloads
    tf.float32: (tf.uint32, [0xFFC00000, 0x7FC00123, 0xFF800001]),
    tf.float64: (tf.uint64, [0xFFF8000000000000, 0x7FF0000000000001]),
    tf.float16: (tf.uint16, [0xFE00, 0x7E12, 0xFC01]),
    tf.bfloat16: (tf.uint16, [0xFFC0, 0x7FC1, 0xFF81]),
}


def _two_sided_case(case, dtype):
    """(x, residual) of SBC's hard cases for the two-sided selection."""
    rng = np.random.default_rng(TWO_SIDED_CASES.index(case))
    shape = (600, 500) if case == "sampled" else (40, 50)
    n = shape[0] * shape[1]
    x = heavy_tailed(shape, 7, df=3).reshape(-1)
    residual = rng.normal(size=n).astype("float32") * 0.3
    if case == "specials":
        x[[3, 50]] = np.nan
        x[7], x[11], x[12], x[13] = np.inf, -np.inf, 0.0, -0.0
        x[100:140] = x[100]
    elif case in ("zeros", "ties", "subnormals"):
        residual[:] = 0
        if case == "ties":
            x = np.resize(np.float32([1, -1, 0.5, -2]), n)
        elif case == "subnormals":  # of float32, float16 and float64
            tiny = np.float32([1e-40, -3e-39, 6e-8, -1.2e-7, 0.0, -0.0])
            x = np.where(rng.random(n) < 0.9, np.resize(tiny, n), x * 1e-6)
        else:
            x[:] = 0
    elif case == "positive":
        x, residual = np.abs(x) + 0.5, np.abs(residual)
    elif case == "negative":
        x, residual = -np.abs(x) - 0.5, -np.abs(residual)
    elif case == "few_positive":  # k above the positive entries
        x = np.where(rng.random(n) < 0.004, np.abs(x), -np.abs(x))
        residual[:] = 0
    x = tf.cast(tf.constant(x.reshape(shape)), dtype)
    residual = tf.cast(tf.constant(residual.reshape(shape)), dtype)
    if case == "nan_bits":
        ints, patterns = _NAN_BITS[dtype]
        bits = tf.bitcast(x, ints).numpy().reshape(-1)
        bits[[5, 60, 61][: len(patterns)]] = patterns
        x = tf.bitcast(tf.constant(bits.reshape(shape), ints), dtype)
    if case == "subnormals" and dtype == tf.float64:
        x = x * tf.constant(1e-270, tf.float64)  # float64's subnormals
    return x, residual


def _bits(t):
    t = tf.convert_to_tensor(t)
    if t.dtype.is_floating:
        t = tf.bitcast(
            t, {2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[t.dtype.size]
        )
    return t.numpy()


def _sbc_outputs(sbc, x, residual, graph):
    """Payload fields, sent indices and values, new residual."""

    def run(x, residual):
        payload, ctx, new_residual = sbc.compress_with_residual(
            x, residual, (), None
        )
        return (*payload, ctx.indices, ctx.values, new_residual)

    return [_bits(t) for t in (tf.function(run) if graph else run)(x, residual)]


@pytest.mark.parametrize("backend", ["custom", "reference"])
@pytest.mark.parametrize(
    "dtype",
    [tf.float32, tf.float16, tf.bfloat16, tf.float64],
    ids=lambda d: d.name,
)
@pytest.mark.parametrize("case", TWO_SIDED_CASES)
def test_sbc_sends_bit_for_bit_what_it_sent_before(
    backend, dtype, case, monkeypatch
):
    """SBC's payload, local estimate and residual with the two-sided
    selection (compiled or its reference) are, bit for bit, those of the
    selection it replaced (two one-sign top_k_abs of relu(x) and of
    relu(-x)), for every dtype and hard case, eagerly and in a tf.function.
    Only in a tf.function with NaN in A do they differ: Grappler rewrote
    the old `~(values <= 0)` into `values > 0` there, which dropped NaN;
    the two-sided selection keeps it as in eager mode (the old intent)."""
    backends.use(backend, monkeypatch)
    sbc = compressors.SBC(density=0.001 if case == "sampled" else 0.01)
    x, residual = _two_sided_case(case, dtype)
    with monkeypatch.context() as m:
        m.setattr(ops, "top_k_two_sided", _todays_two_sides)
        eager_before = _sbc_outputs(sbc, x, residual, graph=False)
        graph_before = _sbc_outputs(sbc, x, residual, graph=True)
    nan = bool(tf.reduce_any(tf.math.is_nan(tf.cast(x, tf.float32))))
    for graph, before in ((False, eager_before), (True, graph_before)):
        now = _sbc_outputs(sbc, x, residual, graph)
        if graph and nan:
            before = eager_before
        for got, want in zip(now, before):
            np.testing.assert_array_equal(got, want)
    if nan:  # what Grappler did to the old graph: NaN was not sent
        where = np.flatnonzero(np.isnan(tf.cast(x, tf.float32).numpy()))
        assert set(where) <= set(eager_before[3])
        assert not set(where) & set(graph_before[3])


def test_sbc_exchange_takes_few_ops_per_tensor(mirrored):
    # A ResNet-50 exchange compresses about 76 tensors, and each op costs
    # tracing and start-up time: a tensor adds what SBC does to it
    # (selection, coding, decoding, the scatter; 132 ops with TensorFlow
    # 2.21), not a row-by-row reading of the ragged gather's output, which
    # took about 100 ops per worker and tensor.
    sbc = compressors.SBC(0.01)

    def ops_in_step(num):
        @tf.function
        def run():
            def replica_fn():
                tensors = [tf.random.normal([64, 64])] * num
                result = communicators.Auto().step(
                    [sbc] * num, tensors, [()] * num, [shared_key(0, 0)] * num
                )
                return result.totals

            return mirrored.run(replica_fn)

        return len(run.get_concrete_function().graph.get_operations())

    per_tensor = (ops_in_step(8) - ops_in_step(4)) / (4 * NUM_LOGICAL_CPUS)
    assert per_tensor <= 200
