"""Convergence at equal steps on real data, per compressor, against dense.

Two tasks with data that needs no download, each trained for the same
number of steps under MirroredStrategy on two logical CPUs (two workers
with different data; SBC's local steps and the importance root need more
than one):

* `lstm_ptb`: the LSTM LM "small" configuration (Zaremba et al.; 2 x 200
  LSTM, SGD lr 1, clip-norm 5) on the Penn Treebank subset in
  ../shared/data/ptb-subset; test perplexity on its test file.
* `resnet_digits`: a small ResNet v1.5 (bottleneck blocks (1, 1, 1, 1),
  width 16, 3x3 stem; models/resnet50_imagenet/resnet.py) on the 8x8
  handwritten digits that ship with scikit-learn (1,497 train, 300 test),
  SGD lr 0.05 with momentum 0.9; test accuracy.

Per run: final training loss, the test metric, the total compression factor
over the run (dense fp32 bytes x steps / all bytes sent,
`compression_stats()["run_compression_ratio"]`) and, for SBC, the measured
Golomb bits per position against the formula. RedSync takes the task's
momentum (0 for the LSTM) and the inner SGD none. Writes
`benchmarks/results/convergence_cpu.md` and `.json`.

    python benchmarks/convergence_benchmark.py
    python benchmarks/convergence_benchmark.py --tasks resnet_digits --steps 200
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import _common  # noqa: E402

_common.split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfgc  # noqa: E402
from tfgc import ops  # noqa: E402

C = tfgc.compressors
PTB = os.environ.get(
    "TFGC_PTB_SUBSET",
    os.path.join(
        os.path.dirname(os.path.dirname(HERE)), "shared/data/ptb-subset"
    ),
)
#: name -> factory(density, momentum) of the compressor.
COMPRESSORS = {
    "dense": lambda d, m: C.Identity(),
    "fp16": lambda d, m: C.FP16(),
    "topk": lambda d, m: C.TopK(d),
    "mstopk": lambda d, m: C.MSTopK(d),
    "redsync": lambda d, m: C.RedSync(d, momentum=m, cost_model=None),
    "randomk": lambda d, m: C.RandomK(d),
    "signsgd": lambda d, m: C.SignSGD(),
    "powersgd": lambda d, m: C.PowerSGD(rank=4),
    "acpsgd": lambda d, m: C.ACPSGD(rank=4),
    "sbc": lambda d, m: C.SBC(d),
    "sbc_delay4": lambda d, m: C.SBC(d, delay=4),
    "importance": lambda d, m: C.ImportancePruning(d),
}


class _GolombCounter:
    """Adds up the bits and positions SBC codes (wraps `golomb_encode`).

    Enter it inside the strategy's scope: each replica counts in its own
    copy (a variable all replicas wrote would chain their steps together
    and deadlock the collectives between them); reading sums the copies.
    """

    def __enter__(self):
        def counter():
            return tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

        self.bits, self.positions = counter(), counter()
        self._original = ops.golomb_encode

        def counted(indices, n, b=None):
            encoded, num_bits = self._original(indices, n, b)
            self.bits.assign_add(num_bits)
            self.positions.assign_add(tf.size(indices, out_type=tf.int64))
            return encoded, num_bits

        ops.golomb_encode = counted
        return self

    def __exit__(self, *exc):
        ops.golomb_encode = self._original


def _ptb_task(steps: int):
    from models.lstm_lm import data, model

    size = model.SIZES["small"]
    train = data.read_words(os.path.join(PTB, "ptb.train.txt"))
    test = data.read_words(os.path.join(PTB, "ptb.test.txt"))
    vocab = data.build_vocab(train)
    train_ids = data.to_ids(train, vocab, "train")
    test_ids = data.to_ids(test, vocab, "test")
    x, y = data.windows(train_ids, size.num_steps)
    tx, ty = data.windows(test_ids, size.num_steps)

    def build():
        return model.build_model(size, len(vocab), size.num_steps)

    return {
        "build": build,
        "sgd": {
            "learning_rate": size.learning_rate,
            "global_clipnorm": size.max_grad_norm,
        },
        "momentum": 0.0,
        "train": (x, y),
        "test": (tx, ty),
        "batch": size.batch_size,
        "metric": "perplexity",
        "density": 0.01,
    }


def _digits_task(steps: int):
    from sklearn.datasets import load_digits

    from models.resnet50_imagenet import resnet

    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    labels = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(images))
    train, test = order[:-300], order[-300:]

    def build():
        return resnet.resnet(
            (8, 8, 1),
            10,
            layers=(1, 1, 1, 1),
            width=16,
            cifar_stem=True,
            l2=0.0,
            name="small_resnet",
        )

    return {
        "build": build,
        "sgd": {"learning_rate": 0.05},
        "momentum": 0.9,
        "train": (images[train], labels[train]),
        "test": (images[test], labels[test]),
        "batch": 32,
        "metric": "accuracy",
        "density": 0.01,
    }


TASKS = {"lstm_ptb": _ptb_task, "resnet_digits": _digits_task}


def _inner_with_momentum(task, name):
    """The task's SGD; momentum on it, or in RedSync (never in both)."""
    momentum = 0.0 if name == "redsync" else task["momentum"]
    return keras.optimizers.SGD(momentum=momentum, **task["sgd"])


