"""`CompressedOptimizer` in the standard Keras configurations: loss scaling
and mixed float16, float8, gradient accumulation, raw variables, and the
user's optimizer object after wrapping. Each test compares with what plain
Keras does (or would do, where Keras itself fails under a strategy).

The multi-worker mixed float16 runs are in
tests/multiworker/test_keras_configurations.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests.keras_models import (
    FEATURES,
    GLOBAL_BATCH,
    data,
    fit,
)
from tfgc import compressors


def _assert_same_weights(got, expected, **tolerance):
    for a, b in zip(got.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(a, b, **tolerance)


# --- loss scaling ------------------------------------------------------------


def test_loss_scale_factor_of_the_inner_optimizer_is_applied_once():
    w = keras.Variable([1.0])
    optimizer = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1, loss_scale_factor=128.0)
    )
    with tf.GradientTape() as tape:
        loss = optimizer.scale_loss(2.0 * w[0])
    optimizer.apply(tape.gradient(loss, [w]), [w])
    # d(2w)/dw = 2, times the learning rate: the scale cancels out.
    np.testing.assert_allclose(w.numpy(), [0.8], rtol=1e-6)


def test_loss_scale_factor_in_fit_matches_plain_keras(mirrored):
    x, y = data()

    def inner():
        return keras.optimizers.SGD(0.05, loss_scale_factor=64.0)

    plain = fit(mirrored, inner, x, y)
    wrapped = fit(mirrored, lambda: tfgc.CompressedOptimizer(inner()), x, y)
    _assert_same_weights(wrapped, plain, rtol=1e-5, atol=1e-6)


def test_loss_scale_optimizer_inside_is_refused_with_the_fix():
    inner = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match=r"LossScaleOptimizer\(tfgc\."):
        tfgc.CompressedOptimizer(inner)


def test_mixed_float16_wraps_and_matches_plain_keras(mirrored):
    x, y = data()

    def inner():
        return keras.optimizers.SGD(0.05)

    plain = fit(mirrored, inner, x, y, policy="mixed_float16")
    wrapped = fit(
        mirrored,
        lambda: tfgc.CompressedOptimizer(inner()),
        x,
        y,
        policy="mixed_float16",
    )
    assert isinstance(wrapped.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(
        wrapped.optimizer.inner_optimizer, tfgc.CompressedOptimizer
    )
    assert int(wrapped.optimizer.iterations.numpy()) == int(
        plain.optimizer.iterations.numpy()
    )
    _assert_same_weights(wrapped, plain, rtol=1e-3, atol=1e-4)


def test_mixed_float16_skips_a_step_with_inf_on_one_replica_everywhere(
    mirrored,
):
    """An Inf in one replica's share of the batch skips the step on all.

    Keras decides from the first replica's own gradients; here only the
    last replica overflows, so Keras alone would apply the Inf.
    """
    x, y = data()
    per_replica = GLOBAL_BATCH // mirrored.num_replicas_in_sync
    # Second batch, last replica's share: float16 overflows there.
    x[2 * GLOBAL_BATCH - per_replica] = 1e5

    def wrapped():
        return tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05),
            compressors.TopK(density=0.25),
            min_compress_size=0,
        )

    clean = fit(mirrored, wrapped, *data(), policy="mixed_float16")
    model = fit(mirrored, wrapped, x, y, policy="mixed_float16")
    for w in model.get_weights():
        assert np.all(np.isfinite(w))
    # One step more skipped than without the Inf, and the scale halved
    # once more.
    skipped = int(clean.optimizer.iterations.numpy()) - int(
        model.optimizer.iterations.numpy()
    )
    assert skipped == 1
    np.testing.assert_allclose(
        model.optimizer.dynamic_scale.numpy(),
        clean.optimizer.dynamic_scale.numpy() / 2,
    )
    # Replicas agree: every per-replica copy of each weight is the same.
    for w in model.weights:
        copies = [c.numpy() for c in w.value.values]
        for c in copies[1:]:
            np.testing.assert_array_equal(c, copies[0])


def test_mixed_float16_with_an_embedding_gradient():
    """Embedding gradients arrive as IndexedSlices, whose dense shape is
    unknown inside LossScaleOptimizer's branch."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((5,), dtype="int32"),
                keras.layers.Embedding(100, 8),
                keras.layers.Flatten(),
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
        model.compile(
            # The 800-element embedding goes dense (min_compress_size).
            tfgc.CompressedOptimizer(keras.optimizers.SGD(0.1), "topk"),
            "mse",
        )
        before = model.get_weights()[0].copy()
        x = np.random.default_rng(0).integers(0, 100, size=(4, 5))
        model.fit(x, np.ones((4, 1), "float32"), epochs=1, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    after = model.get_weights()[0]
    assert np.all(np.isfinite(after)) and np.any(after != before)


# --- float8 ---------------------------------------------------------------


def _float8_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(64, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    model.quantize("float8")
    return model


def _overwritten(model):
    return [v for v in model.weights if v.overwrite_with_gradient]


def test_float8_scales_are_passed_untouched(mirrored):
    x, y = data()

    def fit_float8(make_optimizer):
        with mirrored.scope():
            model = _float8_model()
            model.compile(make_optimizer(), "mse")
        model.fit(
            x[:GLOBAL_BATCH],
            y[:GLOBAL_BATCH],
            batch_size=GLOBAL_BATCH,
            epochs=1,
            verbose=0,
        )
        return model

    plain = fit_float8(lambda: keras.optimizers.SGD(0.05))
    # TopK on everything would zero most of a scale history if it were
    # compressed like a gradient, and the sum over replicas would scale it.
    wrapped = fit_float8(
        lambda: tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05),
            compressors.TopK(density=0.1),
            min_compress_size=0,
        )
    )
    overwritten = _overwritten(wrapped)
    assert overwritten
    for got, expected in zip(overwritten, _overwritten(plain)):
        np.testing.assert_allclose(
            got.numpy(), expected.numpy(), rtol=1e-6, err_msg=got.path
        )
    stats = wrapped.optimizer.compression_stats()
    trainable = sum(
        int(np.prod(v.shape)) * 4
        for v in wrapped.trainable_weights
        if not v.overwrite_with_gradient
    )
    assert stats["dense_bytes"] == trainable


