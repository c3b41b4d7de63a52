"""SBC's two sparsities traded against each other on the LSTM LM.

Sparse Binary Compression claims a smooth trade-off between gradient
sparsity (the density of each update) and temporal sparsity (the
communication delay: local steps per round). This sweep trains the
convergence benchmark's `lstm_ptb` task (benchmarks/convergence_benchmark.py:
Zaremba et al.'s "small" LSTM LM on the PTB subset, two workers) for the
same number of steps with dense fp32 and with SBC at every pair of
`--densities` and `--delays` (default 1 % and 0.1 %, delay 1, 2, 4 and 8),
error feedback on, and records each run's test perplexity against the
total bits one worker sent over the run (payloads and overhead, every step
counted). Writes `sbc_sweep.json`, `sbc_sweep.md` and the plot
`sbc_sweep.png` (bits per worker, log scale, against perplexity; one line
per density through its delays) to `--out` (docs/benchmarks/), after every
run, so that a cut-short sweep keeps what it measured:

    python benchmarks/sbc_sweep.py
    python benchmarks/sbc_sweep.py --steps 20 --tiny --out /tmp/sweep
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common  # noqa: E402
import convergence_benchmark as cb  # noqa: E402  (sets up the CPUs first)

import tfgc  # noqa: E402

plt = cb.plt

DENSITIES = (0.01, 0.001)
DELAYS = (1, 2, 4, 8)
STEPS = 1500


def _floats(text: str, name: str, parser) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v]
    except ValueError:
        parser.error(f"--{name} takes a comma list of numbers; got {text!r}")
    if not values:
        parser.error(f"--{name} is empty")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--densities",
        default=",".join(f"{d:g}" for d in DENSITIES),
        help="SBC densities, a comma list of numbers in (0, 1]",
    )
    parser.add_argument(
        "--delays",
        default=",".join(map(str, DELAYS)),
        help="communication delays, a comma list of integers >= 1",
    )
    parser.add_argument(
        "--steps", type=int, default=STEPS, help="steps per run (>= 1)"
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny LSTM and batch: a check that the sweep runs",
    )
    parser.add_argument(
        "--out", default=os.path.join(cb.REPO, "docs", "benchmarks")
    )
    return parser


def _label(density: float, delay: int) -> str:
    return f"SBC {density:.1%} delay {delay}"


def plot(runs: dict, path: str) -> None:
    """Perplexity against the bits a worker sent, one line per density."""
    fig, ax = plt.subplots(figsize=(8, 5))
    dense = runs.get("dense")
    if dense is not None:
        ax.axhline(
            dense["test_metric"], color="black", linewidth=1.2,
            linestyle="--", label="dense fp32",
        )  # fmt: skip
    by_density: dict[float, list[dict]] = {}
    for run in runs.values():
        if "density" in run:
            by_density.setdefault(run["density"], []).append(run)
    for density, points in sorted(by_density.items(), reverse=True):
        points.sort(key=lambda r: r["delay"])
        bits = [r["bits_per_worker"] for r in points]
        perplexity = [r["test_metric"] for r in points]
        ax.plot(bits, perplexity, marker="o", label=f"SBC {density:.1%}")
        for r in points:
            ax.annotate(
                f"delay {r['delay']}", (r["bits_per_worker"], r["test_metric"]),
                textcoords="offset points", xytext=(4, 4), fontsize=8,
            )  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("bits sent per worker over the run (log scale)")
    ax.set_ylabel("test perplexity")
    ax.set_title("SBC on the LSTM LM: gradient vs temporal sparsity")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(sweep: dict) -> str:
    meta, runs = sweep["meta"], sweep["runs"]
    dense = runs.get("dense", {}).get("test_metric")
    lines = [
        "# SBC: gradient sparsity against temporal sparsity",
        "",
        f"{sweep['description']}; {sweep['steps']} steps per run, two "
        "workers (MirroredStrategy, two logical CPUs), the same seed and "
        "data order for every run, error feedback on. Bits per worker: "
        "everything one worker sent over the run (payloads and overhead; "
        "SBC's payload is one value, a count and the Golomb-coded "
        "positions). One seed.",
        "",
        cb.provenance(meta),
        "",
        "![perplexity against bits per worker](sbc_sweep.png)",
        "",
        "| run | rounds | test perplexity | x dense | bits per worker | "
        "compression factor over the run | bits per position (formula) | "
        "seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        label = "dense fp32" if name == "dense" else name
        bits = ""
        if "bits_per_position" in run:
            bits = f"{run['bits_per_position']:.2f} ({run['bits_formula']:.2f})"
        versus = f"{run['test_metric'] / dense:.3f}" if dense else ""
        lines.append(
            f"| {label} | {run['rounds']:,} | {run['test_metric']:.1f} | "
            f"{versus} | {run['bits_per_worker']:.3g} | "
            f"{run['run_compression_ratio']:,.0f}x | {bits} | "
            f"{run['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _write(out: str, sweep: dict) -> None:
    path = os.path.join(out, "sbc_sweep")
    os.makedirs(out, exist_ok=True)
    plot(sweep["runs"], path + ".png")
    _common.write_results(path, sweep, markdown(sweep))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    densities = _floats(args.densities, "densities", parser)
    if not all(0 < d <= 1 for d in densities):
        parser.error(f"--densities must lie in (0, 1]; got {args.densities}")
    delays = _floats(args.delays, "delays", parser)
    if not all(d >= 1 and d == int(d) for d in delays):
        parser.error(f"--delays must be integers >= 1; got {args.delays}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1; got {args.steps}")
    task = cb.TASKS["lstm_ptb"](args.tiny)
    meta = _common.machine_meta(1)
    del meta["repeats"], meta["unit"]
    meta["command"] = shlex.join(["python", "benchmarks/sbc_sweep.py", *argv])
    sweep = {
        "description": task["description"],
        "steps": args.steps,
        "meta": meta,
        "runs": {},
    }
    configs = [("dense", None, None)] + [
        (_label(d, int(t)), d, int(t)) for d in densities for t in delays
    ]
    begin = time.perf_counter()
    for i, (name, density, delay) in enumerate(configs, 1):
        print(
            f"[sbc sweep] run {i}/{len(configs)}: {name}, {args.steps} steps "
            f"({time.perf_counter() - begin:.0f} s in)",
            flush=True,
        )
        make = cb.COMPRESSORS["dense"][1]
        if density is not None:

            def make(_density, _momentum, density=density, delay=delay):
                return tfgc.compressors.SBC(density, delay=delay)

        run = cb.train(task, make, args.steps, name)
        del run["losses"]
        run["rounds"] = args.steps // (delay or 1)
        run["bits_per_worker"] = 8 * run["run_mean_bytes"] * args.steps
        if density is not None:
            run["density"], run["delay"] = density, delay
        sweep["runs"][name] = run
        print(f"    {run}", flush=True)
        meta["wall_seconds"] = time.perf_counter() - begin
        meta["load_average"] = os.getloadavg()
        meta["complete"] = i == len(configs)
        _write(args.out, sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
