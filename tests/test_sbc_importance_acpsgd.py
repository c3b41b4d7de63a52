"""SBC, importance-weighted pruning and ACP-SGD in one process.

Semantics against numpy on one worker, and through real collectives among
the four logical CPUs of tests/conftest.py (MirroredStrategy). Real
multi-worker runs are in tests/test_paper_algorithms_multiworker.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from custom_ops.cuda_harness.numpy_oracle import np_slice_start
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import compressors, ops
from tfgc.communicators import exchange
from tfgc.core.compressor import StepInfo


def _heavy(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_t(3, size=shape).astype(np.float32)


def _key(index, step):
    return tf.constant([index, step], tf.int64)


def _copies(variable):
    """Every replica's copy of a Keras variable under MirroredStrategy."""
    return [copy.numpy() for copy in variable.value.values]


def _gathered(payload):
    """One worker's payload as the ragged gather delivers it."""
    return tf.nest.map_structure(
        lambda t: tf.RaggedTensor.from_tensor(t[None]), payload
    )


# --- SBC -------------------------------------------------------------------


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
    a = _heavy((4000,), seed)
    if seed == 2:
        a = -np.abs(a)  # no positive entry at all
    c = compressors.SBC(density=0.01)
    payload, ctx = c.compress(tf.constant(a), (), _key(0, 0))
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
    zero, ctx0 = c.compress(tf.zeros([500]), (), _key(0, 0))
    assert zero.count.numpy().tolist() == [0]
    assert zero.values.shape[0] == 0 and zero.positions.shape[0] == 0
    other, _ = c.compress(tf.constant(_heavy((500,), 1)), (), _key(0, 0))
    gathered = tf.nest.map_structure(
        lambda a, b: tf.ragged.stack([a, b]), zero, other
    )
    total, _ = c.decompress(gathered, ctx0)
    alone, _ = c.decompress(_gathered(other), ctx0)
    np.testing.assert_array_equal(total.numpy(), alone.numpy())


def test_sbc_positions_are_golomb_coded_at_the_papers_rate():
    n, density = 200_000, 0.01
    a = _heavy((n,), 5)
    c = compressors.SBC(density=density)
    payload, ctx = c.compress(tf.constant(a), (), _key(0, 0))
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
    a = _heavy((1000,), 3)
    c = compressors.SBC(density=0.02, binarize=False)
    payload, ctx = c.compress(tf.constant(a), (), _key(0, 0))
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
        history.append(_copies(w))
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


# --- importance-weighted pruning ----------------------------------------------


def test_importance_root_follows_the_step():
    roots = [
        int(compressors.importance.root_worker(tf.constant(s), 4))
        for s in range(40)
    ]
    assert roots == [np_slice_start(s, 3) for s in range(40)]
    assert len(set(roots)) == 4


def test_importance_root_picks_by_gradient_over_weight():
    c = compressors.ImportancePruning(density=0.25, epsilon=1e-8)
    x = tf.constant([1.0, 1.0, 0.1, 4.0, 0.2, 0.0, 3.0, 0.5])
    w = tf.constant([10.0, 0.1, 0.001, 100.0, 1.0, 1.0, 1.0, 0.05])
    # |x| / |w|: 0.1, 10, 100, 0.04, 0.2, 0, 3, 10 -> positions 2 and 1 or 7.
    step = next(s for s in range(100) if np_slice_start(s, 1) == 0)
    payload, ctx = c.compress(x, (), _key(0, step), StepInfo(w, 0, 2))
    top = set(payload.indices.numpy())
    assert 2 in top and top <= {1, 2, 7}
    assert int(payload.root) == 0
    # The other worker names the same root; its own list is not sent.
    payload, _ = c.compress(x, (), _key(0, step), StepInfo(w, 1, 2))
    assert int(payload.root) == 0
    assert c.spec.collectives == (compressors.BROADCAST, "all_reduce")


def test_importance_needs_the_variable():
    with pytest.raises(ValueError, match="reads the variable's value"):
        compressors.ImportancePruning().compress(tf.ones(10), (), _key(0, 0))
    with pytest.raises(ValueError, match="reads the variable's value"):
        exchange.run_rounds(
            [compressors.ImportancePruning()],
            [tf.ones(10)],
            [()],
            [_key(0, 0)],
            carry=None,
        )


@pytest.mark.parametrize("epsilon", [0, -1, "x"])
def test_importance_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="`epsilon`"):
        compressors.ImportancePruning(epsilon=epsilon)


