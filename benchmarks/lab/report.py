"""Turns the workers' results into the lab's JSON, markdown and plots."""

from __future__ import annotations

import json
import os
import statistics
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def summarize(per_worker: list[dict], hosts: int, per_host: int, steps: int):
    """One row per case: step times, speed-ups, bytes measured / analytic.

    Bytes are per step and per host link, read on the first worker of each
    host and averaged over hosts. With the workers ordered by host, a
    ring has one edge leaving each host, so a host's link carries what one
    worker sends: the analytic per-worker wire bytes (nothing with one
    host).
    """
    rows = []
    for j, case in enumerate(per_worker[0]["cases"]):
        medians = [w["cases"][j]["median_step_s"] for w in per_worker]
        row = {
            "name": case["name"],
            "kind": case["kind"],
            "median_step_s": case["median_step_s"],  # worker 0
            "slowest_worker_median_s": max(medians),
            "steps_per_s": 1.0 / case["median_step_s"],
        }
        deltas = [
            per_worker[h * per_host]["cases"][j]["counters_delta"]
            for h in range(hosts)
        ]
        if deltas[0] is not None:
            row["measured_tx_bytes"] = statistics.mean(
                d["tx_bytes"] / steps for d in deltas
            )
            row["measured_rx_bytes"] = statistics.mean(
                d["rx_bytes"] / steps for d in deltas
            )
        analytic = case["analytic"]
        if analytic is not None:
            row["analytic_payload_bytes"] = analytic["payload_bytes"]
            wire = analytic["wire_bytes"]
            row["analytic_wire_bytes"] = (
                None if wire is None else (wire if hosts > 1 else 0.0)
            )
        if case["tfgc_stats"]:
            row["tfgc_sent_bytes"] = (
                case["tfgc_stats"]["sent_bytes"]
                + case["tfgc_stats"]["overhead_bytes"]
            )
        if row.get("analytic_wire_bytes") and "measured_tx_bytes" in row:
            row["measured_over_analytic"] = (
                row["measured_tx_bytes"] / row["analytic_wire_bytes"]
            )
        rows.append(row)
    by_kind = {r["name"]: r["median_step_s"] for r in rows}
    for row in rows:
        t = row["median_step_s"]
        row["speedup_vs_fp32"] = by_kind["dense fp32"] / t
        row["speedup_vs_fp16"] = by_kind["dense fp16"] / t
        row["times_floor"] = t / by_kind["no communication"]
        if row["kind"] == "local_compressed":
            row["compression_overhead_s"] = t - by_kind["no communication"]
    return rows


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:,.2f}"


