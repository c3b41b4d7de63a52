"""Exchange buckets for every compressor (`CompressedOptimizer(bucket_bytes=)`):
how tensors are grouped, and that bucketing leaves the sums as they were:
bit for bit on two replicas, and on four for the payloads that are
gathered; the all-reduced ones on four within float rounding, as a ring
adds each element in an order that depends on where it lies in the fused
buffer."""

import json
import os
import subprocess
import sys
import warnings
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests import keras_models
from tests.graphs import ancestors
from tfgc import compressors
from tfgc.communicators import exchange
from tfgc.optimizers import step

# Every compressor that runs under the flat communicator in one process,
# with arguments that compress these small layers.
COMPRESSORS = {
    "identity": lambda: compressors.Identity(),
    "fp16": lambda: compressors.FP16(),
    "bf16": lambda: compressors.BF16(),
    "topk": lambda: compressors.TopK(0.1),
    "mstopk": lambda: compressors.MSTopK(0.1),
    "randomk": lambda: compressors.RandomK(0.1),
    "redsync": lambda: compressors.RedSync(0.1, cost_model=None),
    "signsgd": lambda: compressors.SignSGD(),
    "powersgd": lambda: compressors.PowerSGD(rank=2),
    "acpsgd": lambda: compressors.ACPSGD(rank=2, bucket_bytes=None),
    "sbc": lambda: compressors.SBC(0.1),
    "importance": lambda: compressors.ImportancePruning(0.1),
}


_BUCKETS = exchange.buckets
# How far the weights of two epochs may move apart when four replicas'
# all-reduces add in another order: about a tenth of the unit roundoff of
# the dtype the sum is taken in (float16: 2^-11, bfloat16: 2^-8).
ROUNDING = {"fp16": 5e-5, "bf16": 4e-4}
ROUNDING = {name: ROUNDING.get(name, 1e-7) for name in COMPRESSORS}


def _tensors(*sizes):
    return [tf.zeros([n]) for n in sizes]


def test_buckets_fill_from_the_last_tensor_backwards():
    topk = compressors.TopK(0.1)
    tensors = _tensors(100, 300, 50, 200)  # 400, 1200, 200, 800 bytes
    # 1,000 bytes: 800 + 200, then 1200 alone, then 400.
    assert exchange.buckets([topk] * 4, tensors, 1000) == [[3, 2], [1], [0]]
    assert exchange.buckets([topk] * 4, tensors, None) == [[0, 1, 2, 3]]
    assert exchange.buckets([topk] * 4, tensors, 10**9) == [[3, 2, 1, 0]]


def test_a_compressors_own_bucket_size_wins():
    acp = compressors.ACPSGD(rank=2, bucket_bytes=1000)
    # Columns: their P factors (rank 1) have their bytes.
    tensors = [tf.zeros([n, 1]) for n in (100, 300, 50, 200)]
    assert exchange.buckets([acp] * 4, tensors, None) == [[3, 2], [1], [0]]
    assert exchange.buckets([acp] * 4, tensors, 10**9) == [[3, 2], [1], [0]]


def test_bucket_bytes_is_checked_and_saved():
    sgd = keras.optimizers.SGD(0.1)
    opt = tfgc.CompressedOptimizer(sgd, "topk", bucket_bytes=4096)
    assert opt.get_config()["bucket_bytes"] == 4096
    again = tfgc.CompressedOptimizer.from_config(opt.get_config())
    assert again.bucket_bytes == 4096
    default = tfgc.CompressedOptimizer(keras.optimizers.SGD(0.1), "topk")
    assert default.bucket_bytes == 25 * 2**20
    for bad in (0, -1, 1.5, "4096", True):
        with pytest.raises(ValueError, match="`bucket_bytes` must be"):
            tfgc.CompressedOptimizer(
                keras.optimizers.SGD(0.1), "topk", bucket_bytes=bad
            )


def train(strategy, make_compressor, bucket_bytes, **options):
    """Two epochs of a small model; (weights, bucket counts per exchange).
    `options` go to the CompressedOptimizer."""
    counts = []

    def counted(*args):
        groups = _BUCKETS(*args)
        counts.append(len(groups))
        return groups

    with mock.patch.object(exchange, "buckets", counted):
        return _fit(strategy, make_compressor, bucket_bytes, options), counts


def linear(name: str) -> bool:
    """Whether the compressor's payloads are summed by an all-reduce."""
    return compressors.ALL_REDUCE in COMPRESSORS[name]().spec.collectives


