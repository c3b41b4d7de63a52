"""Runs inside every worker of tests/multiworker/test_regroup.py.

`--phase save`: trains the small model with PowerSGD and error feedback
under MultiWorkerMirroredStrategy, each worker on its own share of the
data (so the residuals differ), and saves the weights (the chief to
`--path`, every other worker to a file of its own: saving gathers every
worker's state, so all must save). `--phase load`: the same model on
another number of workers loads the chief's file. Each writes its own
residuals and low-rank factors to `<out>/<phase>_worker<i>.npz`.
"""

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import tfgc
from tests.keras_models import fit_small_model, small_model, worker_batches

LOCAL_BATCH, STEPS = 8, 3


def make_optimizer():
    return tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9),
        tfgc.compressors.PowerSGD(rank=1),
        min_compress_size=0,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--phase", choices=["save", "load"], required=True)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    if args.phase == "save":
        dataset, _ = worker_batches(
            strategy.num_replicas_in_sync, LOCAL_BATCH, STEPS
        )
        model = fit_small_model(strategy, make_optimizer, dataset)
        path = args.path if index == 0 else f"{args.path}.{index}.weights.h5"
        model.save_weights(path)
    else:
        model = small_model(strategy, make_optimizer)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        model.load_weights(args.path)
    results = {}
    for v in model.optimizer.variables:
        if "residual" in v.path or v.path.endswith("_q"):
            results[v.path.split("/")[-1]] = v.numpy()  # this worker's own
    np.savez(
        os.path.join(args.out, f"{args.phase}_worker{index}.npz"), **results
    )


if __name__ == "__main__":
    main()
