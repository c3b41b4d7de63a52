"""RedSync, MSTopK and HiTopKComm in one process: semantics and bad input.

Real multi-worker runs against a numpy reference are in
tests/test_paper_algorithms_multiworker.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from custom_ops.cuda_harness.numpy_oracle import np_select
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import communicators, compressors
from tfgc.communicators import fusion
from tfgc.communicators.topology import Topology
from tfgc.compressors import _sparse
from tfgc.core.compressor import Network


def _heavy(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_t(2, size=shape).astype(np.float32)


def _key(index, step):
    return tf.constant([index, step], tf.int64)


def _np_seed(index, step):
    return int(np.int64(index) ^ (np.int64(step) << np.int64(32)))


# --- MSTopK ------------------------------------------------------------------


def test_mstopk_sends_exactly_k_as_specified():
    c = compressors.MSTopK(density=0.01, rounds=20)
    x = _heavy((300, 70), seed=1)
    payload, _ = c.compress(tf.constant(x), (), _key(5, 3))
    k = int(np.ceil(0.01 * x.size))
    assert payload.indices.shape == (k,)
    expected = np_select(x, k, "mstopk", rounds=20, seed=_np_seed(5, 3))
    np.testing.assert_array_equal(np.sort(payload.indices.numpy()), expected)
    np.testing.assert_array_equal(
        payload.values.numpy(), x.reshape(-1)[payload.indices.numpy()]
    )


def test_mstopk_band_slice_follows_the_shared_key():
    # Many equal magnitudes: the band is wide and the slice start matters.
    x = np.where(np.arange(4000) % 3 == 0, 1.0, 0.5).astype(np.float32)
    c = compressors.MSTopK(density=0.05)
    picks = {
        tuple(c.compress(tf.constant(x), (), _key(0, s))[0].indices.numpy())
        for s in range(4)
    }
    assert len(picks) > 1
    again = c.compress(tf.constant(x), (), _key(0, 2))[0].indices.numpy()
    assert tuple(again) in picks


def test_mstopk_error_feedback_conserves_mass_through_fused_op():
    c = compressors.ErrorFeedback(compressors.MSTopK(density=0.02))
    state = c.init_state((50, 40), tf.float32, _key(0, -1))
    total_in = np.zeros((50, 40), np.float32)
    total_sent = np.zeros((50, 40), np.float32)
    for step in range(4):
        x = _heavy((50, 40), seed=step)
        payload, ctx = c.compress(tf.constant(x), state, _key(0, step))
        sent, state = c.decompress(
            tf.nest.map_structure(lambda t: t[None], payload), ctx
        )
        total_in += x
        total_sent += sent.numpy()
    np.testing.assert_allclose(
        total_sent + state.residual.numpy(), total_in, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("rounds", [0, 65, 2.5])
def test_mstopk_bad_rounds(rounds):
    with pytest.raises(ValueError, match="`rounds`"):
        compressors.MSTopK(rounds=rounds)


# --- RedSync -----------------------------------------------------------------


def _redsync_step(c, g, state, step=0):
    payload, ctx = c.compress(tf.constant(g), state, _key(0, step))
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
    state = c.init_state((8,), tf.float32, _key(0, -1))
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
    x = _heavy((20000,), seed=4)
    state = c.init_state((20000,), tf.float32, _key(0, -1))
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


# --- what the optimizer refuses ---------------------------------------------


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


# --- hierarchical: planning --------------------------------------------------


def _topology(hosts, from_spec=True):
    return Topology(tuple(hosts), ("/cpu:0",), "test", from_spec)


def test_hierarchical_reads_hosts_from_the_cluster_spec():
    h = communicators.Hierarchical(dense_threshold=100)
    h.build(_topology([0, 0, 1, 1]))
    assert (h.num_hosts, h.per_host, h.num_peers) == (2, 2, 2)
    assert h.compressed_shape((101, 30)) == (51, 30)
    assert h.compressed_shape((3, 3, 16, 8)) == (72, 8)
    assert h.compressed_shape((20001,)) == (10001,)
    assert h.compressed_shape((9, 9)) == (9, 9)  # under the threshold
    assert h.sends_dense((9, 9)) and not h.sends_dense((101, 30))


def test_hierarchical_with_one_host_sends_everything_dense():
    h = communicators.Hierarchical(workers_per_host=4, dense_threshold=0)
    h.build(_topology([0, 0, 0, 0], from_spec=False))
    assert h.sends_dense((1000, 1000))
    assert h.compressed_shape((1000, 1000)) == (1000, 1000)


@pytest.mark.parametrize(
    "hosts, kwargs, match",
    [
        ([0], {}, "at least 2 workers"),
        ([0, 0, 0, 1], {}, "same number of workers on every host"),
        ([0, 0, 1, 1], {"workers_per_host": 3}, "must divide"),
        ([0, 0, 1, 1], {"workers_per_host": 4}, "disagrees with the cluster"),
        ([0, 0, 1, 1], {"workers_per_host": 1}, "disagrees with the cluster"),
    ],
)
def test_hierarchical_bad_topologies(hosts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        communicators.Hierarchical(**kwargs).build(_topology(hosts))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"workers_per_host": 0}, "`workers_per_host`"),
        ({"workers_per_host": 2.0}, "`workers_per_host`"),
        ({"dense_threshold": -1}, "`dense_threshold`"),
    ],
)
def test_hierarchical_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        communicators.Hierarchical(**kwargs)


def test_hierarchical_config_round_trip():
    h = communicators.Hierarchical(workers_per_host=2, dense_threshold=77)
    restored = communicators.get(communicators.serialize(h))
    assert isinstance(restored, communicators.Hierarchical)
    assert restored.get_config() == h.get_config()


def test_hierarchical_optimizer_with_one_replica_fails_at_build():
    opt = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1),
        compressors.MSTopK(),
        communicator="hierarchical",
    )
    with pytest.raises(ValueError, match="at least 2 workers"):
        opt.build([keras.Variable(np.zeros((200, 200), "float32"))])


# --- hierarchical and unequal gathers on logical CPUs ----------------------


def _train(strategy, compressor, communicator, steps=3):
    with strategy.scope():
        kernel = keras.Variable(np.zeros((96, 300), "float32"))
        bias = keras.Variable(np.zeros((10,), "float32"))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1),
            compressor=compressor,
            communicator=communicator,
            min_compress_size=100,
        )
        opt.build([kernel, bias])

    @tf.function
    def step(s):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.random.stateless_normal((96, 300), seed=[r, s]) ** 3
            opt.apply([g, tf.ones(10) * tf.cast(r, tf.float32)], [kernel, bias])

        strategy.run(replica_fn)

    for s in range(steps):
        step(tf.constant(s))
    return kernel.numpy(), bias.numpy(), opt.compression_stats()


def test_hierarchical_degenerate_layouts(mirrored):
    def hier(g):
        return communicators.Hierarchical(
            workers_per_host=g, dense_threshold=1000
        )

    flat, _, flat_stats = _train(mirrored, compressors.MSTopK(0.01), "auto")
    one_per_host, _, stats = _train(mirrored, compressors.MSTopK(0.01), hier(1))
    np.testing.assert_allclose(one_per_host, flat, rtol=1e-6, atol=1e-6)
    assert stats["sent_bytes"] == flat_stats["sent_bytes"]
    assert stats["intra_host_bytes"] == 0
    dense, _, _ = _train(mirrored, compressors.Identity(), "auto")
    one_host, _, _ = _train(mirrored, compressors.MSTopK(0.01), hier(4))
    np.testing.assert_allclose(one_host, dense, rtol=1e-5, atol=1e-5)
    # Everything selected: the two-level exchange must give the dense sum.
    full, bias, stats = _train(mirrored, compressors.MSTopK(1.0), hier(2))
    np.testing.assert_allclose(full, dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bias, -0.1 * 3 * sum(range(NUM_LOGICAL_CPUS)))
    # Bytes between hosts: each worker's shard payload (k values + k int32
    # indices of 48 x 300 entries) and the dense bias.
    assert stats["sent_bytes"] == 48 * 300 * 8 + 10 * 4
    assert stats["intra_host_bytes"] == 3 * 48 * 300 * 4


def test_ragged_gather_carries_unequal_sizes_and_dtypes(mirrored):
    dtypes = [tf.float32, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.uint8]

    def values(r, i, dtype):
        n = 3 * r + i  # replica 0 sends an empty tensor for i == 0
        return tf.cast(tf.range(n) * (i + 1) + 10 * r, dtype)

    @tf.function
    def run():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            tensors = [values(r, i, d) for i, d in enumerate(dtypes)]
            group = communicators.Auto().group()
            return fusion.all_gather_ragged(tensors, group)

        return mirrored.run(replica_fn)

    gathered, overhead = run()
    for local in mirrored.experimental_local_results(gathered):
        for i, (rows, dtype) in enumerate(zip(local, dtypes)):
            assert rows.dtype == dtype
            for r in range(NUM_LOGICAL_CPUS):
                np.testing.assert_array_equal(
                    rows[r].numpy(), values(r, i, dtype).numpy()
                )
    # Replica 0's buffer: 6 header words + its data, padded to the longest
    # buffer's rung of the ladder, plus its length word.
    sizes = [4, 2, 2, 4, 8, 1]
    words = [
        sum(-(-(3 * r + i) * s // 4) for i, s in enumerate(sizes)) + 6
        for r in range(NUM_LOGICAL_CPUS)
    ]
    rung = min(x for x in communicators.collectives.LADDER if x >= max(words))
    own = sum(i * s for i, s in enumerate(sizes))
    first = mirrored.experimental_local_results(overhead)[0]
    assert int(first) == 4 * rung + 4 - own


def test_selection_seed_matches_the_documented_formula():
    seed = _sparse.selection_seed(tf.constant([12345, 7], tf.int64))
    assert int(seed) == _np_seed(12345, 7)