def test_importance_updates_only_the_roots_positions(mirrored):
    """Every replica applies the same update, at the root's positions."""
    p = NUM_LOGICAL_CPUS
    with mirrored.scope():
        w0 = _heavy((50, 40), 9)
        w = keras.Variable(w0)
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(1.0),
            compressors.ImportancePruning(density=0.01),
            min_compress_size=0,
        )
        opt.build([w])

    def grad(r):
        return tf.constant(_heavy((50, 40), 100 + r))

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.switch_case(r, [lambda i=i: grad(i) for i in range(p)])
            opt.apply([g], [w])

        mirrored.run(replica_fn)

    step()
    root = np_slice_start(0, p - 1)
    g_root = _heavy((50, 40), 100 + root).reshape(-1)
    importance = np.abs(g_root) / (np.abs(w0.reshape(-1)) + 1e-8)
    chosen = np.sort(np.argsort(-importance, kind="stable")[:20])
    total = sum(_heavy((50, 40), 100 + r).reshape(-1) for r in range(p))
    expected = w0.reshape(-1).copy()
    expected[chosen] -= total[chosen]
    copies = _copies(w)
    assert len(copies) == p
    for replica in copies:
        np.testing.assert_allclose(
            replica.reshape(-1), expected, rtol=1e-5, atol=1e-5
        )
    residual = opt._plans[0].state_variables[0]
    for r, local in enumerate(_copies(residual)):
        kept = _heavy((50, 40), 100 + r).reshape(-1)
        kept[chosen] = 0
        np.testing.assert_array_equal(local.reshape(-1), kept)


# --- ACP-SGD -----------------------------------------------------------------


def test_acpsgd_alternates_p_and_q_and_sends_one_factor(mirrored):
    p = NUM_LOGICAL_CPUS
    shape = (60, 24)
    with mirrored.scope():
        w = keras.Variable(np.zeros(shape, "float32"))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(1.0),
            compressors.ACPSGD(rank=3),
            min_compress_size=0,
        )
        opt.build([w])
    state = opt._plans[0].state_variables  # residual, p, q, p_steps, q_steps

    def grads(s):
        return [_heavy(shape, 10 * s + r) for r in range(p)]

    @tf.function
    def step(s):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.switch_case(
                r, [lambda i=i: tf.constant(grads(s)[i]) for i in range(p)]
            )
            opt.apply([g], [w])

        mirrored.run(replica_fn)

    def local(variable):
        return _copies(variable)[0]

    q0 = local(state[2])
    step(0)  # P step: P = (M + E) orth(Q); the factors' sum is the sum's
    orth_q = np.linalg.qr(q0)[0]
    summed = sum(grads(0))
    np.testing.assert_allclose(local(state[1]), summed @ orth_q, rtol=2e-4)
    np.testing.assert_array_equal(local(state[2]), q0)
    assert (int(local(state[3])), int(local(state[4]))) == (1, 0)
    assert opt.compression_stats()["sent_bytes"] == 60 * 3 * 4
    p_sum = local(state[1])
    step(1)  # Q step: Q = (M + E)^T orth(P_sum)
    assert (int(local(state[3])), int(local(state[4]))) == (1, 1)
    np.testing.assert_array_equal(local(state[1]), p_sum)
    assert opt.compression_stats()["sent_bytes"] == 24 * 3 * 4
    # Residuals differ per worker (local error feedback).
    residuals = _copies(state[0])
    assert not np.allclose(residuals[0], residuals[1])


def _two_steps(compressor):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(40)])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 64)).astype("float32")
    y = rng.normal(size=(64, 40)).astype("float32")
    opt = keras.optimizers.SGD(0.1)
    if compressor is not None:
        opt = tfgc.CompressedOptimizer(opt, compressor)
    model.compile(opt, "mse", jit_compile=False)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize("cls", [compressors.ACPSGD, compressors.PowerSGD])
def test_acpsgd_and_powersgd_warm_up_dense(cls):
    dense = _two_steps(None)
    for a, b in zip(_two_steps(cls(rank=2, warmup_steps=2)), dense):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    compressed = _two_steps(cls(rank=2))
    assert not np.allclose(compressed[0], dense[0], atol=1e-4)


def test_buckets_hold_about_bucket_bytes_from_the_last_tensor():
    tensors = [tf.zeros([n]) for n in (100, 300, 50, 200, 10)]
    c = compressors.ACPSGD(bucket_bytes=1000)
    groups = exchange.buckets([c] * 5, tensors)
    assert groups == [[4, 3], [2], [1], [0]]
    assert exchange.buckets([compressors.Identity()] * 5, tensors) == [
        [0, 1, 2, 3, 4]
    ]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rank": 0}, "`rank`"),
        ({"bucket_bytes": 0}, "`bucket_bytes`"),
        ({"bucket_bytes": -5}, "`bucket_bytes`"),
        ({"warmup_steps": -1}, "`warmup_steps`"),
        ({"factor": "r"}, "`factor`"),
    ],
)
def test_acpsgd_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compressors.ACPSGD(**kwargs)
