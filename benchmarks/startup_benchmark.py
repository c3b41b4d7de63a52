"""How long a compressor's training step takes to start: tracing the step's
`tf.function` and running it once, on ResNet-50 (v1.5, 161 variables, 64 x
64 inputs, 10 classes, batch 4 a replica, plain SGD) over two replicas of a
MirroredStrategy in one process (logical CPUs), so that every gather and
its unpacking is built as on two workers. A step's graph grows with its
tensors times what a compressor does to each, and TensorFlow's tracing,
graph optimisation and first run grow with the graph: on a model with many
tensors this is the wait before training starts, in `fit` as in a custom
loop. Each run is measured in a fresh process (nothing traced before), in
turn in each repeat; the median of `--repeats`.

Runs are `compressor_overhead.py`'s (`name[@density][:key=value,...]`);
"keras" is Keras's SGD alone. Writes `--out`.md and .json:

    python benchmarks/startup_benchmark.py --runs 'keras topk@0.01 sbc@0.01'
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

#: The run without tfgc.
KERAS = "keras"
#: Replicas of the step, each on a logical CPU.
REPLICAS = 2
BATCH_PER_REPLICA = 4


def step_graph_size(concrete) -> tuple[int, int]:
    """(ops, functions) of a traced step: the ops of its graph and of every
    function it calls (branches of conds, switch cases)."""
    graph = concrete.graph.as_graph_def()
    functions = graph.library.function
    ops = len(graph.node) + sum(len(f.node_def) for f in functions)
    return ops, len(functions)


def measure(run: str, image_size: int) -> dict:
    """One run in this process: tracing, first and next run, graph size."""
    import _common
    import compressor_overhead
    import keras
    import numpy as np
    import tensorflow as tf

    import tfgc
    from models.resnet50_imagenet import resnet

    _common.split_cpu(REPLICAS)
    keras.utils.set_random_seed(0)
    strategy = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(REPLICAS)]
    )
    with strategy.scope():
        model = resnet.resnet((image_size, image_size, 3), 10)
        optimizer = keras.optimizers.SGD(0.01)
        if run != KERAS:
            optimizer = tfgc.CompressedOptimizer(
                optimizer,
                compressor=compressor_overhead.compressor(
                    *compressor_overhead.parse_run(run)
                ),
            )
        optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(0)
    batch = REPLICAS * BATCH_PER_REPLICA
    images = rng.random((batch, image_size, image_size, 3), np.float32)
    labels = rng.integers(0, 10, batch)
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors((images, labels)).repeat()
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum"
    )

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / batch
        variables = model.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    @tf.function
    def step(x, y):
        return strategy.reduce("SUM", strategy.run(replica_step, (x, y)), None)

    x, y = next(iter(data))
    start = time.perf_counter()
    concrete = step.get_concrete_function(x, y)
    seconds = [time.perf_counter() - start]
    for _ in range(2):
        start = time.perf_counter()
        step(x, y).numpy()
        seconds.append(time.perf_counter() - start)
    ops, functions = step_graph_size(concrete)
    return {
        "trace_s": seconds[0],
        "first_run_s": seconds[1],
        "next_run_s": seconds[2],
        "ops": ops,
        "functions": functions,
    }


def _in_fresh_process(run: str, image_size: int) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            run,
            "--image-size",
            str(image_size),
        ],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"run {run!r} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=f"{KERAS} topk@0.01 sbc@0.01")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument(
        "--out", default=os.path.join(HERE, "results", "startup")
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.image_size)))
        return 0
    runs = args.runs.split()
    import compressor_overhead  # after parsing: it imports TensorFlow

    for text in runs:
        if text == KERAS:
            continue
        try:
            compressor_overhead.compressor(*compressor_overhead.parse_run(text))
        except (ValueError, TypeError) as e:
            parser.error(f"--runs: {text!r}: {e}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    if args.image_size < 32:
        parser.error(f"--image-size must be >= 32; got {args.image_size}")
    measured = {run: [] for run in runs}
    for repeat in range(args.repeats):
        for run in runs:
            last = _in_fresh_process(run, args.image_size)
            measured[run].append(last)
            print(
                f"repeat {repeat + 1}/{args.repeats}, {run}: traced in "
                f"{last['trace_s']:.1f} s, "
                f"first run {last['first_run_s']:.1f} s",
                flush=True,
            )
    import _common

    meta = _common.machine_meta(args.repeats)
    meta["unit"] = "s (median)"
    command = shlex.join(["python", "benchmarks/startup_benchmark.py", *argv])
    results = {"command": command, "meta": meta, "runs": {}}
    lines = _common.report_header(
        "Start-up of a training step", __doc__, command, meta
    ) + [
        "",
        "| run | start-up (s) | trace (s) | first run (s) | next step (s) "
        "| ops in the step | functions |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = ("trace_s", "first_run_s", "next_run_s")
    for run, samples in measured.items():
        for sample in samples:
            sample["startup_s"] = sample["trace_s"] + sample["first_run_s"]
        row = {
            key: statistics.median(s[key] for s in samples)
            for key in ("startup_s",) + keys
        }
        row.update(ops=samples[0]["ops"], functions=samples[0]["functions"])
        results["runs"][run] = dict(row, samples=samples)
        lines.append(
            f"| {run} | {row['startup_s']:.1f} | {row['trace_s']:.1f} | "
            f"{row['first_run_s']:.1f} | {row['next_run_s']:.2f} | "
            f"{row['ops']:,} | {row['functions']} |"
        )
    lines += [
        "",
        "Start-up: trace and first run, each the median over the repeats "
        "(so not always their sum). Trace: Python building the step's "
        "graph; first run: TensorFlow optimising and placing it, then "
        "running it; next step: the second call. Ops: those of the step's "
        "graph and of the functions it calls, both replicas.",
    ]
    _common.write_results(args.out, results, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
