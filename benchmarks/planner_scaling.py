"""The planner's cost model beyond the lab: 2 to 128 workers, pipelined.

The lab measures 2, 3 and 4 hosts (`python -m benchmarks.run --preset
costmodel`, `--preset planner`). This script asks what the planner
(`compressor="auto"`) predicts and chooses for the lab's `standin-compute`
stand-in (6 buckets of 16 MiB) on 2 to 128 workers, against a simulated
step whose parts are each fitted or measured:

- The network: TensorFlow's ring collectives with the lab's fitted costs
  (`cost_model.fitted` of docs/benchmarks/costmodel.json, from
  `benchmarks/lab/cost_fit.py`: alpha per ring step of tfgc's all-reduce
  and all-gather, the hosts' time per byte, header bytes). On n workers an
  all-reduce of B bytes per worker takes 2(n-1) alpha + 2(n-1)/n B h
  (8/rate + host), an all-gather (n-1) (alpha + B h (8/rate + host)). The
  planner measures the collectives and draws a line through two sizes; a
  ring's time is a line in B at every n, so the simulation takes that
  line as the planner's. How well a ring describes real collectives is
  the lab's held-out check (docs/benchmarks/costmodel.md), not this one's.
- Each candidate's compute on this device, per bucket: compress with
  error feedback and decompress what n workers send. The truth is timed
  with n distinct payloads (this worker's and n-1 of random positions and
  heavy-tailed values); the planner's model is its fit from two small
  workloads with its own payload stacked n times (`codec_timing.
  measure_codec`); the one-payload fit is what it measured before it
  counted the peers.
- The backward pass: forward and backward of the stand-in timed here (one
  process, both cores), the backward split over the buckets by their
  parameters (equal Dense layers).
- The step: one device runs the backward pass and every codec, a bucket's
  codec as soon as its gradients exist (before the next layer's, as on
  one CPU or one GPU compute stream); the wire carries one bucket at a
  time in exchange order, each once it is compressed. A plan's units are
  joined into exchange buckets as the planner joins them (`auto_plan.
  join`: ACP-SGD's neighbouring units travel in one bucket), and each
  joined bucket is priced whole. Decompression is
  counted with compression, before the wire: the device's work is the
  same, only the last bucket's order differs.

Per worker count, link rate and plan (each candidate in every bucket, and
the planner's choice): the simulated step; the planner's predicted step
as `plan_report()` computes it (the step's ready times with the predicted
exchanges through `pipelined_seconds`) and its error; whether the
planner chose the fastest simulated plan. Writes
`docs/benchmarks/planner_scaling.{md,json,png}`.

    python benchmarks/planner_scaling.py
    python benchmarks/planner_scaling.py --workers 2,8,32 --rates 1gbit
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import tfgc  # noqa: E402
from benchmarks._common import timeit  # noqa: E402
from benchmarks.lab import worker as lab_worker  # noqa: E402
from benchmarks.lab.netns import parse_rate  # noqa: E402
from tfgc.communicators import topology as topology_lib  # noqa: E402
from tfgc.core import bucket_costs  # noqa: E402
from tfgc.core.bucket_costs import CodecCosts, CollectiveCosts, Line  # noqa: E402
from tfgc.core.wire import ALL_GATHER, num_elements  # noqa: E402
from tfgc.optimizers import auto_plan, codec_timing, planning  # noqa: E402

OUT = os.path.join(REPO, "docs", "benchmarks")
COSTS = os.path.join(OUT, "costmodel.json")
MODEL = "standin-compute"
BUCKET_BYTES = 25 * 2**20
REPEATS = 5


def ring(fitted: dict, workers: int, rate_bits: float) -> CollectiveCosts:
    """tfgc's collectives on `workers` in a ring, by the lab's fit."""
    n = workers
    per_byte = fitted["header_overhead"] * (
        8 / rate_bits + fitted["host_byte_time"]
    )
    alpha = fitted["latency"]
    return CollectiveCosts(
        all_reduce=Line(
            2 * (n - 1) * alpha["tfgc all_reduce"], 2 * (n - 1) / n * per_byte
        ),
        all_gather=Line((n - 1) * alpha["tfgc all_gather"], (n - 1) * per_byte),
    )


def communicator_of(workers: int):
    """The default communicator as on `workers` workers (one per host)."""
    communicator = tfgc.communicators.get("auto")
    communicator.build(
        topology_lib.Topology(
            tuple(range(workers)), ("/device:CPU:0",), "planner-scaling"
        )
    )
    return communicator


def distinct_peers(shapes, seed: int):
    """`codec_seconds`'s `from_peers`: this worker's gathered payload and
    n-1 others of random positions (in the tensor) and values."""
    rng = np.random.default_rng(seed)

    def from_peers(received, kinds, peers):
        out = []
        for payload, kind, shape in zip(received, kinds, shapes):
            if kind == ALL_GATHER:
                size = num_elements(shape)

                def stack(t, size=size):
                    shape = (peers - 1,) + tuple(t.shape[1:])
                    if t.dtype.is_integer:
                        other = rng.integers(0, size, shape)
                    else:
                        other = rng.standard_t(3, shape)
                    return tf.concat([t, tf.constant(other, t.dtype)], 0)

                payload = tf.nest.map_structure(stack, payload)
            out.append(payload)
        return out

    return from_peers


def backward(model, x, y, loss_fn) -> tuple[float, float]:
    """(forward, backward) seconds of one local step, medians."""

    @tf.function
    def forward():
        return loss_fn(y, model(x, training=True))

    @tf.function
    def both():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)[0]

    f = timeit(forward, REPEATS) / 1e3
    return f, max(timeit(both, REPEATS) / 1e3 - f, 0.0)


def simulate(start, gaps, codec, wire) -> tuple[float, list[float]]:
    """(step seconds, each bucket's ready time): one device runs the
    backward gaps and each bucket's codec after its gap; the wire one
    bucket at a time, each once compressed."""
    device = start
    wire_free = 0.0
    ready = []
    for gap, c, w in zip(gaps, codec, wire):
        device += gap
        ready.append(device)
        device += c
        wire_free = max(wire_free, device) + w
    return max(device, wire_free), ready


class Setting(NamedTuple):
    """One worker count and link rate, as the simulation sees it.

    Attributes:
        settings: the planner's settings (`planning.Settings`).
        communicator: the default communicator on `workers` workers.
        collectives: the ring's collective costs at `rate`.
        codecs: per candidate, the planner's codec model.
        one_payload: the same from codecs timed on one payload.
        truth: per candidate, per unit, its codec's seconds timed with
            distinct payloads.
    """

    workers: int
    rate: str
    settings: planning.Settings
    communicator: object
    collectives: CollectiveCosts
    codecs: tuple
    one_payload: tuple
    truth: list

    def choices(self, variables, units, codecs, joins=True) -> list[int]:
        """The planner's choice per unit with the codec model `codecs`
        (`joins=False`: each unit priced alone, as the planner chose
        before it priced joins)."""
        args = (self.communicator, self.collectives, codecs)
        per_unit = auto_plan.choose(self.settings, variables, units, *args)
        if not joins:
            return [b.choice for b in per_unit]
        return auto_plan.choose_joined(
            self.settings, variables, units, *args, per_unit
        )


def plan_row(setting: Setting, name, plan, variables, units, start, gaps):
    """The simulated and predicted step of `plan` (a candidate per unit),
    its units joined into exchange buckets as the planner joins them."""
    joined = auto_plan.join(
        setting.settings, variables, units, plan, setting.communicator
    )
    free = [CodecCosts(0.0, 0.0)] * len(setting.codecs)

    def price(group, codecs, c):
        seconds, _, compute = auto_plan.price(
            setting.settings, variables, group, setting.communicator,
            setting.collectives, codecs,
        )  # fmt: skip
        return seconds[c], compute[c]

    bucket_gaps, codec, wire, model, one_payload = [], [], [], [], []
    first = 0
    for group, c, count in joined:
        members = range(first, first + count)
        first += count
        bucket_gaps.append(sum(gaps[u] for u in members))
        codec.append(sum(setting.truth[c][u] for u in members))
        wire.append(price(group, free, c)[0])
        model.append(price(group, setting.codecs, c))
        one_payload.append(price(group, setting.one_payload, c))
    step, ready = simulate(start, bucket_gaps, codec, wire)

    def predicted(prices):
        exchange, compute = zip(*prices)
        end = bucket_costs.pipelined_seconds(ready, exchange, compute)
        return max(end, ready[-1])

    return {
        "workers": setting.workers,
        "rate": setting.rate,
        "plan": name,
        "buckets": len(joined),
        "simulated_s": step,
        "predicted_s": predicted(model),
        "predicted_one_payload_s": predicted(one_payload),
        "codec_truth_s": sum(codec),
        "codec_model_s": sum(compute for _, compute in model),
        "wire_s": sum(wire),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="2,3,4,8,16,32,64,128")
    parser.add_argument("--rates", default="1gbit,10gbit")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    if min(counts) < 2:
        parser.error(f"--workers must be 2 or more. Received: {args.workers}")
    rates = args.rates.split(",")
    with open(COSTS) as f:
        fitted = json.load(f)["cost_model"]["fitted"]

    tf.keras.utils.set_random_seed(0)
    model, x, y, loss_fn = lab_worker.build(MODEL, np.random.default_rng(0))
    variables = model.trainable_variables
    groups = auto_plan.buckets(variables, BUCKET_BYTES)
    forward_s, backward_s = backward(model, x, y, loss_fn)
    params = [sum(num_elements(variables[i].shape) for i in g) for g in groups]
    gaps = [backward_s * p / sum(params) for p in params]
    print(
        f"[scaling] {MODEL}: {len(groups)} buckets; forward "
        f"{1e3 * forward_s:.1f} ms, backward {1e3 * backward_s:.1f} ms",
        flush=True,
    )
    auto = tfgc.compressors.Auto()
    labels = auto_plan.labels(auto.candidates)

    def settings(communicator):
        return planning.Settings(auto, communicator, True, 1024, 0, 1)

    def model_codecs(workers):
        communicator = communicator_of(workers)
        return [
            codec_timing.measure_codec(
                settings(communicator), c, communicator, communicator.topology
            )
            for c in auto.candidates
        ]

    def truth_codecs(workers):
        communicator = communicator_of(workers)
        timed = {}
        for c, candidate in enumerate(auto.candidates):
            for g in groups:
                shapes = tuple(tuple(variables[i].shape) for i in g)
                if (c, shapes) not in timed:
                    timed[c, shapes] = codec_timing.codec_seconds(
                        settings(communicator),
                        candidate,
                        shapes,
                        communicator,
                        communicator.topology,
                        distinct_peers(shapes, workers),
                    )
        return [
            [
                timed[c, tuple(tuple(variables[i].shape) for i in g)]
                for g in groups
            ]
            for c in range(len(auto.candidates))
        ]

    one_payload = model_codecs(1)
    rows = []
    for workers in counts:
        t0 = time.perf_counter()
        codecs, truth = model_codecs(workers), truth_codecs(workers)
        communicator = communicator_of(workers)
        for rate in rates:
            setting = Setting(
                workers,
                rate,
                settings(communicator),
                communicator,
                ring(fitted, workers, parse_rate(rate)),
                tuple(codecs),
                tuple(one_payload),
                truth,
            )
            plans = [
                (label, [c] * len(groups)) for c, label in enumerate(labels)
            ] + [
                ("auto", setting.choices(variables, groups, codecs)),
                (
                    "auto, one-payload model",
                    setting.choices(variables, groups, one_payload),
                ),
                (
                    "auto, units priced alone",
                    setting.choices(variables, groups, codecs, joins=False),
                ),
            ]
            mine = [
                plan_row(
                    setting, name, plan, variables, groups, forward_s, gaps
                )
                for name, plan in plans
            ]
            best = min(r["simulated_s"] for r in mine)
            for r, (_, plan) in zip(mine, plans):
                r["choices"] = [labels[c] for c in plan]
                r["vs_best"] = r["simulated_s"] / best
            rows += mine
            auto_row = next(r for r in mine if r["plan"] == "auto")
            print(
                f"[scaling] {workers} workers, {rate}: auto "
                f"{'/'.join(sorted(set(auto_row['choices'])))} "
                f"{auto_row['vs_best']:.2f}x the best simulated plan",
                flush=True,
            )
        print(f"[scaling] {workers} workers: {time.perf_counter() - t0:.0f} s")
    result = {
        "command": " ".join(
            ["python benchmarks/planner_scaling.py"]
            + (argv if argv is not None else sys.argv[1:])
        ),
        "model": MODEL,
        "forward_s": forward_s,
        "backward_s": backward_s,
        "network": fitted,
        "rows": rows,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "planner_scaling.json"), "w") as f:
        json.dump(result, f, indent=1)
    write_report(result, args.out)
    return 0


def write_report(result: dict, out: str) -> None:
    rows = result["rows"]
    lines = [
        "# The planner from 2 to 128 workers (simulated)",
        "",
        f"Command: `{result['command'].strip()}`. Model `{result['model']}`:"
        f" forward {1e3 * result['forward_s']:.1f} ms, backward "
        f"{1e3 * result['backward_s']:.1f} ms on this machine. Network: the "
        "lab's fitted ring (docs/benchmarks/costmodel.json). How each part "
        "is measured: the docstring of benchmarks/planner_scaling.py.",
        "",
        "simulated: the step with each codec's compute timed on distinct "
        "payloads; predicted: the planner's model (`plan_report()`'s "
        "prediction); one-payload: the same with codecs timed on one "
        "payload; vs best: simulated step / the fastest simulated plan's.",
        "",
    ]
    for rate in dict.fromkeys(r["rate"] for r in rows):
        lines += [
            f"## {rate}",
            "",
            "| workers | plan | buckets | simulated ms | predicted ms | "
            "error | one-payload ms | error | codec ms (truth / model) | "
            "wire ms | vs best |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if r["rate"] != rate:
                continue
            sim = r["simulated_s"]
            name = r["plan"]
            if name.startswith("auto"):
                name += f" ({'/'.join(sorted(set(r['choices'])))})"
            lines.append(
                f"| {r['workers']} | {name} | {r['buckets']} | "
                f"{1e3 * sim:,.1f} | "
                f"{1e3 * r['predicted_s']:,.1f} | "
                f"{100 * (r['predicted_s'] - sim) / sim:+.0f} % | "
                f"{1e3 * r['predicted_one_payload_s']:,.1f} | "
                f"{100 * (r['predicted_one_payload_s'] - sim) / sim:+.0f} % | "
                f"{1e3 * r['codec_truth_s']:,.1f} / "
                f"{1e3 * r['codec_model_s']:,.1f} | "
                f"{1e3 * r['wire_s']:,.1f} | {r['vs_best']:.2f}x |"
            )
        lines.append("")
    with open(os.path.join(out, "planner_scaling.md"), "w") as f:
        f.write("\n".join(lines))
    plot(rows, os.path.join(out, "planner_scaling.png"))


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(dict.fromkeys(r["rate"] for r in rows))
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5))
    axes = np.atleast_1d(axes)
    for ax, rate in zip(axes, rates):
        mine = [r for r in rows if r["rate"] == rate]
        for name in dict.fromkeys(r["plan"] for r in mine):
            if name == "auto, one-payload model":
                continue
            pts = [r for r in mine if r["plan"] == name]
            style = {
                "auto": {"lw": 3, "color": "k"},
                "auto, units priced alone": {"ls": "--", "color": "grey"},
            }.get(name, {})
            ax.plot(
                [r["workers"] for r in pts],
                [1e3 * r["simulated_s"] for r in pts],
                marker="o",
                label=name,
                **style,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers")
        ax.set_ylabel("simulated step (ms)")
        ax.set_title(f"{rate}: each candidate everywhere, and auto")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
