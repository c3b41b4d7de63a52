"""Batched compression (`Compressor.compress_batch`) against one by one.

TopK and MSTopK can select in every tensor of a bucket with one segmented
op (`tfgc.ops.top_k_sample_segments`). The batch must be invisible except
in the number of ops: the same payloads, residuals and trained weights, bit
for bit. On the CPU the default (`batch_selection=None`) does not batch,
so these tests ask for it with `batch_selection=True`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests import backends
from tfgc import compressors
from tfgc.communicators import exchange

SEGMENTS_OP = "TopKSampleSegments"
# Mixed shapes: a scalar, an empty tensor, k = n, sizes that round k up.
SHAPES = [(30, 40), (), (0,), (7,), (100,), (5, 5, 5), (3,)]


@pytest.fixture
def library_on(monkeypatch):
    backends.use("custom", monkeypatch)


def _tensors(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [
        tf.cast(rng.standard_t(2, size=s).astype("float32"), dtype)
        for s in SHAPES
    ]


def _make(name, density, batch, ef):
    cls = {"topk": compressors.TopK, "mstopk": compressors.MSTopK}[name]
    c = cls(density, batch_selection=batch)
    return compressors.ErrorFeedback(c) if ef else c


def _compress_all(compressor, xs, batch):
    keys = [tf.constant([i, 7], tf.int64) for i in range(len(xs))]
    states = [
        compressor.init_state(x.shape, x.dtype, k) for x, k in zip(xs, keys)
    ]
    if isinstance(compressor, compressors.ErrorFeedback):
        states = [
            s._replace(residual=tf.cast(x * 0.5 + 0.25, x.dtype))
            for s, x in zip(states, xs)
        ]
    if batch:
        return compressor.compress_batch(xs, states, keys)
    return [compressor.compress(x, s, k) for x, s, k in zip(xs, states, keys)]


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("ef", [False, True], ids=["plain", "ef"])
@pytest.mark.parametrize("name", ["topk", "mstopk"])
def test_batch_equals_one_by_one(library_on, name, ef, dtype):
    xs = _tensors(dtype)
    one_by_one = _compress_all(_make(name, 0.05, False, ef), xs, batch=False)
    batched = _compress_all(_make(name, 0.05, True, ef), xs, batch=True)
    assert batched is not None
    assert len(batched) == len(xs)
    for x, (p0, c0), (p1, c1) in zip(xs, one_by_one, batched):
        assert p1.values.dtype == dtype and p1.indices.dtype == tf.int32
        np.testing.assert_array_equal(p0.indices.numpy(), p1.indices.numpy())
        np.testing.assert_array_equal(
            tf.cast(p0.values, tf.float32).numpy(),
            tf.cast(p1.values, tf.float32).numpy(),
        )
        if ef:
            assert c1.residual.shape == x.shape
            np.testing.assert_array_equal(
                tf.cast(c0.residual, tf.float32).numpy(),
                tf.cast(c1.residual, tf.float32).numpy(),
            )


def test_no_batch_where_it_gains_nothing(library_on, monkeypatch):
    xs = _tensors(tf.float32)
    for c in (
        _make("topk", 0.05, False, ef=True),
        compressors.TopK(0.05),  # default: only where the ops run on a GPU
        compressors.SignSGD(),
    ):
        assert _compress_all(c, xs, batch=True) is None
    # float64 goes to tf.math.top_k, one tensor at a time.
    xs64 = _tensors(tf.float64)
    assert _compress_all(_make("topk", 0.05, True, False), xs64, True) is None
    backends.use("reference", monkeypatch)
    assert _compress_all(_make("topk", 0.05, True, True), xs, True) is None


def test_batch_selection_is_validated_and_serialized():
    with pytest.raises(ValueError, match="`batch_selection`.*Received"):
        compressors.TopK(0.1, batch_selection="yes")
    c = compressors.MSTopK(0.1, rounds=12, batch_selection=True)
    again = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(c)
    )
    assert again == c and again.batch_selection is True
    assert "batch_selection" not in compressors.TopK(0.1).get_config()


def _group_counts(compressor, xs):
    """How many segmented ops a traced exchange of xs runs."""
    keys = [tf.constant([i, 3], tf.int64) for i in range(len(xs))]
    states = [
        compressor.init_state(x.shape, x.dtype, k) for x, k in zip(xs, keys)
    ]

    def carry(payloads, collectives):
        del collectives
        gathered = [
            tf.nest.map_structure(lambda t: t[None], p) for p in payloads
        ]
        return gathered, exchange.zero_bytes()

    @tf.function
    def step(tensors):
        totals, _, _, _ = exchange.run_rounds(
            [compressor] * len(tensors), tensors, states, keys, carry
        )
        return totals

    graph = step.get_concrete_function(xs).graph
    ops = [op.type for op in graph.get_operations()]
    return sum(SEGMENTS_OP in t for t in ops), step(xs)


@pytest.mark.parametrize("name", ["topk", "mstopk"])
def test_exchange_runs_one_segmented_op_per_bucket(library_on, name):
    xs = _tensors(tf.float32)
    count, totals = _group_counts(_make(name, 0.05, True, True), xs)
    assert count == 1
    count, expected = _group_counts(_make(name, 0.05, False, True), xs)
    assert count == 0
    for a, b in zip(totals, expected):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("name", ["topk", "mstopk"])
def test_training_is_bit_identical(library_on, mirrored, monkeypatch, name):
    """Four replicas, a few Keras steps: the same weights and residuals."""
    strategy = mirrored
    calls = []
    segmented = tfgc.ops.top_k_sample_segments

    def counted(*args, **kwargs):
        calls.append(len(args[3]))  # the number of segments
        return segmented(*args, **kwargs)

    monkeypatch.setattr(tfgc.ops, "top_k_sample_segments", counted)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 12)).astype("float32")
    y = rng.integers(0, 4, size=64)
    results = []
    for batch in (False, True):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [
                    keras.Input((12,)),
                    keras.layers.Dense(32, activation="relu"),
                    keras.layers.Dense(16, activation="relu"),
                    keras.layers.Dense(4),
                ]
            )
            opt = tfgc.CompressedOptimizer(
                keras.optimizers.SGD(0.1),
                compressor=_make(name, 0.1, batch, ef=False),
                min_compress_size=0,
            )
            model.compile(
                opt,
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=False,
            )
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        # Traced once per replica, every compressed tensor in one op.
        assert calls == ([len(opt._plans)] * 4 if batch else [])
        residuals = [
            [r.numpy() for r in plan.state_variables[0].value.values]
            for plan in opt._plans
            if plan.state_variables
        ]
        results.append(([w.numpy() for w in model.weights], residuals))
    (w0, r0), (w1, r1) = results
    assert r0 and len(r0) == len(r1)
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(r0, r1):
        np.testing.assert_array_equal(np.stack(a), np.stack(b))
