"""Runs inside every worker of tests/multiworker/test_determinism.py.

Trains a few steps with each compressor whose choices come from shared
randomness (random-k positions, importance pruning's root, PowerSGD's
initial factor), each worker on its own data, and writes to
`<out>/<run>_worker<i>.npz` what each worker chose, as its own state shows
it: with error feedback a residual is zero exactly where the worker sent,
and PowerSGD keeps its factor Q. Also the weights, to compare two runs.
"""

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import tfgc
from tests.keras_models import (
    fit_small_model,
    small_model,
    worker_batches,
)

LOCAL_BATCH, STEPS = 8, 3


def make(compressor):
    return lambda: tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.05),
        compressor,
        min_compress_size=0,
        seed=7,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    results = {}
    compressors = {
        "randomk": tfgc.compressors.RandomK(0.25),
        "importance": tfgc.compressors.ImportancePruning(0.25),
        "powersgd": tfgc.compressors.PowerSGD(rank=2),
    }
    for name, compressor in compressors.items():
        # The initial state, before any step: PowerSGD's factor.
        model = small_model(strategy, make(compressor))
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        for v in model.optimizer.variables:
            if v.path.endswith("_q"):
                results[f"{name}/initial/{v.path.split('/')[-1]}"] = v.numpy()
        dataset, _ = worker_batches(
            strategy.num_replicas_in_sync, LOCAL_BATCH, STEPS
        )
        model = fit_small_model(strategy, make(compressor), dataset)
        for v in model.optimizer.variables:
            leaf = v.path.split("/")[-1]
            if leaf.endswith(("_residual", "_q")):
                results[f"{name}/state/{leaf}"] = v.numpy()
        for j, w in enumerate(model.get_weights()):
            results[f"{name}/weight{j}"] = w
    np.savez(os.path.join(args.out, f"{args.run}_worker{index}.npz"), **results)


if __name__ == "__main__":
    main()
