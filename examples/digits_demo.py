"""Multi-worker training on real data, dense vs compressed, side by side.

Trains a small MLP on the UCI handwritten digits that ship inside
scikit-learn (1,797 8x8 images; nothing to download) under
MultiWorkerMirroredStrategy, once per compressor, and prints the training
loss and the bytes each worker sends per step.

    python -m tfgc.launch -n 2 -- python -m examples.digits_demo

The workers start and leave together as the training mains' do
(`models.common.cluster`): a worker whose peers never start gives up after
`--startup_timeout` seconds, and at the end every worker waits for the
others, so that the run ends without errors and its exit code says
whether all finished.
"""

from __future__ import annotations

from tfgc import quiet

# First: TensorFlow's C++ logs at warning level, its start-up notices
# dropped (they ignore the level).
quiet.import_tensorflow()

import argparse
import os
import sys
import time

import keras
import tensorflow as tf
from sklearn.datasets import load_digits

import tfgc
from models.common import cluster

RUNS = {
    "dense (identity)": lambda: tfgc.compressors.Identity(),
    "topk 1% + EF": lambda: tfgc.compressors.TopK(density=0.01),
    "signsgd + EF": lambda: tfgc.compressors.SignSGD(),
    "powersgd r=2 + EF": lambda: tfgc.compressors.PowerSGD(rank=2),
}


def make_dataset(num_workers: int, local_batch: int) -> tf.data.Dataset:
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, digits.target))
    ds = ds.shuffle(len(x), seed=0, reshuffle_each_iteration=True)
    ds = ds.batch(local_batch * num_workers, drop_remainder=True).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    return ds.with_options(options), len(x)


def train(strategy, compressor, args):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(args.hidden, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9),
            compressor=compressor,
            min_compress_size=0,
        )
        model.compile(
            optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=False,
        )
    p = strategy.num_replicas_in_sync
    dataset, n = make_dataset(p, args.batch_size)
    steps = n // (args.batch_size * p)
    start = time.perf_counter()
    history = model.fit(
        dataset,
        epochs=args.epochs,
        steps_per_epoch=steps,
        verbose=2 if args.verbose else 0,
        callbacks=[tfgc.callbacks.CompressionStats()],
        shuffle=False,  # the dataset shuffles itself
    )
    seconds = time.perf_counter() - start
    h = history.history
    return {
        "loss": h["loss"],
        "accuracy": h["accuracy"][-1],
        "sent_bytes": h["sent_bytes"][-1],
        "dense_bytes": h["dense_bytes"][-1],
        "ratio": h["compression_ratio"][-1],
        "step_ms": 1000 * seconds / (steps * args.epochs),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=16, help="per worker")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--out", default="runs/digits_demo.md")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--startup_timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the other workers to start",
    )
    args = parser.parse_args()

    if "TF_CONFIG" in os.environ:
        strategy = cluster.multi_worker_strategy(
            startup_timeout=args.startup_timeout
        )
        chief = strategy.cluster_resolver.task_id == 0
    else:
        strategy, chief = tf.distribute.get_strategy(), True
    p = strategy.num_replicas_in_sync

    results = {}
    for name, make in RUNS.items():
        results[name] = r = train(strategy, make(), args)
        if chief:
            losses = " ".join(f"{v:.3f}" for v in r["loss"])
            print(f"{name:>18}: loss per epoch {losses}", flush=True)

    if chief:
        write_table(results, p, args)
    cluster.finish_run()


def write_table(results: dict, p: int, args: argparse.Namespace) -> None:
    """Prints the results as a Markdown table and writes it to `args.out`."""
    lines = [
        f"Digits MLP, {p} worker(s), {args.epochs} epochs, batch "
        f"{args.batch_size} per worker, SGD(0.05, momentum 0.9).",
        "",
        "| run | final loss | accuracy | bytes sent / step / worker "
        "| dense bytes | ratio | ms / step |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['loss'][-1]:.4f} | {r['accuracy']:.3f} "
            f"| {r['sent_bytes']:,.0f} | {r['dense_bytes']:,.0f} "
            f"| {r['ratio']:.1f}x | {r['step_ms']:.1f} |"
        )
    table = "\n".join(lines)
    print("\n" + table, flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        f.write(table + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    try:
        main()
    except cluster.ClusterError as err:
        sys.exit(f"error: {err}")
