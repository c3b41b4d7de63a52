"""Runs inside every worker of tests/multiworker/test_keras_configurations.py.

Trains with the `mixed_float16` policy (Keras wraps the optimizer in a
LossScaleOptimizer) under MultiWorkerMirroredStrategy, with and without an
input that overflows float16 on the last worker only, and writes the
weights, step counts and loss scales to `<out>/worker<i>.npz`.
"""

import os

import keras
import numpy as np

import tfgc
from tests.keras_models import fit_small_model, worker_batches
from tests.workers import start_worker

LOCAL_BATCH, STEPS = 8, 6
# The step at which the last worker's share of the batch overflows.
INF_STEP = 3


def fit(strategy, make_optimizer, overflow):
    return fit_small_model(
        strategy,
        make_optimizer,
        worker_batches(
            strategy.num_replicas_in_sync,
            LOCAL_BATCH,
            STEPS,
            1e5 if overflow else None,  # overflows float16
            at_step=INF_STEP,
        )[0],
        policy="mixed_float16",
        steps_per_epoch=STEPS,
    )


def main():
    out, strategy, index = start_worker()

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
    np.savez(os.path.join(out, f"worker{index}.npz"), **results)


if __name__ == "__main__":
    main()
