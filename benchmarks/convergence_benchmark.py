"""Convergence at equal steps on real data, per compressor, against dense.

Two tasks with data that needs no download, each
trained for the same number of steps per compressor under MirroredStrategy
on two logical CPUs (two workers with different data; SBC's local steps and
the importance root need more than one):

* `lstm_ptb`: the LSTM LM "small" configuration of Zaremba et al. (2 x 200
  LSTM, 20 unrolled steps, batch 20 (10 per worker), SGD lr 1, clip-norm
  5, no dropout) on the Penn Treebank subset in ../shared/data/ptb-subset; test
  perplexity on its test file.
* `resnet_digits`: a small ResNet v1.5 (bottleneck blocks (1, 1, 1, 1),
  width 16, 3x3 stem; models/resnet50_imagenet/resnet.py) on the 8x8
  handwritten digits that ship with scikit-learn (1,497 train, 300 test),
  SGD lr 0.05 with momentum 0.9; test accuracy.

The compressors: dense fp32 and fp16, the baselines TopK, RandomK, scaled
SignSGD and PowerSGD (rank 4), and the paper algorithms MSTopK, RedSync,
SBC (delay 1 and 4), importance pruning and ACP-SGD (rank 4); the
planner (`auto`) and a plan mixing its candidates by bucket
(`auto_mixed`); density 1 % where one applies, error feedback on
(RedSync: its own residual and the task's momentum, the inner SGD none).

Per run: the training loss of every step (recovered from Keras's running
mean), the final training loss (mean of the last tenth of the steps), the
test metric, the total compression factor over the run (dense fp32 bytes x
steps / all bytes sent, `compression_stats()["run_compression_ratio"]`)
and, for SBC, the measured Golomb bits per position against the formula.
Writes `convergence.json`, `convergence.md` and one loss-curve plot per
task, `convergence_<task>.png`, to `--out` (docs/benchmarks/); a run of
some `--tasks` keeps the other tasks' results found there, each with the
command and machine that measured it:

    python -m benchmarks.run --preset convergence
    python benchmarks/convergence_benchmark.py --tasks resnet_digits \\
        --steps 100 --compressors dense,topk --out /tmp/conv
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from typing import NamedTuple

import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import _common  # noqa: E402

_common.split_cpu(2)

import keras  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import tfgc  # noqa: E402
from tfgc import ops  # noqa: E402
from tfgc.optimizers import auto_plan  # noqa: E402

C = tfgc.compressors
#: name -> (label, factory(density, momentum) of the compressor).
COMPRESSORS = {
    "dense": ("dense fp32", lambda d, m: C.Identity()),
    "fp16": ("dense fp16", lambda d, m: C.FP16()),
    "topk": ("TopK", lambda d, m: C.TopK(d)),
    "randomk": ("RandomK", lambda d, m: C.RandomK(d)),
    "signsgd": ("SignSGD (scaled)", lambda d, m: C.SignSGD(scaled=True)),
    "powersgd": ("PowerSGD rank 4", lambda d, m: C.PowerSGD(rank=4)),
    "mstopk": ("MSTopK", lambda d, m: C.MSTopK(d)),
    "redsync": (
        "RedSync",
        lambda d, m: C.RedSync(d, momentum=m, cost_model=None),
    ),
    "sbc": ("SBC", lambda d, m: C.SBC(d)),
    "sbc_delay4": ("SBC delay 4", lambda d, m: C.SBC(d, delay=4)),
    "importance": ("importance pruning", lambda d, m: C.ImportancePruning(d)),
    "acpsgd": ("ACP-SGD rank 4", lambda d, m: C.ACPSGD(rank=4)),
    # The planner's default candidates, its choices revised as it runs.
    "auto": (
        "auto (re-planned every 500 steps)",
        lambda d, m: C.Auto(replan_every=500, verbose=False),
    ),
    # What the planner may make of a model, whatever this machine's
    # measurements would choose: its compressing candidates side by side.
    "auto_mixed": (
        "auto, its candidates mixed by bucket",
        lambda d, m: MixedPlan(),
    ),
}


class MixedPlan(NamedTuple):
    """`Auto` with its default candidates but dense fp32 taken in turn,
    bucket by bucket (TopK, ACP-SGD, MSTopK, PowerSGD, FP16), in buckets
    of `bucket_bytes`: a plan that mixes every codec the planner may
    choose in one model. On one machine the planner itself measures no
    network and keeps dense fp32 everywhere."""

    bucket_bytes: int = 2**20
    #: Indices into `Auto`'s default candidates.
    cycle: tuple[int, ...] = (2, 5, 3, 4, 1)

    def compressor(self, variables) -> C.Auto:
        count = len(auto_plan.buckets(variables, self.bucket_bytes))
        choices = [self.cycle[i % len(self.cycle)] for i in range(count)]
        return C.Auto(choices=choices, verbose=False)


#: Steps per task when --steps is not given.
STEPS = {"resnet_digits": 200, "lstm_ptb": 3000}
DENSITY = 0.01


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


class _StepLosses(keras.callbacks.Callback):
    """Each step's training loss, and a progress line every `every` steps.

    Keras logs the running mean of the epoch's losses; with equal batches
    the k-th loss is k * mean_k - (k - 1) * mean_(k-1).
    """

    def __init__(self, label: str, steps: int, every: int):
        super().__init__()
        self.label, self.steps, self.every = label, steps, every
        self.losses: list[float] = []
        self._total = 0.0
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        total = (batch + 1) * float(logs["loss"])
        self.losses.append(total - self._total)
        self._total = total
        step = batch + 1
        if step % self.every == 0 or step == self.steps:
            recent = np.mean(self.losses[-self.every :])
            print(
                f"[convergence] {self.label} step {step}/{self.steps} "
                f"loss {recent:.3f} (mean of the last {self.every}) "
                f"{time.perf_counter() - self._start:.0f} s",
                flush=True,
            )


def _ptb_task(tiny: bool):
    from models.lstm_lm import data, model, shared_subset_dir

    # Zaremba et al.'s "small": 20 unrolled steps (ModelSize's default is
    # 35) and a batch of 20, here split over the two workers.
    size = model.SIZES["small"]
    num_steps, batch, hidden = (5, 4, 16) if tiny else (20, 10, 200)
    size = dataclasses.replace(size, hidden_size=hidden)
    corpus = data.load_corpus(shared_subset_dir(), eval_splits=("test",))
    train_ids, test_ids = corpus.train, corpus.evals["test"]
    if tiny:
        test_ids = test_ids[:2000]
    x, y = data.windows(train_ids, num_steps)
    tx, ty = data.windows(test_ids, num_steps)

    def build():
        return model.build_model(size, corpus.vocab_size, num_steps)

    return {
        "build": build,
        "sgd": {
            "learning_rate": size.learning_rate,
            "global_clipnorm": size.max_grad_norm,
        },
        "momentum": 0.0,
        "train": (x, y),
        "test": (tx, ty),
        "batch": batch,
        "metric": "perplexity",
        "description": f"LSTM LM 2 x {hidden}, {num_steps} unrolled steps, "
        f"batch {batch} per worker, vocabulary {corpus.vocab_size:,}, SGD lr "
        f"{size.learning_rate:g}, clip-norm {size.max_grad_norm:g}",
    }


def _digits_task(tiny: bool):
    from sklearn.datasets import load_digits

    from models.resnet50_imagenet import resnet

    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    labels = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(images))
    train, test = order[:-300], order[-300:]
    width, batch = (4, 8) if tiny else (16, 32)

    def build():
        return resnet.resnet(
            (8, 8, 1),
            10,
            layers=(1, 1, 1, 1),
            width=width,
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
        "batch": batch,
        "metric": "accuracy",
        "description": f"ResNet v1.5, blocks (1, 1, 1, 1), width {width}, "
        f"batch {batch} per worker, SGD lr 0.05 momentum 0.9",
    }


TASKS = {"resnet_digits": _digits_task, "lstm_ptb": _ptb_task}


def _inner_with_momentum(task, compressor):
    """The task's SGD; momentum on it, or in the compressor where it
    applies momentum itself (RedSync's momentum correction), never in
    both."""
    momentum = 0.0 if compressor.spec.local_momentum else task["momentum"]
    return keras.optimizers.SGD(momentum=momentum, **task["sgd"])


def train(task, make, steps, label):
    """One training run of `task` with the compressor `make(density,
    momentum)` returns (a factory as in `COMPRESSORS`), `label` naming it in
    the progress lines: its results as a dict."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras.utils.set_random_seed(0)
    x, y = task["train"]
    global_batch = 2 * task["batch"]
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shuffle(len(x), seed=0).repeat().batch(global_batch, True)
    with strategy.scope():
        model = task["build"]()
        compressor = make(DENSITY, task["momentum"])
        options = {}
        if isinstance(compressor, MixedPlan):
            options["bucket_bytes"] = compressor.bucket_bytes
            compressor = compressor.compressor(model.trainable_variables)
        optimizer = tfgc.CompressedOptimizer(
            _inner_with_momentum(task, compressor), compressor, **options
        )
        model.compile(
            optimizer,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=False,
        )
    losses = _StepLosses(label, steps, max(1, steps // 10))
    start = time.perf_counter()
    with strategy.scope(), _GolombCounter() as golomb:
        model.fit(
            ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[losses]
        )
    seconds = time.perf_counter() - start
    tx, ty = task["test"]
    loss, accuracy = model.evaluate(tx, ty, batch_size=global_batch, verbose=0)
    stats = optimizer.compression_stats()
    result = {
        "train_loss": float(np.mean(losses.losses[-max(1, steps // 10) :])),
        "test_loss": float(loss),
        "test_metric": float(
            np.exp(loss) if task["metric"] == "perplexity" else accuracy
        ),
        "run_compression_ratio": stats["run_compression_ratio"],
        "run_mean_bytes": stats["run_mean_bytes"],
        "dense_bytes": stats["dense_bytes"],
        "seconds": seconds,
        "losses": [round(v, 5) for v in losses.losses],
    }
    plan = optimizer.plan
    if plan is not None:  # the codec of each bucket at the end
        result["plan"] = [plan.labels[c] for c in plan.choices]
    positions = int(golomb.positions.numpy())
    if positions:
        result["bits_per_position"] = int(golomb.bits.numpy()) / positions
        # The formula at the density SBC selects with.
        density = getattr(compressor, "density", DENSITY)
        result["bits_formula"] = ops.golomb_expected_bits_per_position(
            1000, round(1000 / density)
        )
    return result


def smooth(values, window: int) -> np.ndarray:
    """Trailing moving average (shorter at the start)."""
    values = np.asarray(values, dtype=np.float64)
    sums = np.cumsum(np.insert(values, 0, 0.0))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def plot(task_name: str, rows: dict, window: int, path: str) -> None:
    """Loss vs step, one line per compressor, dense fp32 emphasised."""
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("tab20").colors
    for i, (name, row) in enumerate(rows.items()):
        curve = smooth(row["losses"], window)
        steps = np.arange(1, len(curve) + 1)
        if name == "dense":
            style = {"color": "black", "linewidth": 2.6, "zorder": 10}
        elif name == "fp16":
            style = {"color": "grey", "linewidth": 1.6, "linestyle": "--"}
        else:
            style = {"color": colors[i % len(colors)], "linewidth": 1.1}
        ax.plot(steps, curve, label=COMPRESSORS[name][0], **style)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (moving average over {window} steps)")
    ax.set_title(f"{task_name}: training loss per compressor, density 1 %")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def provenance(meta: dict) -> str:
    """The line that says which command, machine and time measured a run."""
    return (
        f"Command: `{meta['command']}`. Machine: {meta['machine']}, "
        f"TensorFlow {meta['tensorflow']}, compiled ops "
        f"{'on' if meta['custom_ops'] else 'off'}; wall time "
        f"{meta['wall_seconds'] / 60:.1f} min"
        + ("" if meta["complete"] else " (**cut short**)")
        + "."
    )


def _other_commands(rows: dict, command: str) -> list[str]:
    """Lines naming the rows an earlier command measured (--update)."""
    by_command: dict[str, list[str]] = {}
    for name, row in rows.items():
        if row.get("command", command) != command:
            by_command.setdefault(row["command"], []).append(
                COMPRESSORS[name][0]
            )
    lines = []
    for earlier, names in by_command.items():
        lines += [
            "",
            f"Rows kept from an earlier run: {', '.join(names)} (`{earlier}`).",
        ]
    return lines


def _compared(metric: str, value: float, dense: float | None) -> str:
    if dense is None:
        return ""
    if metric == "perplexity":
        return f"{value / dense:.2f}x"
    return f"{100 * (value - dense):+.1f} points"


def markdown(results: dict, plots: dict) -> str:
    """The tables, the plots, and each task's command and machine."""
    lines = [
        "# Convergence at equal steps, per compressor",
        "",
        "Two workers (MirroredStrategy, two logical "
        "CPUs, different data per worker), the same seed and data order "
        "for every compressor, density 1 % where a compressor takes one, "
        "PowerSGD and ACP-SGD rank 4, error feedback on (RedSync: its own "
        "residual and the task's momentum). Train loss: the mean of the "
        "last tenth of the steps. The compression factor counts every "
        "step of the run, dense fp32 bytes against all bytes sent "
        "(payloads and overhead); on these small models the 1-D tensors "
        "and headers are a large share, so the factors are far below "
        "those on real model shapes. One seed: differences of a few "
        "percent are within run-to-run noise. Each task names the command "
        "that measured it: a run of some tasks keeps the others' results.",
    ]
    for task_name, task in results.items():
        rows, metric, meta = task["runs"], task["metric"], task["meta"]
        dense = rows.get("dense", {}).get("test_metric")
        versus = "x dense" if metric == "perplexity" else "vs dense"
        lines += [
            "",
            f"## {task_name}",
            "",
            f"{task['description']}; {task['steps']} steps per run.",
            "",
            provenance(meta),
            *_other_commands(rows, meta["command"]),
            "",
            f"![{task_name} loss curves]({os.path.basename(plots[task_name])})",
            "",
            f"*Training loss per step, a trailing moving average over "
            f"{task['window']} steps; dense fp32 in thick black.*",
            "",
            f"| compressor | train loss | test {metric} | {versus} | "
            "compression factor over the run | SBC bits per position "
            "(formula) | seconds |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in rows.items():
            bits = ""
            if "bits_per_position" in row:
                bits = (
                    f"{row['bits_per_position']:.2f} "
                    f"({row['bits_formula']:.2f})"
                )
            value = row["test_metric"]
            shown = f"{value:.1f}" if metric == "perplexity" else f"{value:.1%}"
            lines.append(
                f"| {COMPRESSORS[name][0]} | {row['train_loss']:.3f} | "
                f"{shown} | {_compared(metric, value, dense)} | "
                f"{row['run_compression_ratio']:,.0f}x | {bits} | "
                f"{row['seconds']:.0f} |"
            )
        for name, row in rows.items():
            if row.get("plan"):
                lines += [
                    "",
                    f"{COMPRESSORS[name][0]}: the codec of each bucket at "
                    f"the end (the last first): {', '.join(row['plan'])}.",
                ]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--compressors", default=",".join(COMPRESSORS))
    parser.add_argument(
        "--steps",
        type=int,
        help="steps per run, every task (default: "
        + ", ".join(f"{t} {n}" for t, n in STEPS.items())
        + ")",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep a task's earlier runs (in --out, same model and steps) "
        "of the compressors not in --compressors; each row names the "
        "command that measured it",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny models and batches: a check that the benchmark runs",
    )
    parser.add_argument(
        "--out", default=os.path.join(REPO, "docs", "benchmarks")
    )
    return parser


def _path(out: str) -> str:
    return os.path.join(out, "convergence")


def earlier_results(out: str) -> dict:
    """The results of every task an earlier run wrote to `out`.

    A run of one task (say the LSTM for more steps) updates its section and
    keeps the others, each with the command and machine that measured it;
    with --update a task also keeps its runs of the compressors not rerun.
    """
    try:
        with open(_path(out) + ".json") as f:
            earlier = json.load(f)["results"]
    except FileNotFoundError:
        return {}
    return {t: r for t, r in earlier.items() if t in TASKS}


def kept_runs(earlier: dict | None, task: dict, steps: int) -> dict:
    """The runs --update keeps of an earlier run of the same task: those
    of the same model and number of steps, none otherwise."""
    if earlier is None:
        return {}
    same = (earlier["description"], earlier["steps"]) == (
        task["description"],
        steps,
    )
    if not same:
        return {}
    command = earlier["meta"]["command"]
    return {
        name: {**run, "command": run.get("command", command)}
        for name, run in earlier["runs"].items()
    }


def _write(out: str, results: dict) -> None:
    """The JSON, the markdown and one plot per task, in `out`."""
    os.makedirs(out, exist_ok=True)
    results = {t: results[t] for t in TASKS if t in results}
    plots = {}
    for task_name, task in results.items():
        plots[task_name] = os.path.join(out, f"convergence_{task_name}.png")
        plot(task_name, task["runs"], task["window"], plots[task_name])
    _common.write_results(
        _path(out), {"results": results}, markdown(results, plots)
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    names = [n for n in args.compressors.split(",") if n]
    unknown = [t for t in tasks if t not in TASKS]
    unknown += [n for n in names if n not in COMPRESSORS]
    if unknown:
        parser.error(
            f"unknown {unknown}; tasks: {list(TASKS)}, compressors: "
            f"{list(COMPRESSORS)}"
        )
    machine = _common.machine_meta(1)
    del machine["repeats"], machine["unit"]
    machine["command"] = " ".join(
        ["python -m benchmarks.run --preset convergence", shlex.join(argv)]
    ).strip()
    earlier = earlier_results(args.out)
    results = {t: r for t, r in earlier.items() if t not in tasks}
    total, done = len(tasks) * len(names), 0
    begin = time.perf_counter()
    for task_name in tasks:
        task = TASKS[task_name](args.tiny)
        steps = args.steps or STEPS[task_name]
        meta = dict(machine)
        kept = (
            kept_runs(earlier.get(task_name), task, steps)
            if args.update
            else {}
        )
        results[task_name] = {
            "description": task["description"],
            "metric": task["metric"],
            "steps": steps,
            "window": max(1, steps // 30),
            "meta": meta,
            "runs": kept,
        }
        task_begin = time.perf_counter()
        for name in names:
            done += 1
            print(
                f"[convergence] run {done}/{total}: {task_name} {name}, "
                f"{steps} steps ({time.perf_counter() - begin:.0f} s in)",
                flush=True,
            )
            run = train(
                task, COMPRESSORS[name][1], steps, f"{task_name} {name}"
            )
            run["command"] = meta["command"]
            runs = results[task_name]["runs"]
            runs[name] = run
            # The table in the compressors' order, kept runs among them.
            order = [n for n in COMPRESSORS if n in runs]
            results[task_name]["runs"] = runs = {n: runs[n] for n in order}
            summary = {k: v for k, v in run.items() if k != "losses"}
            print(f"    {summary}", flush=True)
            # After every run, so that a cut-short sweep leaves its results.
            meta["wall_seconds"] = time.perf_counter() - task_begin
            meta["load_average"] = os.getloadavg()
            meta["complete"] = all(n in runs for n in names)
            _write(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