def _fit(strategy, make_compressor, bucket_bytes, options):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 12)).astype("float32")
    y = rng.integers(0, 4, size=64)
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
            compressor=make_compressor(),
            min_compress_size=0,
            bucket_bytes=bucket_bytes,
            **options,
        )
        model.compile(
            opt,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights]


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_buckets_leave_every_compressors_sums_as_they_were(mirrored, name):
    """Four replicas: the same weights whether every gradient goes in one
    exchange or in buckets of 600 bytes (each layer's kernel and bias
    apart)."""
    one, one_counts = train(mirrored, COMPRESSORS[name], None)
    many, many_counts = train(mirrored, COMPRESSORS[name], 600)
    assert set(one_counts) == {1}
    assert max(many_counts) > 1
    for a, b in zip(one, many):
        if linear(name):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=ROUNDING[name])
        else:
            np.testing.assert_array_equal(a, b)


def test_acpsgds_own_p_and_q_buckets_leave_the_sums_as_they_were(mirrored):
    """ACP-SGD fused as its authors fuse (buckets of 100 bytes of the
    factors each step sends, P and Q steps apart): the weights of one
    exchange, within float rounding on four replicas."""
    one, one_counts = train(
        mirrored, lambda: compressors.ACPSGD(rank=2, bucket_bytes=None), None
    )
    many, many_counts = train(
        mirrored, lambda: compressors.ACPSGD(rank=2, bucket_bytes=100), None
    )
    assert set(one_counts) == {1}
    assert max(many_counts) > 1
    for a, b in zip(one, many):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_buckets_are_bit_identical_on_two_replicas():
    """The all-reduced compressors on two replicas (a process of its own
    with two logical CPUs): a + b has one rounding whatever the layout."""
    script = os.path.join(os.path.dirname(__file__), "two_replicas.py")
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    proc = subprocess.run(
        [sys.executable, script],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    differences = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(differences) == {n for n in COMPRESSORS if linear(n)}
    assert all(d == 0 for d in differences.values()), differences


def test_what_keeps_buckets_waiting_is_said_once(monkeypatch):
    monkeypatch.setattr(step, "_SAID", set())
    with pytest.warns(UserWarning, match="do not overlap the backward pass"):
        step.no_overlap("a reason", 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step.no_overlap("a reason", 1000)  # said already
        step.no_overlap("another reason", None)  # no buckets to overlap


def test_non_finite_agreement_travels_with_the_buckets(mirrored, monkeypatch):
    """The guard's verdicts ride with each bucket (nothing waits for every
    gradient, nothing said); with local rounds (SBC's delay) they are
    still agreed first, and that is said."""
    monkeypatch.setattr(step, "_SAID", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _, counts = train(mirrored, COMPRESSORS["topk"], 600, non_finite="skip")
    assert max(counts) > 1
    with pytest.warns(UserWarning, match="local rounds or gradient accum"):
        train(
            mirrored,
            lambda: compressors.SBC(0.25, delay=2),
            600,
            non_finite="skip",
        )


@pytest.mark.parametrize("non_finite", ["propagate", "skip"])
@pytest.mark.parametrize("bucket_bytes", [64 * 64 * 2, None])
def test_the_first_bucket_reads_only_the_last_layers_gradients(
    mirrored, bucket_bytes, non_finite
):
    """What lets the executor start the exchange during the backward pass,
    as dataflow (the timing on two workers is in
    tests/multiworker/test_overlap.py): in buckets, the first bucket's
    collectives (its verdicts' gather too, under the guard) read only the
    last layer's gradient ops; in one exchange, every one of them."""
    width = 64
    with mirrored.scope():
        model = keras_models.dense_stack(width, 4)
        optimizer = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.01),
            "identity",
            bucket_bytes=bucket_bytes,
            non_finite=non_finite,
        )
        optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = keras.losses.sparse_categorical_crossentropy(
                    y, model(x), from_logits=True
                )
                loss = tf.reduce_mean(loss)
            variables = model.trainable_variables
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))

        mirrored.run(replica_step, (x, y))

    graph = train_step.get_concrete_function(
        tf.TensorSpec([8, width]), tf.TensorSpec([8], tf.int32)
    ).graph
    ops = graph.get_operations()
    first = [
        op
        for op in ops
        if op.type.startswith("Collective") and "tfgc_bucket_0/" in op.name
    ]
    expected = 2 if non_finite == "skip" else 1
    assert len(first) == expected * mirrored.num_replicas_in_sync
    for collective in first:
        # This replica's matmuls of the backward pass: each layer's kernel
        # gradient and, but for the first layer, its input's.
        matmuls = {
            op
            for op in ops
            if "gradient_tape/" in op.name
            and op.type == "MatMul"
            and op.device == collective.device
        }
        assert len(matmuls) == 9
        read = matmuls & ancestors(collective)
        if bucket_bytes is None:
            assert read == matmuls, collective.name
        else:
            # The last layer's kernel gradient and the gradient into it.
            assert len(read) == 2, (collective.name, sorted(read))
