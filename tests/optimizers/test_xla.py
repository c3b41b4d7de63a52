"""Training under XLA (`model.compile(jit_compile=True)`).

While a step is traced for XLA, `tfgc.ops` runs its pure-TF references
(the compiled ops have no XLA kernels); what XLA cannot compile at all is
refused while tracing, with the fix in the message.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc import compressors, ops
from tfgc.communicators import collectives

# Compressors that compile: each trains to the weights it reaches without
# XLA. RedSync's default cost model sends everything dense on one device.
COMPILED = {
    "identity": {},
    "fp16": {},
    "bf16": {},
    "topk": {"density": 0.25},
    "randomk": {"density": 0.25},
    "signsgd": {},
    "signsgd_unscaled": {"scaled": False},
    "powersgd": {"rank": 2, "warmup_steps": 1},
    "mstopk": {"density": 0.25, "rounds": 4},
    "redsync": {"density": 0.25},
    "redsync_trimmed": {
        "density": 0.25,
        "selection": "trimmed",
        "rounds": 4,
        "cost_model": None,
    },
    "importance": {"density": 0.25},
    "acpsgd": {"rank": 2},
}
# Compressors whose payload size depends on the data: refused, by name.
REFUSED = {
    "sbc": ({"density": 0.25}, "SBC sends Golomb-Rice coded positions"),
    "redsync_threshold": (
        {"density": 0.25, "cost_model": None},
        r"RedSync\(selection='threshold'\)",
    ),
}
FIX = r"model.compile\(..., jit_compile=False\)"


def _compressor(name, kwargs):
    return compressors.get(name.split("_")[0], **kwargs)


def _train(compressor, jit_compile, steps=2):
    """Weights after `steps` steps of `model.fit`, and the initial ones."""
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    initial = [w.numpy() for w in model.weights]
    optimizer = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1), compressor=compressor, min_compress_size=0
    )
    model.compile(optimizer, "mse", jit_compile=jit_compile)
    assert model.jit_compile is jit_compile
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * steps, 6)).astype("float32")
    y = rng.normal(size=(8 * steps, 3)).astype("float32")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights], initial


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compressor_trains_under_xla_as_without(name):
    compressor = _compressor(name, COMPILED[name])
    with_xla, initial = _train(compressor, jit_compile=True)
    without, _ = _train(compressor, jit_compile=False)
    for a, b in zip(with_xla, without):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(a, s) for a, s in zip(with_xla, initial))


def test_topk_with_compiled_ops_trains_under_xla():
    """The compiled ops are loaded, and skipped only inside the XLA step."""
    if not ops.using_custom_ops():
        pytest.skip("the compiled ops are not loaded")
    with_xla, _ = _train(compressors.TopK(0.25), jit_compile=True)
    without, _ = _train(compressors.TopK(0.25), jit_compile=False)
    for a, b in zip(with_xla, without):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert ops.using_custom_ops()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_data_dependent_payload_refused_when_traced(name):
    kwargs, who = REFUSED[name]
    with pytest.raises(ValueError, match=f"XLA cannot compile.*{who}.*{FIX}"):
        _train(_compressor(name, kwargs), jit_compile=True, steps=1)


def test_collectives_refused_under_xla_with_several_replicas(mirrored):
    """TensorFlow compiles none of them on CPUs (nor the gathers anywhere);
    refused while tracing instead of failing in the runtime."""
    before = dict(collectives._next_instance_key)
    for name, op in (
        ("identity", "CollectiveReduceV2"),
        ("topk", "CollectiveGatherV2"),
    ):
        with mirrored.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            optimizer = tfgc.CompressedOptimizer(
                keras.optimizers.SGD(0.1), compressor=name, min_compress_size=0
            )
            model.compile(optimizer, "mse", jit_compile=True)
        x = np.ones((8, 4), "float32")
        y = np.ones((8, 2), "float32")
        with pytest.raises(ValueError, match=f"{op}.*on CPU.*{FIX}"):
            model.fit(x, y, batch_size=8, verbose=0)
    # A refused collective reserved no instance key on the replica that
    # refused it: each group's keys stay in step on every device, or the
    # next exchange would wait forever for mismatched collectives.
    # (The groups of this test's optimizers hold every device.)
    after = collectives._next_instance_key
    devices = mirrored.extended.worker_devices
    for group in {g for (d, g), k in after.items() if before.get((d, g)) != k}:
        next_keys = [after.get((device, group)) for device in devices]
        assert len(set(next_keys)) == 1, dict(zip(devices, next_keys))


def test_a_measured_auto_plan_is_refused_under_xla(mirrored):
    """Its clock stamps each bucket with tf.timestamp, which XLA cannot
    compile: refused while tracing, before any collective."""
    with mirrored.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        optimizer = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1),
            compressors.Auto(
                candidates=["identity", "fp16"], trial_steps=None, verbose=False
            ),
        )
        model.compile(optimizer, "mse", jit_compile=True)
    x = np.ones((8, 4), "float32")
    y = np.ones((8, 2), "float32")
    with pytest.raises(ValueError, match=f"tf.timestamp.*{FIX}"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_compiling_with_xla_inside_branches_loops_and_replicas(mirrored):
    seen = {}

    def probe(tag):
        seen[tag] = ops.compiling_with_xla()

    def step(x):
        probe("body")
        y = tf.cond(x[0] > 0, lambda: probe("cond") or x, lambda: x)
        y = tf.switch_case(
            tf.constant(1), [lambda: y, lambda: probe("switch") or y]
        )
        tf.while_loop(lambda i: i < 2, lambda i: probe("loop") or i + 1, [0])
        return y

    spec = tf.TensorSpec([2])
    tf.function(step).get_concrete_function(spec)
    assert seen == dict.fromkeys(("body", "cond", "switch", "loop"), False)
    tf.function(step, jit_compile=True).get_concrete_function(spec)
    assert seen == dict.fromkeys(("body", "cond", "switch", "loop"), True)
    seen.clear()
    tf.function(
        lambda x: mirrored.run(step, args=(x,)), jit_compile=True
    ).get_concrete_function(spec)
    assert seen == dict.fromkeys(("body", "cond", "switch", "loop"), True)
    assert not ops.compiling_with_xla()


@pytest.mark.parametrize("mode", ["mstopk", "trimmed"])
def test_top_k_sample_under_xla_equals_eager(mode):
    x = tf.constant(np.random.default_rng(1).normal(size=(40, 5)), tf.float32)
    residual = tf.fill(x.shape, 0.01)
    args = dict(k=17, mode=mode, rounds=4, seed=tf.constant(5, tf.int64))
    want = ops.top_k_sample(x, residual=residual, **args)
    got = tf.function(
        lambda x, r: ops.top_k_sample(x, residual=r, **args), jit_compile=True
    )(x, residual)
    assert got[1].shape == [17]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_scatter_add_sum_under_xla_equals_eager():
    values = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float16)
    indices = tf.constant([3, 0, 3, 5])
    want = ops.scatter_add_sum(values, indices, 6)
    got = tf.function(
        lambda v, i: ops.scatter_add_sum(v, i, 6), jit_compile=True
    )(values, indices)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda x: ops.golomb_encode(tf.constant([1, 4]), 9), "golomb_encode"),
        (
            lambda x: ops.top_k_sample(x, 3, mode="threshold"),
            r"top_k_sample\(mode='threshold'\)",
        ),
    ],
)
def test_data_dependent_ops_refused_under_xla(call, what):
    x = tf.range(10.0)
    call(x)  # runs outside XLA
    with pytest.raises(ValueError, match=f"{what}.*{FIX}"):
        tf.function(call, jit_compile=True).get_concrete_function(x)
