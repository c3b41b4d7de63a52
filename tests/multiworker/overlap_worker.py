"""Runs inside every worker of tests/multiworker/test_overlap.py.

Trains a stack of Dense layers under MultiWorkerMirroredStrategy with
`CompressedOptimizer(Identity)` in each of the test's RUNS (small buckets,
small buckets under the non-finite guard, one fused exchange), profiles
PROFILED_STEPS training steps of each, and on the chief writes to
`<out>/overlap.json`, per run and step, when the step's last gradient op
ended, when the first bucket's first collective started, when the last
collective started and ended, and when the first variable update started
(picoseconds on the profiler's clock).
"""

import argparse
import faulthandler
import json
import os
import re

import keras
import numpy as np
import tensorflow as tf

import tfgc
from benchmarks import _common
from tests import keras_models
from tests.multiworker.test_overlap import (
    LAYERS,
    LOCAL_BATCH,
    PROFILED_STEPS,
    RUNS,
)

WIDTH = 512
# A weight update: the fused op of a bucket, or Keras's own SGD step
# (w -= g * lr); not the step counter's increment, which depends on no
# gradient.
UPDATE = re.compile(
    r"/sgd(_\d+)?/(Tfgc>FusedUpdate(_\d+)?|update[^:]*/AssignSubVariableOp):"
)


def profiled_steps(
    strategy, bucket_bytes, non_finite, logdir: str
) -> list[dict]:
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras_models.dense_stack(WIDTH, LAYERS)
        optimizer = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.01),
            "identity",
            bucket_bytes=bucket_bytes,
            non_finite=non_finite,
        )
        model.compile(
            optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    rng = np.random.default_rng(0)
    global_batch = LOCAL_BATCH * strategy.num_replicas_in_sync
    x = rng.normal(size=(global_batch, WIDTH)).astype("float32")
    y = rng.integers(0, 10, global_batch)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    data = data.repeat()
    model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # traced, warm
    steps = []
    for number in range(PROFILED_STEPS):
        step_dir = os.path.join(logdir, str(number))
        tf.profiler.experimental.start(step_dir)
        model.fit(data, steps_per_epoch=1, epochs=1, verbose=0)
        tf.profiler.experimental.stop()
        steps.append(timeline(list(_common.profile_events(step_dir))))
    return steps


def timeline(profile) -> dict:
    """When one profiled step's gradients, collectives and updates ran."""
    gradients = [e for e in profile if "gradient_tape/" in e[0]]
    collectives = [
        e for e in profile if "tfgc_bucket_" in e[0] and ":Collective" in e[0]
    ]
    first_bucket = [e for e in collectives if "tfgc_bucket_0/" in e[0]]
    # Keras's SGD (`sgd`, `sgd_1`, ...): one fused op per bucket.
    updates = [e for e in profile if UPDATE.search(e[0])]
    return {
        "gradient_ops": len(gradients),
        "first_bucket_collectives": len(first_bucket),
        "update_ops": len(updates),
        "last_gradient_end": max((e[2] for e in gradients), default=0),
        "first_collective_start": min((e[1] for e in first_bucket), default=0),
        "last_collective_start": max((e[1] for e in collectives), default=0),
        "last_collective_end": max((e[2] for e in collectives), default=0),
        "first_update_start": min((e[1] for e in updates), default=0),
    }


def main():
    # A crash prints where it happened: the test runs the script again
    # when that was TensorFlow's profiler (test_overlap.profiler_crashed).
    faulthandler.enable()
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id
    results = {
        f"{bucket_bytes} {non_finite}": profiled_steps(
            strategy,
            bucket_bytes,
            non_finite,
            os.path.join(
                args.out, f"profile_{bucket_bytes}_{non_finite}_{task}"
            ),
        )
        for bucket_bytes, non_finite in RUNS
    }
    if task == 0:
        with open(os.path.join(args.out, "overlap.json"), "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
