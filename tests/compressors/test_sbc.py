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
from tests.compressors.common import heavy_tailed, replica_copies, shared_key
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import compressors, ops


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


def test_sbc_a_worker_with_a_zero_update_sends_nothing():
    c = compressors.SBC(density=0.01)
    zero, ctx0 = c.compress(tf.zeros([500]), (), shared_key(0, 0))
    assert zero.count.numpy().tolist() == [0]
    assert zero.values.shape[0] == 0 and zero.positions.shape[0] == 0
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
