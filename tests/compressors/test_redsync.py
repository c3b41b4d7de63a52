"""RedSync in one process: momentum correction, threshold selection, its
dense and warm-up paths, DGC's local gradient clipping and density
warm-up, the cost model that decides per tensor, bad arguments and the
inner optimizers it refuses or warns of. Against numpy on real workers:
tests/multiworker/test_paper_algorithms.py.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from custom_ops.cuda_harness.numpy_oracle import np_select
from tests.compressors.common import heavy_tailed, replica_copies, shared_key
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import compressors
from tfgc.compressors import base
from tfgc.core.compressor import Network, StepInfo
from tfgc.optimizers import planning


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


def test_redsync_without_momentum_masking_keeps_u_where_it_sends():
    """The step of the test above with `momentum_masking=False`: V is
    still emptied where it is sent, U keeps its momentum there."""
    c = compressors.RedSync(
        density=0.25,
        momentum=0.5,
        selection="trimmed",
        cost_model=None,
        momentum_masking=False,
    )
    state = c.init_state((8,), tf.float32, shared_key(0, -1))
    g1 = np.float32([4, -3, 0.5, 0.1, -0.2, 2, 0, 1])
    total, state, _ = _redsync_step(c, g1, state)
    np.testing.assert_array_equal(total.numpy(), [4, -3, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(state.momentum.numpy(), g1)
    kept = np.float32([0, 0, 0.5, 0.1, -0.2, 2, 0, 1])
    np.testing.assert_array_equal(state.accumulation.numpy(), kept)
    g2 = np.float32([1, 0, 0, 0, 0, 0.5, 0, 0.2])
    total, state, _ = _redsync_step(c, g2, state, step=1)
    u = 0.5 * g1 + g2  # [3,-1.5,.25,.05,-.1,1.5,0,.7]
    v = kept + u  # [3,-1.5,.75,.15,-.3,3.5,0,1.7]
    np.testing.assert_allclose(
        total.numpy(), [3, 0, 0, 0, 0, 3.5, 0, 0], rtol=1e-6
    )
    np.testing.assert_allclose(state.momentum.numpy(), u, rtol=1e-6)
    sent = np.zeros(8, bool)
    sent[[0, 5]] = True
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
        ({"warmup_steps": 2**63}, r"`warmup_steps` must be .*\[0, 2\*\*62\]"),
        ({"cost_model": "fast"}, "`cost_model`"),
        ({"density_warmup_steps": -1}, "`density_warmup_steps`"),
        ({"density_warmup_steps": 1.5}, "density_warmup_steps=1.5"),
        ({"density_warmup_steps": "8"}, "density_warmup_steps='8'"),
        ({"density_warmup_steps": 2**63}, "`density_warmup_steps`"),
        ({"clipnorm": 0}, r"`clipnorm` must be None .* > 0"),
        ({"clipnorm": -1.0}, "clipnorm=-1.0"),
        ({"clipnorm": float("inf")}, "clipnorm=inf"),
        ({"clipnorm": "5"}, "clipnorm='5'"),
        ({"clipnorm": True}, "clipnorm=True"),
        ({"momentum_masking": 1}, "momentum_masking=1"),
        ({"momentum_masking": None}, "`momentum_masking`"),
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
        density_warmup_steps=40,
        clipnorm=2.5,
        momentum_masking=False,
    )
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(c)
    )
    assert restored == c
    assert restored.cost_model == c.cost_model
    assert restored.density_warmup_steps == 40 and restored.clipnorm == 2.5
    assert restored.momentum_masking is False
    for changed in ({"clipnorm": None}, {"momentum_masking": True}):
        assert restored != compressors.RedSync(**{**c.get_config(), **changed})
    # A config saved before these arguments existed: DGC's fixes off,
    # its masking on.
    new = ("density_warmup_steps", "clipnorm", "momentum_masking")
    old = {k: v for k, v in c.get_config().items() if k not in new}
    older = compressors.RedSync.from_config(old)
    assert older.density_warmup_steps == 0 and older.clipnorm is None
    assert older.momentum_masking is True


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


@pytest.mark.parametrize("option", ["global_clipnorm", "clipnorm"])
def test_redsync_clipping_warns_of_inner_clipping(option):
    """RedSync's clipnorm replaces the inner optimizer's: with both, the
    gradient is clipped twice, and one warning names both values."""
    inner = keras.optimizers.SGD(0.1, **{option: 1.5})
    with pytest.warns(UserWarning, match="clipped twice") as record:
        tfgc.CompressedOptimizer(inner, compressors.RedSync(clipnorm=2.5))
    assert len(record) == 1
    message = str(record[0].message)
    assert "RedSync(clipnorm=2.5)" in message
    assert f"{option}=1.5" in message
    assert "drop" in message


@pytest.mark.parametrize(
    "inner, clipnorm",
    [
        (lambda: keras.optimizers.SGD(0.1, global_clipnorm=1.5), None),
        (lambda: keras.optimizers.SGD(0.1, clipnorm=1.5), None),
        (lambda: keras.optimizers.SGD(0.1), 2.5),
        (lambda: keras.optimizers.SGD(0.1, clipvalue=1.0), 2.5),
    ],
)
def test_redsync_clipping_once_does_not_warn(inner, clipnorm):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        tfgc.CompressedOptimizer(
            inner(), compressors.RedSync(clipnorm=clipnorm)
        )
    assert not [w for w in record if "clipped twice" in str(w.message)]


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


# --- DGC's training fixes: local gradient clipping, density warm-up ---------


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
def test_local_clipping_scales_to_clipnorm_over_sqrt_workers(dtype):
    """g = (3, 4, 0, 0), |g| = 5. clipnorm 2 over 4 workers: threshold
    2 / sqrt(4) = 1, g becomes (0.6, 0.8, 0, 0) before it enters U; over
    one worker 2: (1.2, 1.6, 0, 0). Below the threshold g passes bit for
    bit. The dense and warm-up paths clip the same."""
    c = compressors.RedSync(
        density=0.25,
        momentum=0.5,
        selection="trimmed",
        cost_model=None,
        clipnorm=2.0,
    )
    assert c.spec.reads_step_info
    assert not compressors.RedSync(cost_model=None).spec.reads_step_info
    tol = {"rtol": 1e-3 if dtype == tf.float16 else 1e-6}
    g = tf.constant([3, 4, 0, 0], dtype)
    state = c.init_state((4,), dtype, shared_key(0, -1))

    def sent(info, x=g):
        payload, ctx = c.compress(x, state, shared_key(0, 0), info)
        return payload, ctx.state

    payload, new_state = sent(StepInfo(g, 0, 4))
    np.testing.assert_array_equal(payload.indices.numpy(), [1])
    np.testing.assert_allclose(payload.values.numpy(), [0.8], **tol)
    np.testing.assert_allclose(
        new_state.momentum.numpy(), [0.6, 0, 0, 0], **tol
    )
    np.testing.assert_allclose(
        new_state.accumulation.numpy(), [0.6, 0, 0, 0], **tol
    )
    payload, _ = sent(StepInfo(g, 0, 1))
    np.testing.assert_allclose(payload.values.numpy(), [1.6], **tol)
    small = tf.constant([0.3, 0.4, 0, 0], dtype)  # |g| = 0.5 < 1
    payload, new_state = sent(StepInfo(small, 0, 4), small)
    assert payload.values.numpy()[0] == small.numpy()[1]
    np.testing.assert_array_equal(
        new_state.momentum.numpy(), [small.numpy()[0], 0, 0, 0]
    )

    dense = c.dense_compressor()
    assert isinstance(dense, compressors.redsync.MomentumDense)
    assert dense.spec.reads_step_info
    payload, _ = dense.compress(
        g, dense.init_state((4,), dtype, None), None, StepInfo(g, 0, 4)
    )
    np.testing.assert_allclose(payload.values.numpy(), [0.6, 0.8, 0, 0], **tol)
    warm = c.warmup_compressor()
    assert warm.spec.reads_step_info
    payload, _ = warm.compress(g, state, None, StepInfo(g, 0, 4))
    np.testing.assert_allclose(payload.values.numpy(), [0.6, 0.8, 0, 0], **tol)
    # Without momentum the dense path still clips (not a bare Identity).
    plain = compressors.RedSync(momentum=0.0, clipnorm=1.0).dense_compressor()
    assert isinstance(plain, compressors.redsync.MomentumDense)


def test_clipping_without_the_number_of_workers_names_the_fix():
    c = compressors.RedSync(density=0.5, cost_model=None, clipnorm=1.0)
    g = tf.constant([3.0, 4.0])
    state = c.init_state((2,), tf.float32, None)
    with pytest.raises(ValueError, match=r"clipnorm=1\.0.*CompressedOptimizer"):
        c.compress(g, state, shared_key(0, 0))


def test_local_clipping_on_replicas_uses_their_number(mirrored):
    """Through the optimizer on 4 replicas, each clips its own gradient to
    clipnorm / sqrt(4) before the sum, on the sparse path (a kernel, all
    entries sent at density 1) and the dense path (a bias below
    `min_compress_size`); SGD(1) applies the sum of the clipped
    gradients, identically on every replica."""
    p = NUM_LOGICAL_CPUS
    clipnorm = 3.0
    threshold = clipnorm / np.sqrt(p)
    shapes = [(4, 8), (8,)]
    with mirrored.scope():
        variables = [keras.Variable(np.zeros(s, "float32")) for s in shapes]
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(1.0),
            compressors.RedSync(
                density=1.0,
                momentum=0.0,
                selection="trimmed",
                cost_model=None,
                clipnorm=clipnorm,
            ),
            min_compress_size=16,
        )
        opt.build(variables)
    assert [type(plan.phases[0]).__name__ for plan in opt._plans] == [
        "RedSync",
        "MomentumDense",
    ]

    def grads(r):
        # Norms 0.5, 1, 3 and 10: below and above the threshold, 1.5.
        norm = (0.5, 1.0, 3.0, 10.0)[r % 4]
        out = []
        for i, s in enumerate(shapes):
            g = heavy_tailed(s, 10 * r + i).astype("float64")
            out.append((norm * g / np.linalg.norm(g)).astype("float32"))
        return out

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            gs = [
                tf.switch_case(
                    r,
                    [
                        lambda i=i, j=j: tf.constant(grads(i)[j])
                        for i in range(p)
                    ],
                )
                for j in range(len(shapes))
            ]
            opt.apply(gs, variables)

        mirrored.run(replica_fn)

    step()
    for j, v in enumerate(variables):
        expected = np.zeros(shapes[j], "float32")
        norms = []
        for r in range(p):
            g = grads(r)[j].astype("float64")
            norm = np.linalg.norm(g)
            norms.append(norm)
            expected -= g * threshold / max(norm, threshold)
        assert min(norms) < threshold < max(norms)  # both cases
        copies = replica_copies(v)
        assert len(copies) == p
        for copy in copies:
            np.testing.assert_array_equal(copy, copies[0])
        np.testing.assert_allclose(copies[0], expected, rtol=1e-5, atol=1e-6)


def test_density_warmup_schedule():
    """DGC's warm-up at 0.1 %: after 3 dense steps, 25 %, 6.25 %, 1.5625 %,
    0.39 % for 10 steps each (40 steps, 4 stages), then 0.1 %; the graph
    sends the stage's k at the key's step."""
    c = compressors.RedSync(
        density=0.001,
        selection="trimmed",
        warmup_steps=3,
        density_warmup_steps=40,
        cost_model=None,
    )
    assert c.warmup_densities() == (0.25, 0.0625, 0.015625, 0.00390625)
    expected = (
        [1.0] * 3
        + [0.25] * 10
        + [0.0625] * 10
        + [0.015625] * 10
        + [0.00390625] * 10
        + [0.001] * 3
    )
    assert [c.density_at(s) for s in range(46)] == expected
    assert c.density_at(10**9) == 0.001
    # The optimizer's key carries the step RedSync reads.
    assert int(planning.key(12345, 17)[1]) == 17
    n = 10_000
    x = tf.constant(heavy_tailed((n,), 3))
    state = c.init_state((n,), tf.float32, None)
    for step in (3, 12, 13, 22, 23, 42, 43, 1000):
        payload, _ = c.compress(x, state, shared_key(0, step))
        k = base.num_selected(n, c.density_at(step))
        assert payload.indices.shape[0] == k, step
    # Trimmed selection sends k of the stage: unequal across steps, so
    # the gather carries sizes, and XLA is refused with the reason.
    assert c.spec.collectives == (compressors.ALL_GATHER_RAGGED,)
    assert "density_warmup_steps" in c.xla_unsupported()
    # Threshold selection lands in (k, 2k) of the stage.
    t = compressors.RedSync(
        density=0.001, density_warmup_steps=8, cost_model=None
    )
    payload, _ = t.compress(x, state, shared_key(0, 2))  # 6.25 %
    assert 625 < payload.indices.shape[0] < 1250
    # The number of stages follows the final density; from 25 % up, none.
    assert compressors.RedSync(density=0.01).warmup_densities() == (
        0.25,
        0.0625,
        0.015625,
    )
    flat = compressors.RedSync(
        density=0.25, selection="trimmed", density_warmup_steps=8
    )
    assert flat.warmup_densities() == () and flat.density_at(0) == 0.25
    assert flat.spec.collectives == (compressors.ALL_GATHER,)
    assert flat.xla_unsupported() is None


def test_density_warmup_same_k_and_weights_on_every_worker(mirrored):
    """4 replicas with different gradients: at every step each sends the
    k of `density_at(step)` (dense in the first step, then 25 % down to
    0.1 % of 4,096 entries) with the same gather overhead, and the
    weights stay bit-identical across replicas."""
    p = NUM_LOGICAL_CPUS
    c = compressors.RedSync(
        density=0.001,
        selection="trimmed",
        warmup_steps=1,
        density_warmup_steps=8,
        cost_model=None,
    )
    with mirrored.scope():
        w = keras.Variable(np.zeros((64, 64), "float32"))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1), c, min_compress_size=0
        )
        opt.build([w])

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.switch_case(
                r,
                [
                    lambda i=i: tf.constant(heavy_tailed((64, 64), 50 + i))
                    for i in range(p)
                ],
            )
            opt.apply([g], [w])

        mirrored.run(replica_fn)

    counts = []
    for s in range(11):
        step()
        density = c.density_at(s)
        expected = (
            4096 * 4 if density == 1.0 else base.num_selected(4096, density) * 8
        )
        sent = [int(b) for b in replica_copies(opt._counters.last.sent)]
        padding = [int(b) for b in replica_copies(opt._counters.last.overhead)]
        assert sent == [expected] * p, (s, sent)
        assert len(set(padding)) == 1, (s, padding)  # the same gather
        copies = replica_copies(w)
        for copy in copies[1:]:
            np.testing.assert_array_equal(copy, copies[0])
        counts.append(None if density == 1.0 else expected // 8)
    assert counts == [None, 1024, 1024, 256, 256, 64, 64, 16, 16, 5, 5]
