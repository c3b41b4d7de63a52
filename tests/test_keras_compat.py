"""The version fence around tfgc's use of Keras internals."""

import keras
import pytest
import tensorflow as tf

from tfgc import _keras_compat


def test_tested_versions_pass():
    _keras_compat.check_versions()


def test_untested_keras_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(keras, "version", lambda: "3.99.0")
    monkeypatch.delenv("TFGC_ALLOW_UNTESTED_KERAS", raising=False)
    with pytest.raises(RuntimeError, match=r"keras 3\.99\.0.*TFGC_ALLOW"):
        _keras_compat.check_versions()
    monkeypatch.setenv("TFGC_ALLOW_UNTESTED_KERAS", "1")
    with pytest.warns(UserWarning, match="keras 3.99.0"):
        _keras_compat.check_versions()


def test_untested_tensorflow_is_refused(monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.30.0")
    with pytest.raises(RuntimeError, match=r"tensorflow 2\.30\.0"):
        _keras_compat.check_versions()


def test_inner_optimizer_skips_its_sum_only_when_told():
    opt = keras.optimizers.SGD()
    calls = []
    opt._all_reduce_sum_gradients = lambda pairs: calls.append(pairs) or pairs
    _keras_compat.sum_gradients_unless_summed(opt)
    _keras_compat.sum_gradients_unless_summed(opt)  # idempotent
    pairs = [(tf.ones(2), "v")]
    with _keras_compat.gradients_already_summed():
        assert opt._all_reduce_sum_gradients(pairs) == pairs
    assert calls == []
    # On its own, the optimizer sums as Keras does.
    opt._all_reduce_sum_gradients(pairs)
    assert calls == [pairs]


def test_fit_patch_is_installed_once():
    from keras.src.backend.tensorflow import trainer

    assert _keras_compat.patch_multi_worker_fit()
    patched = trainer.reduce_per_replica
    assert _keras_compat.patch_multi_worker_fit()
    assert trainer.reduce_per_replica is patched
    assert patched.__wrapped__.__module__ == trainer.__name__
