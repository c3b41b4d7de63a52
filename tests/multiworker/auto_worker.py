"""Runs inside every worker of tests/multiworker/test_auto_plan.py.

Builds `CompressedOptimizer(compressor=Auto(...))` for a model of three
Dense layers under MultiWorkerMirroredStrategy (the planner measures the
real collectives and each worker's own compute), trains a few steps on
this worker's share of the data, and writes to `<out>/worker<i>.npz` the
plan (choices, predicted seconds, the agreed costs), the measured report
and the weights.
"""

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import tfgc

STEPS, LOCAL_BATCH = 8, 16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(8),
            ]
        )
        optimizer = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.01),
            tfgc.compressors.Auto(
                candidates=["identity", "topk", "powersgd"], check_after=2
            ),
            bucket_bytes=2**19,
        )
        model.compile(optimizer, "mse", jit_compile=False)
    rng = np.random.default_rng(index)  # each worker its own data
    x = rng.normal(size=(STEPS * LOCAL_BATCH, 64)).astype("float32")
    y = rng.normal(size=(STEPS * LOCAL_BATCH, 8)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(LOCAL_BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF
    )
    model.fit(data.with_options(options), epochs=1, verbose=0)
    plan = optimizer.plan
    found = optimizer.plan_report()
    np.savez(
        os.path.join(args.out, f"worker{index}.npz"),
        choices=np.array(plan.choices),
        seconds=np.array([b.seconds for b in plan.buckets]),
        collectives=np.array(
            [line for line in plan.collectives if line is not None],
            np.float64,
        ).ravel(),
        codecs=np.array(plan.codecs, np.float64).ravel(),
        exchanges=np.array(found.exchanges),
        busy=np.array(found.busy),
        weights=np.concatenate([w.numpy().ravel() for w in model.weights]),
    )


if __name__ == "__main__":
    main()
