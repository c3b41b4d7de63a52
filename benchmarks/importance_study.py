"""Why importance-weighted pruning lagged dense, and what fixed it.

A study of `tfgc.compressors.ImportancePruning` (docs/algorithms.md,
"Importance-weighted pruning") against dense, TopK and MSTopK at the same
density, on two workers (MirroredStrategy over two logical CPUs, each
worker its own half of every global batch, error feedback on):

* `bigram`, `digits`, `lstm`: the tasks of `_study.py` (an embedding and
  a softmax layer on the PTB subset with momentum SGD, 300 steps; the
  digits MLP, every tensor compressed, training loss on all digits; the
  2 x 100 LSTM LM, 100 steps), `--momentum` 0.9 by default;
* `speed`: the lab's `compressors` stand-in (4 x Dense(2,500), 25 M
  weights) on one worker without communication, step time over the floor,
  and the compress step of one 25 M tensor.

With `--trace`, every step of every run reads worker 0's residual and
records, per tensor: the age of the residual (steps since an entry was
last zero, i.e. last sent or never written, over the entries that hold
something; also weighted by |residual|), its norm against the weights'
and the step's gradient's, and what landed (entries whose residual was
sent this step): their age, the norm of what landed against the step's
gradient, and the median |w| where it landed against the tensor's.
Writes `importance_study_<task><tag>.json` and `.md` (`speed`:
`importance_speed.md`) under `--out` (default benchmarks/results):

    python benchmarks/importance_study.py --task bigram --seeds 0,1,2 \
        --runs "dense topk mstopk importance importance@0.017 \
        importance:relative_epsilon=0 importance@0.017:relative_epsilon=0"
    python benchmarks/importance_study.py --task bigram --trace \
        --tag _trace --runs "topk importance importance:relative_epsilon=0"
    python benchmarks/importance_study.py --task speed \
        --runs "topk@0.001 importance_unfused@0.001:relative_epsilon=0 \
        importance@0.001 importance_zeroing@0.001"

`--runs` is a space-separated list of `name[@density][:arg=value,...]`
(density 0.01 when not given): `importance@0.017` is ImportancePruning at
1 / 58.8, the paper's ResNet-50 ratio; `importance:relative_epsilon=0` the
bare ratio |acc| / (|w| + 1e-8) that tfgc ranked by before;
`stale_first:max_age=200` the age bound that was tried and measured
harmful (`StaleFirst`); `current_gradient` the ranking by this step's
gradient instead of acc (`CurrentGradient`); `importance_unfused`,
`importance_zeroing` variants for timing only (`UnfusedRatio`,
`ZeroingResidual`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import _common  # noqa: E402

_common.split_cpu(2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _study import TASKS, run  # noqa: E402

import tfgc  # noqa: E402
from tfgc.compressors.error_feedback import (  # noqa: E402
    ErrorFeedback,
    ErrorFeedbackState,
)

C = tfgc.compressors


class _Generic:
    """Takes ErrorFeedback's generic path: acc, compress, local estimate,
    subtraction (no fused `compress_with_residual`)."""

    def compress_with_residual(self, *args, **kwargs):
        return None


class GenericImportance(_Generic, C.ImportancePruning):
    """For timing only: `ImportancePruning` on the generic path, as before
    its fused op."""


class AgeState(NamedTuple):
    age: tf.Tensor  # int32: steps since each entry was last sent


class StaleFirst(_Generic, C.ImportancePruning):
    """An experiment, not part of tfgc: `ImportancePruning` whose entries
    not sent for `max_age` steps go before all others, oldest first (a
    hard bound on the residual's age; the age is the same on every worker,
    as every worker sends the root's positions). Measured harmful
    (docs/algorithms.md), hence only here."""

    def __init__(self, density=0.01, max_age=200, **kwargs):
        super().__init__(density, **kwargs)
        self.max_age = int(max_age)

    def init_state(self, shape, dtype, key):
        return AgeState(tf.zeros(shape, tf.int32))

    def compress(self, x, state, key, info=None):
        flat = tf.reshape(x, [-1])
        w = tf.reshape(info.variable, [-1])
        ratio = tf.cast(flat, tf.float32) / (
            tf.abs(tf.cast(w, tf.float32)) + self._floor(w)
        )
        age = tf.reshape(state.age, [-1])
        # Above every finite importance, ordered by age.
        score = tf.where(
            age >= self.max_age, 2.0**100 * tf.cast(age + 1, tf.float32), ratio
        )
        _, indices = tfgc.ops.top_k_abs(score, self.num_selected(x.shape))
        root = C.importance.root_worker(key[1], info.num_peers)
        return C.importance.IndexPayload(
            root, tf.sort(indices)
        ), C.importance._Context(x.shape, x.dtype, flat, None, state)

    def decompress(self, reduced, ctx):
        total, _ = super().decompress(reduced, ctx)
        age = tf.tensor_scatter_nd_update(
            tf.reshape(ctx.state.age, [-1]) + 1,
            ctx.indices[:, None],
            tf.zeros_like(ctx.indices),
        )
        return total, AgeState(tf.reshape(age, ctx.shape))

    def get_config(self):
        return {**super().get_config(), "max_age": self.max_age}


class ZeroingResidual(_Generic, C.ImportancePruning):
    """A prototype, not part of tfgc: `ImportancePruning` whose error
    feedback keeps acc with the sent positions zeroed (one scatter) instead
    of the generic acc - local estimate, where finite (a scatter, a
    subtraction, a finiteness test and a select over the whole tensor).
    The same residual (a NaN that was sent is zeroed either way); it
    needs a hook in `ErrorFeedback` (tfgc/compressors/error_feedback.py)
    that this class stands in for, to measure what it would save."""


class UnfusedRatio(_Generic, C.ImportancePruning):
    """For timing only: the ranking as tfgc computed it before (four TF ops,
    |acc| / (|w| + epsilon), and the floor's norm when relative_epsilon >
    0) where `ImportancePruning` now runs one fused (XLA) pass."""

    def compress(self, x, state, key, info=None):
        flat = tf.reshape(x, [-1])
        w = tf.reshape(tf.cast(info.variable, tf.float32), [-1])
        score = tf.abs(tf.cast(flat, tf.float32)) / (tf.abs(w) + self._floor(w))
        _, indices = tfgc.ops.top_k_abs(score, self.num_selected(x.shape))
        root = C.importance.root_worker(key[1], info.num_peers)
        return C.importance.IndexPayload(
            root, tf.sort(indices)
        ), C.importance._Context(x.shape, x.dtype, flat, None, state)


class CurrentGradient(_Generic, C.ImportancePruning):
    """An experiment, not part of tfgc: ranks by this step's gradient,
    |g| / (|w| + floor), and sends acc at those positions, where
    `ImportancePruning` ranks by acc itself. `ErrorFeedback` hands the
    compressor only acc; `_compress` below passes g along for this class."""

    def compress(self, x, state, key, info=None):
        flat = tf.reshape(x, [-1])
        w = tf.reshape(tf.cast(info.variable, tf.float32), [-1])
        g = tf.reshape(tf.cast(self.current, tf.float32), [-1])
        score = g / (tf.abs(w) + self._floor(w))
        _, indices = tfgc.ops.top_k_abs(score, self.num_selected(x.shape))
        root = C.importance.root_worker(key[1], info.num_peers)
        return C.importance.IndexPayload(
            root, tf.sort(indices)
        ), C.importance._Context(x.shape, x.dtype, flat, None, state)


_generic_compress = ErrorFeedback.compress


def _compress(self, x, state, key, info=None):
    if isinstance(self.compressor, CurrentGradient):
        self.compressor.current = x  # traced in turn, tensor by tensor
    return _generic_compress(self, x, state, key, info)


ErrorFeedback.compress = _compress
_generic_decompress = ErrorFeedback.decompress


def _decompress(self, reduced, ctx):
    if not isinstance(self.compressor, ZeroingResidual):
        return _generic_decompress(self, reduced, ctx)
    total, inner = self.compressor.decompress(reduced, ctx.inner)
    indices = ctx.inner.indices
    flat = tf.reshape(ctx.corrected, [-1])
    zeros = tf.zeros(tf.shape(indices), flat.dtype)
    residual = tf.tensor_scatter_nd_update(flat, indices[:, None], zeros)
    shape = tf.shape(ctx.corrected)
    return total, ErrorFeedbackState(tf.reshape(residual, shape), inner)


ErrorFeedback.decompress = _decompress

FACTORIES = {
    "dense": lambda d, kw: C.Identity(),
    "topk": lambda d, kw: C.TopK(d, **kw),
    "mstopk": lambda d, kw: C.MSTopK(d, **kw),
    "importance": lambda d, kw: C.ImportancePruning(d, **kw),
    "importance_generic": lambda d, kw: GenericImportance(d, **kw),
    "stale_first": lambda d, kw: StaleFirst(d, **kw),
    "importance_zeroing": lambda d, kw: ZeroingResidual(d, **kw),
    "importance_unfused": lambda d, kw: UnfusedRatio(d, **kw),
    "current_gradient": lambda d, kw: CurrentGradient(d, **kw),
}
DENSITY = 0.01


def parse_run(text: str):
    """`name[@density][:k=v,...]` -> (name, density, kwargs)."""
    head, _, args = text.partition(":")
    name, _, density = head.partition("@")
    if name not in FACTORIES:
        raise ValueError(f"unknown compressor {name!r}: {sorted(FACTORIES)}")
    kwargs = {}
    for item in filter(None, args.split(",")):
        k, _, v = item.partition("=")
        kwargs[k] = json.loads(v)
    return name, float(density) if density else DENSITY, kwargs


# --- speed -------------------------------------------------------------------


def speed(args) -> list[str]:
    """The lab's `compressors` stand-in without communication: one worker
    (no strategy), 4 x Dense(2,500) (25.0 M weights), batch 8, plain SGD,
    error feedback on; the median step of `--repeats` steps, every case
    in turn in each repeat, against the floor (Keras's SGD alone). And the
    compress step alone of one 25 M tensor (error feedback, one worker:
    compress, the next round, decompress)."""
    import compressor_overhead

    from tfgc.core.compressor import StepInfo

    runs = [("floor", None)] + [
        (text, parse_run(text)) for text in args.runs.split()
    ]
    steps = {
        text: compressor_overhead.step_function(
            None if parsed is None else FACTORIES[parsed[0]](*parsed[1:])
        )
        for text, parsed in runs
    }
    times = _common.timeit_interleaved(steps, args.repeats)
    n = 25_000_000
    rng = np.random.default_rng(0)
    g = tf.constant(rng.standard_normal(n).astype("float32"))
    w = tf.constant(rng.standard_normal(n).astype("float32") * 0.05)
    key = tf.constant([0, 5], tf.int64)

    def pipeline(compressor):
        ef = ErrorFeedback(compressor)
        state = ef.init_state((n,), tf.float32, key)

        @tf.function
        def run_once(g, w, state):
            if compressor.spec.reads_step_info:
                payload, ctx = ef.compress(g, state, key, StepInfo(w, 0, 1))
                for _ in compressor.spec.collectives[1:]:
                    payload, ctx = ef.next_round(payload, ctx)
            else:
                payload, ctx = ef.compress(g, state, key)
            return ef.decompress(payload, ctx)

        return lambda: run_once(g, w, state)

    @tf.function
    def one_pass(g, w):
        return g + w

    pipes = {"one pass (g + w)": lambda: one_pass(g, w)}
    for text, parsed in runs[1:]:
        name, d, kwargs = parsed
        if name != "dense":
            pipes[text] = pipeline(FACTORIES[name](d, kwargs))
    pipe_times = _common.timeit_interleaved(
        pipes, args.repeats, fetch_below=10**6
    )
    floor = times["floor"]
    lines = [
        "| run | step (ms) | over the floor (ms) |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v:.1f} | {v - floor:.1f} |" for k, v in times.items()]
    lines += [
        "",
        "Compress step of one 25 M tensor (error feedback, one worker):",
        "",
        "| run | ms |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.1f} |" for k, v in pipe_times.items()]
    return lines


def summary(trace: dict) -> list[str]:
    lines = [
        "| tensor | steps | held | residual age max / p99 / mean | "
        "max age landed | |res| / |w| max | |res| / |g| max | "
        "largest landing / |g| |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path, rows in trace.items():
        for lo, hi in _windows(len(rows)):
            part = rows[lo:hi]
            lines.append(
                f"| {path} | {lo + 1}-{hi} | "
                f"{np.mean([r['held'] for r in part]):.0%} | "
                f"{max(r['age_max'] for r in part)} / "
                f"{np.mean([r['age_p99'] for r in part]):.0f} / "
                f"{np.mean([r['age_mean'] for r in part]):.1f} | "
                f"{max(r['landed_age_max'] for r in part)} | "
                f"{max(r['res_over_w'] for r in part):.2f} | "
                f"{max(r['res_over_g'] for r in part):.1f} | "
                f"{max(r['landed_norm_over_g'] for r in part):.1f} |"
            )
    return lines


def _windows(n: int):
    edges = sorted({0, n // 4, n // 2, n})
    return list(zip(edges[:-1], edges[1:]))


def _rounded(value):
    """`value` with every float to 4 significant digits (the traces)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _label(text: str, seed: int) -> str:
    return text if seed == 0 else f"{text} seed {seed}"


def _header(title: str, argv, text: str) -> str:
    command = shlex.join(argv if argv is not None else sys.argv[1:])
    cpu = _common.cpu_model() if hasattr(_common, "cpu_model") else ""
    return (
        f"# Importance pruning study: {title}\n\n{' '.join(text.split())}\n\n"
        f"Command: `python benchmarks/importance_study.py {command}`; "
        f"machine: {cpu or platform.machine()}, {os.cpu_count()} cores, "
        f"TensorFlow {tf.__version__}, compiled ops "
        f"{'on' if tfgc.ops.using_custom_ops() else 'off'}.\n"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task", choices=sorted(TASKS) + ["speed"], default="bigram"
    )
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--runs", default="dense topk mstopk importance importance@0.017"
    )
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--init", type=int, default=1)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    if args.task == "speed":
        lines = speed(args)
        print("\n".join(lines))
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "importance_speed.md"), "w") as f:
            f.write(_header("speed", argv, speed.__doc__) + "\n")
            f.write("\n".join(lines))
            f.write("\n")
        return 0
    task = TASKS[args.task](args)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    results = {}
    for seed in [int(v) for v in args.seeds.split(",")]:
        for text in args.runs.split():
            name, density, kwargs = parse_run(text)
            label = _label(text, seed)
            results[label] = run(
                task,
                strategy,
                FACTORIES[name](density, kwargs),
                seed=seed,
                trace=args.trace,
            )
            r = results[label]
            print(
                f"[importance_study] {args.task} {label}: {task['metric']} "
                f"{r['metric']:.4f}, train {r['final_train_loss']:.4f}, "
                f"identical {r['workers_identical']}, compression "
                f"{r['compression']:.0f}x, {r['seconds']:.0f} s",
                flush=True,
            )
            if "trace" in r:
                print("\n".join(summary(r["trace"])), flush=True)
    seeds = [int(v) for v in args.seeds.split(",")]
    lines = [
        _header(
            args.task,
            argv,
            f"{task['description']}; {task['steps']} steps; two workers; "
            f"seeds {args.seeds}: {task['seeds']}. x dense: against dense "
            "of the same seed. Final train loss: the mean of the last tenth "
            "of the steps (with --trace; else of the last 50-step chunk).",
        ),
        f"| run | {task['metric']} | x dense | final train loss | workers "
        "bit-identical | compression over the run |",
        "|---|---|---|---|---|---|",
    ]
    for text in args.runs.split():
        rows = [results[_label(text, seed)] for seed in seeds]
        dense = [results.get(_label("dense", seed)) for seed in seeds]
        ratios = (
            ", ".join(
                f"{r['metric'] / d['metric']:.3f}" for r, d in zip(rows, dense)
            )
            if all(dense)
            else ""
        )
        metrics = ", ".join(f"{r['metric']:.4f}" for r in rows)
        train = ", ".join(f"{r['final_train_loss']:.4f}" for r in rows)
        identical = all(r["workers_identical"] for r in rows)
        lines.append(
            f"| {text} | {metrics} | {ratios} | {train} | {identical} | "
            f"{rows[0]['compression']:.0f}x |"
        )
    for label, r in results.items():
        if "trace" in r:
            lines += ["", f"## Residual trace: {label}", ""]
            lines += summary(r["trace"])
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"importance_study_{args.task}{args.tag}")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(_rounded(results), f)
    print(f"wrote {stem}.md, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
