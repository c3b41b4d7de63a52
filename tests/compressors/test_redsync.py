"""RedSync in one process: momentum correction, threshold selection, its
dense and warm-up paths, the cost model that decides per tensor, bad
arguments and the inner optimizers it refuses. Against numpy on real
workers: tests/multiworker/test_paper_algorithms.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from custom_ops.cuda_harness.numpy_oracle import np_select
from tests.compressors.common import heavy_tailed, shared_key
from tfgc import compressors
from tfgc.core.compressor import Network


def _redsync_step(c, g, state, step=0):
    payload, ctx = c.compress(tf.constant(g), state, shared_key(0, step))
    received = tf.nest.map_structure(
        lambda t: (
            tf.RaggedTensor.from_tensor(t[None])
            if c.spec.collectives == (compressors.ALL_GATHER_RAGGED,)
            else t[None]
        ),
        payload,
    )
    return c.decompress(received, ctx) + (payload,)


def test_redsync_momentum_correction_by_hand():
    c = compressors.RedSync(
        density=0.25, momentum=0.5, selection="trimmed", cost_model=None
    )
    state = c.init_state((8,), tf.float32, shared_key(0, -1))
    g1 = np.float32([4, -3, 0.5, 0.1, -0.2, 2, 0, 1])
    total, state, _ = _redsync_step(c, g1, state)
    # U = g, V = g: the two largest |V| (4, -3) go; both zeroed in U and V.
    np.testing.assert_array_equal(total.numpy(), [4, -3, 0, 0, 0, 0, 0, 0])
    kept = np.float32([0, 0, 0.5, 0.1, -0.2, 2, 0, 1])
    np.testing.assert_array_equal(state.momentum.numpy(), kept)
    np.testing.assert_array_equal(state.accumulation.numpy(), kept)
    g2 = np.float32([0, 0, 0, 0, 0, 0.5, 0, 0.2])
    total, state, _ = _redsync_step(c, g2, state, step=1)
    u = 0.5 * kept + g2  # [0,0,.25,.05,-.1,1.5,0,.7]
    v = kept + u  # [0,0,.75,.15,-.3,3.5,0,1.7]
    np.testing.assert_allclose(
        total.numpy(), [0, 0, 0, 0, 0, 3.5, 0, 1.7], rtol=1e-6
    )
    sent = np.zeros(8, bool)
    sent[[5, 7]] = True
    np.testing.assert_allclose(
        state.momentum.numpy(), np.where(sent, 0, u), rtol=1e-6
    )
    np.testing.assert_allclose(
        state.accumulation.numpy(), np.where(sent, 0, v), rtol=1e-6
    )


def test_redsync_threshold_sends_between_k_and_2k():
    c = compressors.RedSync(density=0.01, cost_model=None)
    x = heavy_tailed((20000,), seed=4)
    state = c.init_state((20000,), tf.float32, shared_key(0, -1))
    _, state, payload = _redsync_step(c, x, state)
    k = 200
    count = int(payload.indices.shape[0])
    assert k < count < 2 * k
    expected = np_select(x, k, "threshold", rounds=20)
    np.testing.assert_array_equal(np.sort(payload.indices.numpy()), expected)
    assert c.spec.collectives == (compressors.ALL_GATHER_RAGGED,)
    assert compressors.RedSync(selection="trimmed").spec.collectives == (
        compressors.ALL_GATHER,
    )


def test_redsync_dense_and_warmup_paths_are_momentum_sgd():
    dense = compressors.RedSync(momentum=0.9).dense_compressor()
    assert isinstance(dense, compressors.redsync.MomentumDense)
    assert isinstance(
        compressors.RedSync(momentum=0.0).dense_compressor(),
        compressors.Identity,
    )
    warm = compressors.RedSync(momentum=0.9).warmup_compressor()
    state = compressors.redsync.RedSyncState(
        tf.constant([1.0, 2.0]), tf.constant([0.5, 0.0])
    )
    payload, ctx = warm.compress(tf.constant([1.0, 1.0]), state, None)
    new_state = ctx.state
    # U = 0.9 U + g; U + V is sent and V emptied.
    np.testing.assert_allclose(payload.values.numpy(), [2.4, 2.8])
    np.testing.assert_allclose(new_state.momentum.numpy(), [1.9, 2.8])
    np.testing.assert_array_equal(new_state.accumulation.numpy(), [0, 0])


def _regression_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((20,)), keras.layers.Dense(64), keras.layers.Dense(1)]
    )


def _fit(model, optimizer, steps=6):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * steps, 20)).astype("float32")
    y = rng.normal(size=(32 * steps, 1)).astype("float32")
    model.compile(optimizer, "mse", jit_compile=False)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights]


def test_redsync_in_warmup_equals_momentum_sgd_then_goes_sparse():
    plain = _fit(_regression_model(), keras.optimizers.SGD(0.01, momentum=0.9))
    warm = _fit(
        _regression_model(),
        tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.01),
            compressors.RedSync(density=0.01, warmup_steps=6, cost_model=None),
            min_compress_size=100,
        ),
    )
    for a, b in zip(plain, warm):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # After the warm-up only k entries of the kernel move per step.
    model = _regression_model()
    opt = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.01),
        compressors.RedSync(
            density=0.01, selection="trimmed", warmup_steps=2, cost_model=None
        ),
        min_compress_size=100,
    )
    before = model.layers[0].kernel.numpy()
    _fit(model, opt, steps=2)
    assert np.all(model.layers[0].kernel.numpy() != before)  # dense steps
    before = model.layers[0].kernel.numpy()
    _fit(model, opt, steps=1)
    changed = np.count_nonzero(model.layers[0].kernel.numpy() != before)
    assert changed == int(np.ceil(0.01 * 20 * 64))


def test_cost_model_decides_from_the_network_and_the_peers():
    big = (4096, 4096)
    n = 4096 * 4096

    def redsync(latency, bandwidth):
        cost = compressors.CostModel(latency=latency, bandwidth=bandwidth)
        return compressors.RedSync(density=0.001, cost_model=cost), cost

    slow, cost = redsync(1e-3, 125e6)  # 1 Gbit/s
    assert slow.should_compress(big, "float32", Network(8))
    fast, _ = redsync(0.0, 1e12)  # compute costs more than the bytes
    assert not fast.should_compress(big, "float32", Network(8))
    # One worker: nothing to send, dense costs nothing.
    assert not slow.should_compress(big, "float32", Network(1))
    # The model's own numbers: ring all-reduce vs all-gather + compute.
    assert cost.dense_time(4 * n, 8) == pytest.approx(
        14e-3 + 1.75 * 4 * n / 125e6
    )
    sent = slow.payload_bytes(big, "float32")
    assert sent == (2 * 16778 - 1) * 8
    assert cost.sparse_time(n, sent, 8) == pytest.approx(
        3e-3 + 7 * sent / 125e6 + 1.2e-9 * n
    )
    always = compressors.RedSync(cost_model=None)
    assert always.should_compress((64,), "float32", Network(8))
    with pytest.raises(ValueError, match="measures when it is built"):
        compressors.RedSync().should_compress(big, "float32", Network(8))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"momentum": 1.0}, "`momentum`"),
        ({"momentum": -0.1}, "`momentum`"),
        ({"selection": "exact"}, "`selection`"),
        ({"rounds": 0}, "`rounds`"),
        ({"warmup_steps": -1}, "`warmup_steps`"),
        ({"cost_model": "fast"}, "`cost_model`"),
    ],
)
def test_redsync_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compressors.RedSync(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"latency": -1, "bandwidth": 1e9}, "`latency`"),
        ({"latency": 0, "bandwidth": 0}, "`bandwidth`"),
        ({"latency": 0, "bandwidth": float("inf")}, "`bandwidth`"),
        ({"latency": 0, "bandwidth": 1, "select_time": "x"}, "select_time"),
    ],
)
def test_cost_model_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compressors.CostModel(**kwargs)


def test_redsync_config_round_trip_keeps_cost_model():
    c = compressors.RedSync(
        density=0.002,
        momentum=0.8,
        selection="trimmed",
        rounds=12,
        warmup_steps=5,
        cost_model=compressors.CostModel(latency=2e-3, bandwidth=1e9),
    )
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(c)
    )
    assert restored == c
    assert restored.cost_model == c.cost_model


@pytest.mark.parametrize(
    "inner",
    [
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.SGD(0.1, momentum=0.5, nesterov=True),
        lambda: keras.optimizers.Adam(1e-3),
    ],
)
def test_redsync_refuses_an_inner_optimizer_with_momentum(inner):
    optimizer = inner()
    with pytest.raises(ValueError, match=r"SGD\(learning_rate\).*RedSync"):
        tfgc.CompressedOptimizer(optimizer, compressors.RedSync(momentum=0.9))
    # The refusal left the user's optimizer as it was.
    assert not hasattr(
        optimizer._all_reduce_sum_gradients, "_tfgc_skips_when_summed"
    )


def test_redsync_without_momentum_takes_any_inner_optimizer():
    tfgc.CompressedOptimizer(
        keras.optimizers.Adam(1e-3), compressors.RedSync(momentum=0.0)
    )


def test_redsync_refuses_error_feedback_false():
    with pytest.raises(ValueError, match="keeps its own residual"):
        tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1),
            compressors.RedSync(),
            error_feedback=False,
        )


def test_probe_needs_eager_build(mirrored):
    with mirrored.scope():
        v = keras.Variable(np.zeros((300, 300), "float32"))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1), compressors.RedSync()
        )

    @tf.function
    def build():
        opt.build([v])

    with pytest.raises(ValueError, match="outside tf.function"):
        with mirrored.scope():
            build()
