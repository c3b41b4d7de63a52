"""Saving and loading every replica's compressor state (Keras saving:
`save_weights`, `.keras`, `BackupAndRestore`), in one process with several
local replicas. The multi-worker runs, with a real interruption, are in
tests/multiworker/test_checkpoint.py."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests.keras_models import data, fit_small_model, small_model
from tfgc import compressors

# The wrapper's variables that are not compressor state.
_NOT_STATE = r"iteration|learning_rate|bytes|steps|momentum$"


def _optimizer(compressor=None):
    return lambda: tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9),
        compressor or compressors.TopK(density=0.25),
        min_compress_size=0,
    )


def _per_replica(optimizer):
    """{variable name: [replica values]} of the wrapper's own variables.

    The names drop the model's and optimizer's numbers, which differ
    between models built in one session.
    """
    out = {}
    for i, v in enumerate(optimizer._variables):
        values = getattr(v.value, "values", (v.value,))
        name = re.sub(r"_\d+", "", v.path.split("/")[-1])
        name = name.removeprefix("sequential_")
        out[f"{i}:{name}"] = [np.asarray(c.numpy()) for c in values]
    return out


def _fresh(strategy, make_optimizer):
    """An unfitted model of the same configuration, optimizer built."""
    model = small_model(strategy, make_optimizer)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize(
    "name, compressor",
    [
        ("topk", compressors.TopK(density=0.25)),
        ("powersgd", compressors.PowerSGD(rank=1)),
        ("redsync", compressors.RedSync(0.25, momentum=0.0, cost_model=None)),
    ],
)
def test_every_replica_gets_its_own_state_back(
    mirrored, tmp_path, name, compressor
):
    make = _optimizer(compressor)
    trained = fit_small_model(mirrored, make, *data(), batch_size=16)
    saved = _per_replica(trained.optimizer)
    states = [k for k in saved if not re.search(_NOT_STATE, k)]
    assert states, sorted(saved)
    # The replicas really differ, or this test could not fail.
    assert any(not np.array_equal(saved[k][0], saved[k][-1]) for k in states)
    path = str(tmp_path / f"{name}.weights.h5")
    trained.save_weights(path)

    restored = _fresh(mirrored, make)
    restored.load_weights(path)
    got = _per_replica(restored.optimizer)
    assert got.keys() == saved.keys()
    for key in saved:
        for a, b in zip(got[key], saved[key]):
            np.testing.assert_array_equal(a, b, err_msg=key)
    for a, b in zip(restored.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(restored.optimizer.iterations.numpy()) == int(
        trained.optimizer.iterations.numpy()
    )


def test_training_on_after_loading_equals_training_through(mirrored, tmp_path):
    x, y = data(rows=128)
    through = fit_small_model(mirrored, _optimizer(), x, y, batch_size=16)
    half = fit_small_model(
        mirrored, _optimizer(), x[:64], y[:64], batch_size=16
    )
    path = str(tmp_path / "half.weights.h5")
    half.save_weights(path)
    resumed = _fresh(mirrored, _optimizer())
    resumed.load_weights(path)
    resumed.fit(x[64:], y[64:], batch_size=16, shuffle=False, verbose=0)
    for a, b in zip(resumed.get_weights(), through.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_another_number_of_replicas_resets_the_state_with_a_warning(
    mirrored, tmp_path
):
    trained = fit_small_model(mirrored, _optimizer(), *data(), batch_size=16)
    path = str(tmp_path / "four.weights.h5")
    trained.save_weights(path)
    one = _fresh(tf.distribute.get_strategy(), _optimizer())
    with pytest.warns(UserWarning, match=r"saved with 4 replicas.*with 1"):
        one.load_weights(path)
    for a, b in zip(one.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    for key, (value,) in _per_replica(one.optimizer).items():
        if "residual" in key or "bytes" in key:
            assert not value.any(), key
    assert int(one.optimizer.iterations.numpy()) == int(
        trained.optimizer.iterations.numpy()
    )


def test_a_keras_file_holds_every_replica(mirrored, tmp_path):
    trained = fit_small_model(mirrored, _optimizer(), *data(), batch_size=16)
    path = str(tmp_path / "model.keras")
    trained.save(path)
    with mirrored.scope():
        loaded = keras.models.load_model(path)
    saved, got = _per_replica(trained.optimizer), _per_replica(loaded.optimizer)
    for key in saved:
        for a, b in zip(got[key], saved[key]):
            np.testing.assert_array_equal(a, b, err_msg=key)


@pytest.mark.parametrize("restore_before_build", [False, True])
def test_tf_train_checkpoint_gives_every_replica_its_state(
    mirrored, tmp_path, restore_before_build
):
    """Restored into a built optimizer, or before its build (deferred
    restoration, as when a run resumes before its first step)."""
    trained = fit_small_model(mirrored, _optimizer(), *data(), batch_size=16)
    saved = _per_replica(trained.optimizer)
    path = tf.train.Checkpoint(model=trained, optimizer=trained.optimizer).save(
        str(tmp_path / "ckpt")
    )
    if restore_before_build:
        restored = small_model(mirrored, _optimizer())
        tf.train.Checkpoint(
            model=restored, optimizer=restored.optimizer
        ).restore(path)
        with mirrored.scope():
            restored.optimizer.build(restored.trainable_variables)
    else:
        restored = _fresh(mirrored, _optimizer())
        tf.train.Checkpoint(
            model=restored, optimizer=restored.optimizer
        ).restore(path)
    got = _per_replica(restored.optimizer)
    for key in saved:
        for a, b in zip(got[key], saved[key]):
            np.testing.assert_array_equal(a, b, err_msg=key)
    for a, b in zip(restored.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
