"""RedSync with and without Deep Gradient Compression's training fixes, on
the convergence benchmark's `resnet_digits` task at density 0.1 %.

Two replicas on two logical CPUs, 200 steps of batch 64, SGD at learning
rate 0.05 (momentum 0.9 in RedSync, or in the inner SGD of the others),
over seeds (weights and data order); after training, the loss on the
whole training set and the loss and accuracy on the test set. Prints one
`RESULT` line per run with the per-seed values and their means
(docs/algorithms.md, "RedSync", quotes them).

    python benchmarks/redsync_fixes_study.py 0,1,2 dense mstopk redsync \\
        'redsync:{"warmup_steps": 23}' 'redsync:{"density_warmup_steps": 94}'

A run is NAME[:JSON keyword arguments of the compressor]; NAME is dense,
mstopk, redsync or nomask (RedSync with `momentum_masking=False`).
`DENSITY` and `STEPS` in the environment change 0.001 and 200.
"""

from __future__ import annotations

import json
import os
import sys
import time

import convergence_benchmark  # splits the CPU into two logical ones
import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tfgc  # noqa: E402

DENSITY = float(os.environ.get("DENSITY", "0.001"))
STEPS = int(os.environ.get("STEPS", "200"))


def make(name: str, kwargs: dict):
    """(the compressor, the inner SGD's momentum) of a run."""
    compressors = tfgc.compressors
    if name == "dense":
        return compressors.Identity(), 0.9
    if name == "mstopk":
        return compressors.MSTopK(DENSITY), 0.9
    if name == "nomask":
        kwargs = {**kwargs, "momentum_masking": False}
    redsync = compressors.RedSync(
        DENSITY, momentum=0.9, cost_model=None, **kwargs
    )
    return redsync, 0.0


def run(task, strategy, name: str, kwargs: dict, seed: int):
    keras.utils.set_random_seed(seed)
    x, y = task["train"]
    data = tf.data.Dataset.from_tensor_slices((x, y))
    data = data.shuffle(len(x), seed=seed).repeat().batch(64, True)
    with strategy.scope():
        model = task["build"]()
        compressor, momentum = make(name, kwargs)
        optimizer = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05, momentum=momentum), compressor
        )
        model.compile(
            optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=False,
        )
    start = time.perf_counter()
    with strategy.scope():
        model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0)
    train_loss, _ = model.evaluate(x, y, batch_size=256, verbose=0)
    test_x, test_y = task["test"]
    test_loss, accuracy = model.evaluate(
        test_x, test_y, batch_size=256, verbose=0
    )
    return train_loss, test_loss, accuracy, time.perf_counter() - start


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    # Importing convergence_benchmark made the two logical CPUs.
    task = convergence_benchmark.TASKS["resnet_digits"](False)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    seeds = [int(s) for s in argv[0].split(",")]
    for spec in argv[1:]:
        name, _, arguments = spec.partition(":")
        kwargs = json.loads(arguments) if arguments else {}
        rows = np.array(
            [run(task, strategy, name, kwargs, seed) for seed in seeds]
        )
        print(
            "RESULT",
            name,
            kwargs,
            "seeds",
            seeds,
            "train_loss",
            np.round(rows[:, 0], 4).tolist(),
            f"mean {rows[:, 0].mean():.4f}",
            f"test_loss mean {rows[:, 1].mean():.4f}",
            "accuracy",
            np.round(rows[:, 2], 4).tolist(),
            f"seconds {rows[:, 3].sum():.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