def markdown(results: dict, plots: list[str]) -> str:
    m = results["machine"]
    lines = [
        f"# Benchmark lab: {results['preset'] or 'custom'}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, Linux {m['kernel']}. "
        f"Command: `{results['command']}` ({results['seconds']:.0f} s). "
        f"Load at the end: `{results['uptime']}`.",
        "",
        "Step time: median over the timed steps on worker 0 (all workers "
        "wait for each other's collectives). Bytes: per step, per host "
        "link, sent (veth tx) as measured and as tfgc's payload bytes times "
        "the ring's transport factor (all-reduce 2(n-1)/n, all-gather "
        "n-1); the measurement includes TCP/IP and gRPC headers. "
        "x floor: step time / the no-communication step time.",
    ]
    for run in results["runs"]:
        rate = run["rate"] or "unshaped (localhost)"
        lines += [
            "",
            f"## {run['hosts']} hosts x {run['workers_per_host']} worker(s), "
            f"{rate}, latency {run['latency']}",
            "",
            f"Load average before/after: {run['load_before']} / "
            f"{run['load_after']}; compiled custom ops: {run['custom_ops']}.",
        ]
        for check in run.get("rate_check", []):
            lines.append(
                f"TCP {check['src']} -> {check['dst']}: "
                f"{check['rate_bits'] / 1e6:.0f} Mbit/s."
            )
        lines += [
            "",
            "| case | ms / step | steps / s | vs fp32 | vs fp16 | x floor "
            "| MB sent / step (measured) | MB (analytic) "
            "| measured / analytic |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in run["cases"]:
            ratio = r.get("measured_over_analytic")
            lines.append(
                f"| {r['name']} | {r['median_step_s'] * 1e3:,.1f} | "
                f"{r['steps_per_s']:.2f} | {r['speedup_vs_fp32']:.2f}x | "
                f"{r['speedup_vs_fp16']:.2f}x | {r['times_floor']:.2f} | "
                f"{_mb(r.get('measured_tx_bytes'))} | "
                f"{_mb(r.get('analytic_wire_bytes'))} | "
                f"{'-' if ratio is None else f'{ratio:.3f}'} |"
            )
        overheads = [
            f"{r['name'].split(',')[0]} "
            f"{r['compression_overhead_s'] * 1e3:,.1f} ms"
            for r in run["cases"]
            if "compression_overhead_s" in r
        ]
        if overheads:
            lines += [
                "",
                "Compression overhead (the local step through tfgc minus the "
                "floor's, no communication): " + "; ".join(overheads) + ".",
            ]
    lines.append("")
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _wrap(names: list[str]) -> list[str]:
    # Case names are long ("topk 0.001 +EF, no communication").
    return [textwrap.fill(n, 16) for n in names]


def _label(run: dict) -> str:
    return f"{run['rate'] or 'localhost'}, latency {run['latency']}"


def plot_step_times(results: dict, path: str) -> None:
    runs = results["runs"]
    names = [r["name"] for r in runs[0]["cases"]]
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, run in enumerate(runs):
        xs = [k + i * width for k in range(len(names))]
        ax.bar(
            xs,
            [r["median_step_s"] for r in run["cases"]],
            width,
            label=_label(run),
        )
    ax.set_xticks(
        [k + 0.4 - width / 2 for k in range(len(names))], _wrap(names)
    )
    ax.set_ylabel("median step time (s)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("Step time per case")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_bytes(results: dict, path: str) -> None:
    run = results["runs"][0]
    rows = [r for r in run["cases"] if r.get("analytic_wire_bytes")]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(rows))
    ax.bar(
        [x - 0.2 for x in xs],
        [r["analytic_wire_bytes"] for r in rows],
        0.4,
        label="analytic",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [r.get("measured_tx_bytes", 0) for r in rows],
        0.4,
        label="measured (veth)",
    )
    ax.set_xticks(list(xs), _wrap([r["name"] for r in rows]))
    ax.set_yscale("log")
    ax.set_ylabel("bytes sent per step per host")
    ax.set_title(f"Bytes on the wire ({_label(run)})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_speedup_vs_rate(results: dict, path: str) -> None:
    from benchmarks.lab.netns import parse_rate

    runs = [r for r in results["runs"] if r["rate"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    for j, name in enumerate(r["name"] for r in runs[0]["cases"]):
        rates = [parse_rate(r["rate"]) / 1e9 for r in runs]
        ax.plot(
            rates,
            [r["cases"][j]["speedup_vs_fp32"] for r in runs],
            "o-",
            label=name,
        )
    ax.set_xscale("log")
    ax.set_xlabel("link rate (Gbit/s)")
    ax.set_ylabel("speed-up vs dense fp32")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(results: dict, out: str, stem: str) -> list[str]:
    """Writes `<stem>.json`, `<stem>.md` and the plots into `out`."""
    os.makedirs(out, exist_ok=True)
    plots = [f"{stem}_step_time.png"]
    plot_step_times(results, os.path.join(out, plots[-1]))
    if any(r.get("analytic_wire_bytes") for r in results["runs"][0]["cases"]):
        plots.append(f"{stem}_bytes.png")
        plot_bytes(results, os.path.join(out, plots[-1]))
    if len({r["rate"] for r in results["runs"]}) > 1:
        plots.append(f"{stem}_speedup_vs_rate.png")
        plot_speedup_vs_rate(results, os.path.join(out, plots[-1]))
    paths = [os.path.join(out, f"{stem}.json"), os.path.join(out, f"{stem}.md")]
    with open(paths[0], "w") as f:
        json.dump(results, f, indent=1)
    with open(paths[1], "w") as f:
        f.write(markdown(results, plots))
    return paths + [os.path.join(out, p) for p in plots]
