"""The pure-TF reference ops on several replicas of one process.

Their run-time checks are stateful ops. `tf.function` puts every stateful op
that takes no resource into one chain, in the order the replicas were
traced, so a check after replica 0's all-gather came before a check ahead of
replica 1's all-gather: the step deadlocked at 0 % CPU (the compiled ops
check inside their kernels and never did).
"""

import os
import subprocess
import sys
import textwrap

import keras
import pytest
import tensorflow as tf
from tensorflow.python.framework import auto_control_deps

import tfgc
from tests import backends
from tests.graphs import ancestors
from tfgc import compressors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

#: Compressors whose reference ops check what they send or receive.
CHECKED = ("topk", "mstopk", "redsync")


@pytest.mark.parametrize("name", CHECKED)
def test_no_chained_stateful_op_waits_for_a_collective(
    mirrored, monkeypatch, name
):
    """The condition of the deadlock, read from the traced step: a stateful
    op in the chain of `tf.function`'s automatic control dependencies (no
    resource input) that runs after one replica's collective."""
    backends.use("reference", monkeypatch)
    with mirrored.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((12,)), keras.layers.Dense(8), keras.layers.Dense(4)]
        )
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1),
            compressors.get(name),
            min_compress_size=0,
        )
        opt.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            variables = model.trainable_variables
            opt.apply(tape.gradient(loss, variables), variables)

        mirrored.run(replica, (x, y))

    graph = step.get_concrete_function(
        tf.TensorSpec([8, 12]), tf.TensorSpec([8, 4])
    ).graph
    operations = graph.get_operations()
    assert any(op.type.startswith("Collective") for op in operations)
    chained = [
        op
        for op in operations
        if auto_control_deps.op_is_stateful(op)
        and not any(t.dtype == tf.resource for t in op.inputs)
    ]
    after_collectives = [
        op.name
        for op in chained
        if any(up.type.startswith("Collective") for up in ancestors(op))
    ]
    assert not after_collectives


_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import keras

    import tfgc
    from tfgc import compressors
    from tfgc.ops import _library

    assert not _library.using_custom_ops()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((12,)), keras.layers.Dense(8), keras.layers.Dense(4)]
        )
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1), compressors.TopK(0.1),
            min_compress_size=0,
        )
        model.compile(opt, "mse")
    x = np.random.default_rng(0).normal(size=(16, 12)).astype("float32")
    model.fit(x, np.zeros((16, 4)), batch_size=8, epochs=1, verbose=0)
    print("trained")
    """
)


def test_top_k_trains_on_two_replicas_without_the_compiled_ops():
    """Two steps of `model.fit` on two replicas of one process, in a
    process of its own so that a deadlock fails the test instead of hanging
    the run."""
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        TF_CPP_MIN_LOG_LEVEL="2",
        **{backends._library.DISABLE_ENV: "1"},
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("two replicas on the reference ops hung (300 s)")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
