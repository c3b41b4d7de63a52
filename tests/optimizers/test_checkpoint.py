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


def _optimizer(compressor=None, momentum=0.9):
    return lambda: tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.05, momentum=momentum),
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


def _sum(rows):
    """The sum of the replicas' values, in float64."""
    return np.sum([np.asarray(r, np.float64) for r in rows], axis=0)


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


@pytest.mark.parametrize(
    "compressor, momentum",
    [
        (compressors.TopK(density=0.25), 0.9),
        # Momentum correction: the compressor's, the inner SGD's none.
        (compressors.RedSync(0.25, momentum=0.9, cost_model=None), 0.0),
    ],
    ids=["topk", "redsync"],
)
def test_another_number_of_replicas_keeps_what_was_not_sent(
    mirrored, tmp_path, compressor, momentum
):
    """Four replicas saved, one and then four loaded: every residual (and
    RedSync's momenta) summed over the replicas is what it was; each new
    replica holds an even share. The multi-worker version is
    tests/multiworker/test_regroup.py."""
    make = _optimizer(compressor, momentum)
    trained = fit_small_model(mirrored, make, *data(), batch_size=16)
    saved = _per_replica(trained.optimizer)
    sums = [k for k in saved if re.search(r"residual|momentum|accumulation", k)]
    assert sums, sorted(saved)
    assert any(not np.array_equal(saved[k][0], saved[k][-1]) for k in sums)
    path = str(tmp_path / "four.weights.h5")
    trained.save_weights(path)
    one = _fresh(tf.distribute.get_strategy(), make)
    with pytest.warns(UserWarning, match=r"saved with 4 replicas.*with 1"):
        one.load_weights(path)
    for a, b in zip(one.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    got = _per_replica(one.optimizer)
    for key in sums:
        np.testing.assert_allclose(
            got[key][0], _sum(saved[key]), rtol=1e-6, atol=1e-7, err_msg=key
        )
    assert int(one.optimizer.iterations.numpy()) == int(
        trained.optimizer.iterations.numpy()
    )
    # And back to four: each gets a quarter of the one replica's.
    path = str(tmp_path / "one.weights.h5")
    one.save_weights(path)
    four = _fresh(mirrored, make)
    with pytest.warns(UserWarning, match=r"saved with 1 replicas.*with 4"):
        four.load_weights(path)
    again = _per_replica(four.optimizer)
    for key in sums:
        for share in again[key]:
            np.testing.assert_allclose(
                share * 4, got[key][0], rtol=1e-6, atol=1e-7, err_msg=key
            )


def test_another_number_of_replicas_restarts_low_rank_factors(
    mirrored, tmp_path
):
    """PowerSGD's factor restarts from its initial value on every
    replica, its residual keeps its sum."""
    make = _optimizer(compressors.PowerSGD(rank=1))
    trained = fit_small_model(mirrored, make, *data(), batch_size=16)
    path = str(tmp_path / "four.weights.h5")
    trained.save_weights(path)
    initial = _per_replica(_fresh(tf.distribute.get_strategy(), make).optimizer)
    one = _fresh(tf.distribute.get_strategy(), make)
    with pytest.warns(UserWarning, match="low-rank factors"):
        one.load_weights(path)
    got, saved = _per_replica(one.optimizer), _per_replica(trained.optimizer)
    factors = [k for k in got if k.endswith("_q")]
    assert factors, sorted(got)
    for key in factors:
        np.testing.assert_array_equal(got[key][0], initial[key][0])
        assert not np.array_equal(got[key][0], saved[key][0]), key
    for key in [k for k in got if "residual" in k]:
        np.testing.assert_allclose(
            got[key][0], _sum(saved[key]), rtol=1e-6, atol=1e-7, err_msg=key
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


def test_a_file_of_other_variables_is_refused_with_the_counts(
    mirrored, tmp_path
):
    """Saved without error feedback (no residuals), loaded with it: the
    counts differ and the message names both."""
    trained = fit_small_model(
        mirrored,
        lambda: tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05),
            compressors.TopK(density=0.25),
            error_feedback=False,
            min_compress_size=0,
        ),
        *data(),
        batch_size=16,
    )
    path = str(tmp_path / "model.weights.h5")
    trained.save_weights(path)
    restored = _fresh(mirrored, _optimizer(momentum=0.0))
    with pytest.raises(ValueError, match=r"has \d+ variables and this one \d+"):
        restored.load_weights(path)
