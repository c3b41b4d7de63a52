"""The contract every compressor keeps, plus each one's own behaviour."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgc import compressors, ops
from tfgc.core.compressor import StepInfo
from tfgc.core.wire import ALL_GATHER, ALL_GATHER_RAGGED, payload_nbytes

ALL = {
    "identity": compressors.Identity(),
    "fp16": compressors.FP16(),
    "bf16": compressors.BF16(),
    "topk": compressors.TopK(density=0.1),
    "randomk": compressors.RandomK(density=0.1),
    "signsgd": compressors.SignSGD(),
    "signsgd_unscaled": compressors.SignSGD(scaled=False),
    "powersgd": compressors.PowerSGD(rank=2),
    "mstopk": compressors.MSTopK(density=0.1),
    "redsync": compressors.RedSync(density=0.1, cost_model=None),
    "redsync_trimmed": compressors.RedSync(
        density=0.1, selection="trimmed", cost_model=None
    ),
    "redsync_clipped": compressors.RedSync(
        density=0.1, cost_model=None, clipnorm=0.5
    ),
    "sbc": compressors.SBC(density=0.1),
    "sbc_unbinarized": compressors.SBC(density=0.1, binarize=False),
    "importance": compressors.ImportancePruning(density=0.1),
    "acpsgd": compressors.ACPSGD(rank=2),
    "acpsgd_q": compressors.ACPSGD(rank=2, factor="q"),
}
# Compressors that keep their own residual: no ErrorFeedback around them.
OWN_RESIDUAL = {"redsync", "redsync_trimmed", "redsync_clipped"}
SHAPES = [(37,), (64, 33), (8, 3, 3, 4)]
DTYPES = [tf.float32, tf.float16, tf.bfloat16]


def local_step(compressor, x, state, key):
    """Runs every round for a single worker; returns everything seen."""
    extra = ()
    if compressor.spec.reads_step_info:  # a variable of ones, one worker
        extra = (StepInfo(tf.ones_like(x), 0, 1),)
    payload, ctx = compressor.compress(x, state, key, *extra)
    payloads = [payload]
    kinds = compressor.spec.collectives
    for r in range(compressor.spec.rounds - 1):
        payload, ctx = compressor.next_round(
            _as_received(kinds[r], payload), ctx
        )
        payloads.append(payload)
    total, new_state = compressor.decompress(
        _as_received(kinds[-1], payload), ctx
    )
    return total, new_state, payloads, ctx


def _as_received(collective, payload):
    """One worker's payload as its collective delivers it."""
    if collective == ALL_GATHER:
        return tf.nest.map_structure(lambda t: t[None], payload)
    if collective == ALL_GATHER_RAGGED:
        return tf.nest.map_structure(
            lambda t: tf.RaggedTensor.from_tensor(t[None]), payload
        )
    return payload


def _random(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tf.cast(rng.normal(size=shape).astype("float32"), dtype)


def _key(step=0):
    return tf.constant([7, step], tf.int64)


def _usable(compressor, shape):
    return compressor.should_compress(shape)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_round_trip_shape_dtype_and_bytes(name, shape, dtype):
    compressor = ALL[name]
    if not _usable(compressor, shape):
        pytest.skip(f"{name} sends {shape} dense")
    x = _random(shape, dtype)
    state = compressor.init_state(shape, dtype, _key(-1))
    total, new_state, payloads, _ = local_step(compressor, x, state, _key())
    assert total.shape == x.shape
    assert total.dtype == x.dtype
    assert np.all(np.isfinite(tf.cast(total, tf.float32).numpy()))
    assert tf.nest.map_structure(lambda t: t.shape, new_state) == (
        tf.nest.map_structure(lambda t: t.shape, state)
    )
    measured = sum(int(payload_nbytes(p)) for p in payloads)
    if ALL_GATHER_RAGGED in compressor.spec.collectives:
        # Data-dependent sizes: payload_bytes is the bound.
        assert 0 < measured <= compressor.payload_bytes(shape, dtype)
    else:
        assert measured == compressor.payload_bytes(shape, dtype)


@pytest.mark.parametrize("name", ALL)
def test_config_round_trip(name):
    compressor = ALL[name]
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(compressor)
    )
    assert type(restored) is type(compressor)
    assert restored.get_config() == compressor.get_config()
    assert compressors.get(compressor) is compressor


