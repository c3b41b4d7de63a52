"""Runs inside every worker of tests/multiworker/test_non_finite_policy.py.

Trains in float32 under MultiWorkerMirroredStrategy with an Inf in the last
worker's share of one batch, under each `non_finite` policy, and writes
what every worker did to `<out>/worker<i>.npz`: the weights, the steps
applied and skipped, and the error a failed run raised.
"""

import os

import keras
import numpy as np
import tensorflow as tf

import tfgc
from tests.keras_models import fit_small_model, worker_batches
from tests.workers import start_worker

LOCAL_BATCH, STEPS = 8, 6
# The step at which the last worker's share of the batch holds an Inf.
INF_STEP = 3


def main():
    out, strategy, index = start_worker()
    workers = strategy.num_replicas_in_sync

    def optimizer(policy):
        return lambda: tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9),
            compressor=tfgc.compressors.TopK(density=0.25),
            min_compress_size=0,
            non_finite=policy,
        )

    def batches(drop_step=False):
        return worker_batches(
            workers, LOCAL_BATCH, STEPS, np.inf, INF_STEP, drop_step
        )

    runs = {
        "skip": ("skip", batches()),
        "without_step": ("skip", batches(drop_step=True)),
        "propagate": ("propagate", batches()),
        "raise": ("raise", batches()),
    }
    results = {}
    for name, (policy, (dataset, steps)) in runs.items():
        try:
            model = fit_small_model(
                strategy, optimizer(policy), dataset, steps_per_epoch=steps
            )
        except tf.errors.InvalidArgumentError as error:
            results[f"{name}/error"] = np.array(str(error))
            continue
        results[f"{name}/steps"] = model.optimizer.iterations.numpy()
        results[f"{name}/skipped"] = np.array(model.optimizer.skipped_steps)
        for j, w in enumerate(model.get_weights()):
            results[f"{name}/weight{j}"] = w
    np.savez(os.path.join(out, f"worker{index}.npz"), **results)


if __name__ == "__main__":
    main()
