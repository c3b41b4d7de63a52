"""TopK at density 0.01 with error feedback trains as well as dense."""

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

import tfgc

pytestmark = pytest.mark.slow

EPOCHS, BATCH = 20, 32


def _final_training_loss(compressor=None, error_feedback=True):
    digits = load_digits()  # real data shipped inside scikit-learn
    x = (digits.data / 16.0).astype("float32")
    y = digits.target
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    steps = EPOCHS * int(np.ceil(len(x) / BATCH))
    optimizer = keras.optimizers.SGD(
        keras.optimizers.schedules.CosineDecay(0.05, steps), momentum=0.9
    )
    if compressor is not None:
        optimizer = tfgc.CompressedOptimizer(
            optimizer,
            compressor=compressor,
            error_feedback=error_feedback,
            min_compress_size=0,
        )
    model.compile(
        optimizer,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    return model.evaluate(x, y, verbose=0)


def test_topk_one_percent_with_error_feedback_within_5_percent_of_dense():
    dense = _final_training_loss()
    topk = _final_training_loss(tfgc.compressors.TopK(density=0.01))
    assert dense < 0.1  # the task is learned
    assert topk <= 1.05 * dense, (topk, dense)
    # The same selection without error feedback falls short: the bar above
    # is one that compression can fail.
    no_feedback = _final_training_loss(
        tfgc.compressors.TopK(density=0.01), error_feedback=False
    )
    assert no_feedback > 1.05 * dense, (no_feedback, dense)
