"""Runs inside every worker of tests/test_keras_configurations_multiworker.py.

Trains with the `mixed_float16` policy (Keras wraps the optimizer in a
LossScaleOptimizer) under MultiWorkerMirroredStrategy, with and without an
input that overflows float16 on the last worker only, and writes the
weights, step counts and loss scales to `<out>/worker<i>.npz`.
"""

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import tfgc
from tests.test_keras_configurations import FEATURES, fit_small_model

LOCAL_BATCH, STEPS = 8, 6
# The step at which the last worker's share of the batch overflows.
INF_STEP = 3


def make_dataset(num_workers, overflow):
    rng = np.random.default_rng(0)
    global_batch = LOCAL_BATCH * num_workers
    x = rng.normal(size=(global_batch * STEPS, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1))).astype("float32")
    if overflow:
        # With DATA sharding, worker i reads rows [i * LOCAL_BATCH, (i + 1)
        # * LOCAL_BATCH) of each global batch.
        x[INF_STEP * global_batch + (num_workers - 1) * LOCAL_BATCH] = 1e5
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    return ds.with_options(options)


def fit(strategy, make_optimizer, overflow):
    return fit_small_model(
        strategy,
        make_optimizer,
        make_dataset(strategy.num_replicas_in_sync, overflow),
        policy="mixed_float16",
        steps_per_epoch=STEPS,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id

    def plain():
        return keras.optimizers.SGD(0.05)

    runs = {
        "plain": (plain, False),
        "identity": (lambda: tfgc.CompressedOptimizer(plain()), False),
    }
    for name in ("topk", "signsgd"):
        for overflow in (False, True):
            runs[f"{name}_{'inf' if overflow else 'clean'}"] = (
                lambda name=name: tfgc.CompressedOptimizer(
                    plain(), compressor=name, min_compress_size=0
                ),
                overflow,
            )
    results = {}
    for name, (make_optimizer, overflow) in runs.items():
        model = fit(strategy, make_optimizer, overflow)
        optimizer = model.optimizer
        results[f"{name}/kind"] = np.array(type(optimizer).__name__)
        results[f"{name}/inner"] = np.array(
            type(optimizer.inner_optimizer).__name__
        )
        results[f"{name}/steps"] = optimizer.iterations.numpy()
        results[f"{name}/scale"] = optimizer.dynamic_scale.numpy()
        for j, w in enumerate(model.get_weights()):
            results[f"{name}/weight{j}"] = w
    np.savez(os.path.join(args.out, f"worker{index}.npz"), **results)


if __name__ == "__main__":
    main()
