"""What a compressor adds to a training step on one worker, without a
network: the lab's `compressors` stand-in (4 x Dense(2,500), 25.0 M
weights, batch 8, plain SGD; benchmarks/lab/worker.py) trained through
`tfgc.CompressedOptimizer` with error feedback, against the floor (Keras's
SGD alone). The median step of `--repeats`, every run in turn in each
repeat, so that a slow spell of a shared machine slows all alike.

Runs are `name[@density][:key=value,...]` (a `tfgc.compressors.get` name
and its arguments, values as JSON); a trailing `!generic` takes
ErrorFeedback's generic path (add, compress, local estimate, subtract)
where the compressor has a fused one (`compress_with_residual`), to show
what the fused path saves. With `--profile`, TensorFlow's profiler then
records a few steps of each run and the files also say where the time
went: per part of the step (forward, backward, exchange, the rest of the
optimizer) and op type, the milliseconds per step its ops ran, summed over
the executor's threads. Writes `--out`.md and .json:

    python benchmarks/compressor_overhead.py \\
        --runs 'topk@0.001 sbc@0.001 sbc@0.001!generic'
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from lab import worker as lab_worker  # noqa: E402

import tfgc  # noqa: E402

GENERIC = "!generic"


def parse_run(text: str):
    """`name[@density][:k=v,...][!generic]` -> (name, kwargs, generic)."""
    generic = text.endswith(GENERIC)
    text = text[: -len(GENERIC)] if generic else text
    head, _, args = text.partition(":")
    name, _, density = head.partition("@")
    kwargs = {}
    if density:
        kwargs["density"] = float(density)
    for item in filter(None, args.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = json.loads(value)
    return name, kwargs, generic


def compressor(name: str, kwargs: dict, generic: bool):
    made = tfgc.compressors.get(name, **kwargs)
    if generic:
        # The instance only: ErrorFeedback then adds, compresses and
        # subtracts the local estimate itself.
        made.compress_with_residual = lambda *args: None
    return made


def step_function(compressor_=None):
    """A tf.function of one training step of the stand-in, through
    `tfgc.CompressedOptimizer` with `compressor_`, or Keras's SGD alone
    (the floor) without one."""
    keras.utils.set_random_seed(0)
    model, x, y, loss_fn = lab_worker.build("standin", np.random.default_rng(1))
    x, y = tf.constant(x), tf.constant(y)
    sgd = keras.optimizers.SGD(lab_worker.LEARNING_RATE)
    if compressor_ is None:
        optimizer = sgd
    else:
        optimizer = tfgc.CompressedOptimizer(sgd, compressor=compressor_)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        optimizer.apply(grads, variables)
        return loss

    return step


def _seconds(fn) -> float:
    """Wall seconds of one call of `fn`."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _profiled_ops(logdir: str):
    """(op name, milliseconds) of every op the executor's threads ran in
    the profile written to `logdir`."""
    for event in _common.profile_events(logdir):
        # "scope/name:OpType"; not the executor's own events
        # ("ExecutorState::Process"), which span the ops.
        name = event.name
        if (
            event.line.startswith("tf_Compute")
            and ":" in name
            and "::" not in name
        ):
            yield name, (event.end - event.start) / 1e9


def part_of(op_name: str) -> str:
    """The part of a training step that the op `op_name` belongs to."""
    if "tfgc_bucket_" in op_name or "tfgc_exchange" in op_name:
        return "exchange"
    if op_name.startswith("gradient_tape/"):
        return "backward"
    if op_name.startswith("functional"):
        return "forward"
    return "optimizer"


#: Steps `--profile` records of each run.
PROFILED_STEPS = 5


def op_times(step, steps: int = PROFILED_STEPS) -> dict[str, float]:
    """Per "part/op type" (`part_of`), the milliseconds per step that
    `step()`'s ops ran over `steps` profiled steps, summed over threads
    (ops that ran side by side both count), largest first."""
    step()  # traced and warm
    totals = collections.Counter()
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(steps):
                step()
        finally:
            tf.profiler.experimental.stop()
        for name, ms in _profiled_ops(logdir):
            totals[f"{part_of(name)}/{name.rsplit(':', 1)[1]}"] += ms / steps
    return dict(totals.most_common())


def profile_lines(profiles: dict[str, dict[str, float]], rows: int) -> list:
    """Markdown: per run, its `rows` largest op types and the total."""
    lines = [
        "",
        "## Where the time went (`--profile`)",
        "",
        "Milliseconds per step that each part's ops of a type ran, summed "
        "over the executor's threads (so ops that ran side by side both "
        f"count), over {PROFILED_STEPS} profiled steps; the largest per run, "
        "then the total of all.",
    ]
    for name, times in profiles.items():
        lines += ["", f"**{name}**", "", "| part/op | ms / step |", "|---|---|"]
        for op, ms in list(times.items())[:rows]:
            lines.append(f"| {op} | {ms:.2f} |")
        lines.append(f"| all | {sum(times.values()):.2f} |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="topk@0.001 sbc@0.001")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile each run: op time per step by part and op type",
    )
    parser.add_argument(
        "--out",
        default=os.path.join(HERE, "results", "compressor_overhead"),
    )
    args = parser.parse_args(argv)
    runs = args.runs.split()
    for text in runs:
        try:
            compressor(*parse_run(text))
        except (ValueError, TypeError) as e:
            parser.error(f"--runs: {text!r}: {e}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    steps = {"floor": step_function()}
    steps.update(
        {text: step_function(compressor(*parse_run(text))) for text in runs}
    )
    first_call = {name: _seconds(fn) for name, fn in steps.items()}
    times = _common.timeit_interleaved(steps, args.repeats)
    floor = times["floor"]
    meta = _common.machine_meta(args.repeats)
    command = shlex.join(["python", "benchmarks/compressor_overhead.py", *argv])
    lines = _common.report_header(
        "Compressor overhead on one worker", __doc__, command, meta
    ) + [
        "",
        "| run | step (ms) | over the floor (ms) | overhead / first run's "
        "| first call (s) |",
        "|---|---|---|---|---|",
    ]
    first = times[runs[0]] - floor if runs else None
    for name, ms in times.items():
        over = ms - floor
        ratio = f"{over / first:.2f}x" if name != "floor" and first else ""
        lines.append(
            f"| {name} | {ms:.1f} | {over:.1f} | {ratio} "
            f"| {first_call[name]:.2f} |"
        )
    lines += [
        "",
        "First call: tracing the step's `tf.function` and running it once "
        "(the floor's also starts TensorFlow's devices).",
    ]
    results = {
        "command": command,
        "meta": meta,
        "median_ms": times,
        "first_call_s": first_call,
    }
    if args.profile:
        results["op_ms"] = {name: op_times(fn) for name, fn in steps.items()}
        lines += profile_lines(results["op_ms"], rows=12)
    _common.write_results(args.out, results, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