@pytest.mark.parametrize("name", sorted(set(ALL) - OWN_RESIDUAL))
def test_error_feedback_conserves_mass(name):
    """sum(sent) + residual == sum(inputs), step after step."""
    compressor = compressors.ErrorFeedback(ALL[name])
    shape = (64, 33)
    state = compressor.init_state(shape, tf.float32, _key(-1))
    sent_sum = tf.zeros(shape)
    input_sum = tf.zeros(shape)
    for step in range(5):
        x = _random(shape, tf.float32, seed=step)
        total, state, _, _ = local_step(compressor, x, state, _key(step))
        sent_sum += total  # one worker: the total is what it sent
        input_sum += x
    np.testing.assert_allclose(
        (sent_sum + state.residual).numpy(), input_sum.numpy(), atol=1e-4
    )


@pytest.mark.parametrize("name", sorted(OWN_RESIDUAL))
def test_own_residual_compressors_refuse_error_feedback(name):
    with pytest.raises(ValueError, match="already has error feedback"):
        compressors.ErrorFeedback(ALL[name])


def test_error_feedback_residual_is_what_was_not_sent():
    compressor = compressors.ErrorFeedback(compressors.TopK(density=0.25))
    x = tf.constant([4.0, -3.0, 0.5, 0.1, -0.2, 2.0, 0.0, 1.0])
    state = compressor.init_state((8,), tf.float32, _key(-1))
    total, state, _, _ = local_step(compressor, x, state, _key())
    np.testing.assert_array_equal(total.numpy(), [4, -3, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(
        state.residual.numpy(),
        np.float32([0, 0, 0.5, 0.1, -0.2, 2.0, 0, 1.0]),
    )
    # The residual takes part in the next selection: 2.0 + 0.1 beats 1.9.
    total, _, _, _ = local_step(
        compressor, tf.constant([0, 0, 0, 0, 0, 0.1, 0, 1.9]), state, _key(1)
    )
    assert set(np.flatnonzero(total.numpy())) == {5, 7}


def test_topk_selects_largest_magnitudes():
    x = tf.constant([0.1, -5.0, 0.3, 4.0, -0.2, 0.0, 3.0, -1.0, 0.5, 0.05])
    total, _, payloads, _ = local_step(
        compressors.TopK(density=0.3), x, (), _key()
    )
    assert sorted(payloads[0].indices.numpy()) == [1, 3, 6]
    np.testing.assert_array_equal(
        total.numpy(), [0, -5, 0, 4, 0, 0, 3, 0, 0, 0]
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_top_k_abs_selects_what_tf_top_k_selects(dtype):
    x = _random((5000,), dtype, seed=3)
    values, indices = ops.top_k_abs(x, 50)
    _, expected = tf.math.top_k(tf.abs(tf.cast(x, tf.float32)), k=50)
    assert set(indices.numpy()) == set(expected.numpy())
    np.testing.assert_array_equal(values.numpy(), tf.gather(x, indices).numpy())


def test_randomk_indices_shared_distinct_and_fresh_each_step():
    c = compressors.RandomK(density=0.1)
    a = c.indices(1000, _key(3)).numpy()
    assert len(a) == 100 and len(set(a)) == 100
    assert a.min() >= 0 and a.max() < 1000
    np.testing.assert_array_equal(a, c.indices(1000, _key(3)).numpy())
    assert not np.array_equal(a, c.indices(1000, _key(4)).numpy())


def test_sign_is_scaled_sign_and_packs_32_per_word():
    x = tf.constant([1.0, -2.0, 0.0, -4.0] * 10)
    total, _, payloads, _ = local_step(compressors.SignSGD(), x, (), _key())
    np.testing.assert_allclose(
        total.numpy(), 1.75 * np.array([1, -1, 1, -1] * 10), rtol=1e-6
    )
    assert payloads[0].bits.shape == (2,)
    assert payloads[0].bits.dtype == tf.int32


def _gathered_totals(compressor, xs):
    """Each worker's total when workers with gradients `xs` all-gather."""
    sent = [compressor.compress(tf.constant(x), (), _key()) for x in xs]
    stacked = tf.nest.map_structure(
        lambda *t: tf.stack(t), *[p for p, _ in sent]
    )
    return [compressor.decompress(stacked, ctx)[0].numpy() for _, ctx in sent]


def test_sign_sums_workers_with_their_own_scales():
    xs = [[1.0, -1.0, 3.0], [-2.0, -2.0, 2.0]]
    total = _gathered_totals(compressors.SignSGD(), xs)[0]
    expected = (5 / 3) * np.array([1, -1, 1]) + 2 * np.array([-1, -1, 1])
    np.testing.assert_allclose(total, expected, rtol=1e-6)


def test_unscaled_sign_is_a_majority_vote():
    """sign(sum of the workers' signs), 0 on a tie (zero votes +): +-1
    whatever the number of workers (Bernstein et al. 2019)."""
    c = compressors.SignSGD(scaled=False)
    xs = [
        [0.5, 2.0, 3.0, -1.0, 0.0],
        [0.1, 1.0, 1.0, -2.0, -1.0],
        [9.0, 4.0, -1.0, -3.0, 0.0],
        [1.0, -5.0, -2.0, 4.0, -2.0],
    ]
    for total in _gathered_totals(c, xs):  # the same on every worker
        np.testing.assert_array_equal(total, [1, 1, 0, -1, 0])
    for p in (1, 2, 3):  # identical gradients: one step's size, any p
        totals = _gathered_totals(c, [xs[0]] * p)
        np.testing.assert_array_equal(totals[0], [1, 1, 1, -1, 1])


def test_majority_vote_error_feedback_keeps_the_own_sign():
    """Under majority vote a worker's local estimate is its own sign, not
    the vote: its residual is x - sign(x)."""
    ef = compressors.ErrorFeedback(compressors.SignSGD(scaled=False))
    xs = [tf.constant([0.5, -2.0, 3.0]), tf.constant([-1.0, -1.0, -1.0])]
    state = ef.init_state((3,), tf.float32, _key(-1))
    sent = [ef.compress(x, state, _key()) for x in xs]
    stacked = tf.nest.map_structure(
        lambda *t: tf.stack(t), *[p for p, _ in sent]
    )
    for x, (_, ctx) in zip(xs, sent):
        total, new_state = ef.decompress(stacked, ctx)
        np.testing.assert_array_equal(total.numpy(), [0, -1, 0])
        np.testing.assert_array_equal(
            new_state.residual.numpy(), x.numpy() - np.sign(x.numpy())
        )


def test_powersgd_full_rank_is_exact_and_low_rank_is_close():
    m = _random((12, 5), tf.float32)
    exact = compressors.PowerSGD(rank=5)
    assert not exact.should_compress((12, 5))  # factors not smaller
    state = exact.init_state((12, 5), tf.float32, _key(-1))
    total, _, _, _ = local_step(exact, m, state, _key())
    np.testing.assert_allclose(total.numpy(), m.numpy(), atol=1e-4)

    u, v = _random((40, 2), tf.float32), _random((30, 2), tf.float32, 1)
    low_rank = tf.matmul(u, v, transpose_b=True)
    c = compressors.PowerSGD(rank=2)
    state = c.init_state((40, 30), tf.float32, _key(-1))
    total, _, _, _ = local_step(c, low_rank, state, _key())
    np.testing.assert_allclose(total.numpy(), low_rank.numpy(), atol=1e-3)


def _rank_two(shape, seed=0):
    u = _random((shape[0], 2), tf.float32, seed)
    v = _random((shape[1], 2), tf.float32, seed + 1)
    return tf.matmul(u, v, transpose_b=True)


def test_powersgd_reseeds_the_warm_start_after_a_zero_gradient():
    """An all-zero gradient makes Q = M^T P zero; a zero Q would make the
    next P zero, and the next update only the first rows of M. A fresh Q,
    drawn from the step's key, gives the exact rank-2 update instead."""
    c = compressors.PowerSGD(rank=2)
    shape = (40, 30)
    state = c.init_state(shape, tf.float32, _key(-1))
    total, state, _, _ = local_step(c, tf.zeros(shape), state, _key(0))
    np.testing.assert_array_equal(total.numpy(), 0)
    q = state.q.numpy()
    assert np.abs(q).min() > 0 and np.isfinite(q).all()
    again = local_step(c, tf.zeros(shape), state, _key(0))[1].q
    np.testing.assert_array_equal(again.numpy(), q)  # only the key decides
    m = _rank_two(shape)
    total, _, _, _ = local_step(c, m, state, _key(1))
    np.testing.assert_allclose(total.numpy(), m.numpy(), atol=1e-3)


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf], ids=str)
def test_powersgd_recovers_from_a_non_finite_gradient(special):
    """A non-finite gradient makes the update (and Q) non-finite; the next
    step starts from a fresh Q instead of NaN forever."""
    c = compressors.PowerSGD(rank=2)
    shape = (40, 30)
    state = c.init_state(shape, tf.float32, _key(-1))
    x = _rank_two(shape).numpy()
    x[3, 4] = special
    total, state, _, _ = local_step(c, tf.constant(x), state, _key(0))
    assert not np.isfinite(total.numpy()).all()
    assert np.isfinite(state.q.numpy()).all()
    m = _rank_two(shape, seed=5)
    total, _, _, _ = local_step(c, m, state, _key(1))
    np.testing.assert_allclose(total.numpy(), m.numpy(), atol=1e-3)


def test_powersgd_workers_agree_when_reseeding():
    """The choice is made on the all-reduced Q, the draw from the shared
    key: a worker whose own gradient is fine reseeds with the others."""
    c = compressors.PowerSGD(rank=2)
    shape = (40, 30)
    state = c.init_state(shape, tf.float32, _key(-1))
    bad = _rank_two(shape).numpy()
    bad[0, 0] = np.nan
    for xs in ([tf.zeros(shape)] * 2, [_rank_two(shape), tf.constant(bad)]):
        sent = [c.compress(x, state, _key(3)) for x in xs]
        p_sum = tf.add_n([p.factor for p, _ in sent])
        second = [c.next_round(type(p)(p_sum), ctx) for p, ctx in sent]
        q_sum = tf.add_n([p.factor for p, _ in second])
        qs = [c.decompress(type(p)(q_sum), ctx)[1].q for p, ctx in second]
        np.testing.assert_array_equal(qs[0].numpy(), qs[1].numpy())
        assert np.isfinite(qs[0].numpy()).all()
        assert np.abs(qs[0].numpy()).max() > 0


def test_powersgd_initial_factors_depend_only_on_key():
    c = compressors.PowerSGD(rank=3)
    a = c.init_state((20, 10), tf.float32, _key(-1)).q
    b = c.init_state((20, 10), tf.float32, _key(-1)).q
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert a.shape == (10, 3)


def test_powersgd_sends_vectors_dense_and_compresses_conv_kernels():
    assert not compressors.PowerSGD(rank=1).should_compress((1000,))
    # Keras conv kernel (kh, kw, in, out): a (576, 64) matrix.
    c = compressors.PowerSGD(rank=4)
    assert c.should_compress((3, 3, 64, 64))
    assert c.payload_bytes((3, 3, 64, 64), "float32") == 4 * (576 + 64) * 4


@pytest.mark.parametrize("density", [0, -0.1, 1.5, float("nan"), "a", None])
@pytest.mark.parametrize(
    "cls",
    [
        compressors.TopK,
        compressors.RandomK,
        compressors.MSTopK,
        compressors.RedSync,
    ],
)
def test_bad_density_names_argument_and_value(cls, density):
    with pytest.raises(ValueError, match=r"`density` must be .* Received"):
        cls(density=density)


@pytest.mark.parametrize("rank", [0, -1, 1.5, True])
def test_bad_rank(rank):
    with pytest.raises(ValueError, match="`rank`"):
        compressors.PowerSGD(rank=rank)


def test_get_by_name_and_unknown_name():
    assert isinstance(compressors.get("TopK", density=0.5), compressors.TopK)
    assert compressors.get("top_k", density=0.5).density == 0.5
    with pytest.raises(ValueError, match=r"Unknown compressor 'dgc'.*topk"):
        compressors.get("dgc")
    with pytest.raises(ValueError, match="Keyword arguments"):
        compressors.get(compressors.TopK(), density=0.1)


def test_error_feedback_cannot_be_nested():
    with pytest.raises(ValueError, match="already has error feedback"):
        compressors.ErrorFeedback(compressors.ErrorFeedback(compressors.TopK()))