def _run(task, name, steps):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras.utils.set_random_seed(0)
    x, y = task["train"]
    global_batch = 2 * task["batch"]
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shuffle(len(x), seed=0).repeat().batch(global_batch, True)
    with strategy.scope():
        model = task["build"]()
        compressor = COMPRESSORS[name](task["density"], task["momentum"])
        optimizer = tfgc.CompressedOptimizer(
            _inner_with_momentum(task, name), compressor
        )
        model.compile(
            optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=False,
        )
    start = time.perf_counter()
    with strategy.scope(), _GolombCounter() as golomb:
        history = model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    tx, ty = task["test"]
    loss, accuracy = model.evaluate(tx, ty, batch_size=global_batch, verbose=0)
    stats = optimizer.compression_stats()
    result = {
        "train_loss": float(history.history["loss"][-1]),
        "test_loss": float(loss),
        "test_metric": float(
            np.exp(loss) if task["metric"] == "perplexity" else accuracy
        ),
        "run_compression_ratio": stats["run_compression_ratio"],
        "run_mean_bytes": stats["run_mean_bytes"],
        "dense_bytes": stats["dense_bytes"],
        "seconds": seconds,
    }
    positions = int(golomb.positions.numpy())
    if positions:
        result["bits_per_position"] = int(golomb.bits.numpy()) / positions
        # The formula at the density SBC selects with.
        result["bits_formula"] = ops.golomb_expected_bits_per_position(
            1000, int(1000 / task["density"])
        )
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--compressors", default=",".join(COMPRESSORS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--output", default=os.path.join(HERE, "results", "convergence_cpu")
    )
    args = parser.parse_args(argv)

    results = {}
    for task_name in args.tasks.split(","):
        task = TASKS[task_name](args.steps)
        results[task_name] = {}
        for name in args.compressors.split(","):
            print(f"[convergence] {task_name} {name} ...", flush=True)
            results[task_name][name] = _run(task, name, args.steps)
            print(f"    {results[task_name][name]}", flush=True)
    meta = _common.machine_meta(1)
    lines = [
        "# Convergence at equal steps, per compressor",
        "",
        f"{args.steps} steps per run, two workers (MirroredStrategy, two "
        "logical CPUs), density 1 % where a compressor takes one, error "
        "feedback on (RedSync: its own residual and the task's momentum). "
        "The compression factor counts every step of the run, dense fp32 "
        "bytes against all bytes sent (payloads and overhead). Command: "
        "`python benchmarks/convergence_benchmark.py`.",
    ]
    for task_name, rows in results.items():
        metric = TASKS[task_name](args.steps)["metric"]
        lines += [
            "",
            f"## {task_name}",
            "",
            f"| compressor | train loss | test {metric} | compression "
            "factor over the run | SBC bits per position (formula) |",
            "|---|---|---|---|---|",
        ]
        for name, row in rows.items():
            bits = ""
            if "bits_per_position" in row:
                bits = (
                    f"{row['bits_per_position']:.2f} "
                    f"({row['bits_formula']:.2f})"
                )
            lines.append(
                f"| {name} | {row['train_loss']:.3f} | "
                f"{row['test_metric']:.4g} | "
                f"{row['run_compression_ratio']:,.0f}x | {bits} |"
            )
    _common.write_results(
        args.output, {"meta": meta, "results": results}, "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
