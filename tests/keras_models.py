"""The small Keras model and data that the optimizer tests and the
multi-worker worker scripts share."""

import keras
import numpy as np
import tensorflow as tf

FEATURES, GLOBAL_BATCH = 8, 16


def data(rows=64, seed=0):
    """(x, y) of a random linear regression with FEATURES inputs."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1))).astype("float32")
    return x, y


def small_model(strategy, make_optimizer):
    """The small regression model, seeded and compiled in `strategy`."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(16, activation="tanh"),
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
        model.compile(make_optimizer(), "mse", jit_compile=False)
    return model


def fit_small_model(strategy, make_optimizer, x, y=None, policy=None, **fit):
    """Trains a small regression model (one epoch unless `epochs=` is
    given, in order); returns it.

    `x`, `y` and `fit` go to `model.fit` (`x` may be a dataset).
    """
    previous = keras.mixed_precision.global_policy()
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    try:
        model = small_model(strategy, make_optimizer)
        model.fit(x, y, verbose=0, shuffle=False, **{"epochs": 1, **fit})
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return model


def worker_batches(
    num_workers, local_batch, steps, value=None, at_step=0, drop_step=False
):
    """A dataset of `steps` global batches for MultiWorkerMirroredStrategy
    (DATA sharding, worker i reads rows [i * local_batch, (i + 1) *
    local_batch) of each), and its number of batches.

    With `value`, the last worker's first row of batch `at_step` is set to
    it; `drop_step` leaves that batch out.
    """
    rng = np.random.default_rng(0)
    global_batch = local_batch * num_workers
    x = rng.normal(size=(global_batch * steps, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1))).astype("float32")
    rows = slice(at_step * global_batch, (at_step + 1) * global_batch)
    if value is not None:
        x[rows.start + (num_workers - 1) * local_batch] = value
    if drop_step:
        keep = np.ones(len(x), bool)
        keep[rows] = False
        x, y = x[keep], y[keep]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    return ds.with_options(options), len(x) // global_batch


def fit(strategy, make_optimizer, x, y, batch=GLOBAL_BATCH, policy=None):
    """`fit_small_model` on (x, y) in batches of `batch`."""
    return fit_small_model(
        strategy, make_optimizer, x, y, policy=policy, batch_size=batch
    )


def dense_stack(width: int, layers: int, classes: int = 10):
    """`layers` hidden Dense layers of `width` (ReLU) and a `classes`-way
    output, each kernel a tensor of its own for the bucket tests."""
    return keras.Sequential(
        [keras.Input((width,))]
        + [keras.layers.Dense(width, activation="relu") for _ in range(layers)]
        + [keras.layers.Dense(classes)]
    )