# --- gradient accumulation ----------------------------------------------------


def _sgd(accumulate=None):
    return keras.optimizers.SGD(
        0.05, momentum=0.9, gradient_accumulation_steps=accumulate
    )


def test_accumulation_equals_one_step_on_the_whole_batch(mirrored):
    """2 micro-batches of 16 on 4 replicas == plain SGD on batches of 32.

    (Keras's own accumulation fails under MirroredStrategy on CPU: its
    update is a merge_call inside tf.cond.)
    """
    x, y = data()
    plain = fit(
        tf.distribute.get_strategy(), _sgd, x, y, batch=2 * GLOBAL_BATCH
    )
    wrapped = fit(
        mirrored,
        lambda: tfgc.CompressedOptimizer(_sgd(2), min_compress_size=0),
        x,
        y,
    )
    _assert_same_weights(wrapped, plain, rtol=1e-5, atol=1e-6)
    optimizer = wrapped.optimizer
    assert int(optimizer.iterations.numpy()) == len(x) // (2 * GLOBAL_BATCH)
    assert int(optimizer.inner_optimizer._iterations.numpy()) == (
        len(x) // GLOBAL_BATCH
    )


def test_accumulation_exchanges_once_per_update(mirrored):
    x, y = data()

    def stats(accumulate):
        model = fit(
            mirrored,
            lambda: tfgc.CompressedOptimizer(
                _sgd(accumulate),
                compressors.TopK(density=0.25),
                min_compress_size=0,
            ),
            x,
            y,
        )
        return model.optimizer.compression_stats()

    every_step, accumulated = stats(None), stats(4)
    assert every_step["run_steps"] == accumulated["run_steps"] == 4
    assert accumulated["run_mean_bytes"] == pytest.approx(
        every_step["run_mean_bytes"] / 4
    )


def test_accumulation_with_error_feedback_keeps_what_was_not_sent():
    """Single device: the accumulated sum goes through TopK once, and what
    TopK left out waits in the residual."""
    w = keras.Variable(np.zeros(8, "float32"))
    optimizer = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(1.0, gradient_accumulation_steps=2),
        compressors.TopK(density=0.25),
        min_compress_size=0,
    )
    g1 = np.array([4, 0, 0, 1, 0, 0, 0, 0], "float32")
    g2 = np.array([0, 3, 0, 1, 0, 0, 0, 0], "float32")
    optimizer.apply([tf.constant(g1)], [w])
    np.testing.assert_array_equal(w.numpy(), np.zeros(8))
    optimizer.apply([tf.constant(g2)], [w])
    # Mean (g1 + g2) / 2 = [2, 1.5, 0, 1, ...]; top 2 of the sum sent.
    np.testing.assert_allclose(w.numpy(), [-2, -1.5, 0, 0, 0, 0, 0, 0])
    optimizer.apply([tf.zeros(8)], [w])
    optimizer.apply([tf.zeros(8)], [w])
    # The residual (the 2 left of index 3, as a sum) goes next: mean 1.
    np.testing.assert_allclose(w.numpy(), [-2, -1.5, 0, -1, 0, 0, 0, 0])


def test_accumulation_with_sbc_is_refused():
    with pytest.raises(ValueError, match="raise the compressor's `delay`"):
        tfgc.CompressedOptimizer(_sgd(2), compressors.SBC())


# --- raw variables, the user's optimizer, the step counter -------------------


def test_raw_tf_variables_work_with_a_compressor_that_reads_them():
    v = tf.Variable(tf.ones([32, 32]))
    optimizer = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1),
        compressors.ImportancePruning(),
        min_compress_size=0,
    )
    optimizer.apply([tf.ones([32, 32])], [v])
    assert np.all(v.numpy() <= 1.0)
    assert np.any(v.numpy() < 1.0)


def test_raw_tf_variable_named_in_a_shape_error():
    v = tf.Variable(tf.ones([4]), name="raw_weight")
    optimizer = tfgc.CompressedOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build([v])
    with pytest.raises(ValueError, match="raw_weight"):
        optimizer.apply([tf.ones([5])], [v])


def test_wrapped_optimizer_still_sums_when_used_on_its_own(mirrored):
    x, y = data()
    reference = fit(mirrored, lambda: keras.optimizers.SGD(0.05), x, y)

    def used_alone_after_wrapping():
        sgd = keras.optimizers.SGD(0.05)
        tfgc.CompressedOptimizer(sgd)
        return sgd

    reused = fit(mirrored, used_alone_after_wrapping, x, y)
    _assert_same_weights(reused, reference, rtol=1e-6)


def test_apply_gradients_returns_the_step_counter():
    w = keras.Variable([1.0])
    optimizer = tfgc.CompressedOptimizer(keras.optimizers.SGD(0.1))
    counter = optimizer.apply_gradients([(tf.constant([1.0]), w)])
    assert int(counter.numpy()) == 1
    counter = optimizer.apply_gradients([(tf.constant([1.0]), w)])
    assert int(counter.numpy()) == 2
