"""Turns the workers' results into the lab's JSON, markdown and plots."""

from __future__ import annotations

import json
import os
import statistics

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

#: How a compressor's local case (its step without communication) is named.
LOCAL_SUFFIX = ", no communication"
#: How a case in one exchange after the backward pass is named.
UNPIPELINED_SUFFIX = ", unpipelined"
#: How the plan an `auto` case kept, run without its switch, is named.
PLAN_FIXED_SUFFIX = ", its plan fixed"


def _steal(share: float | None) -> str:
    if share is None:  # not measured (no /proc/stat, an older result)
        return ""
    return (
        f"; CPU steal {100 * share:.0f} % (the share of the run's CPU time "
        "the hypervisor gave to others)"
    )


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
        # With a communication delay d, d - 1 of d steps send nothing: the
        # mean over whole rounds is the step time, the median is not.
        mean = case.get("delay", 1) > 1
        row = {
            "name": case["name"],
            "kind": case["kind"],
            "median_step_s": case["median_step_s"],  # worker 0
            "mean_step_s": case.get("mean_step_s"),
            "step_s": case["mean_step_s"] if mean else case["median_step_s"],
            "step_statistic": "mean" if mean else "median",
            "slowest_worker_median_s": max(medians),
        }
        row["steps_per_s"] = 1.0 / row["step_s"]
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
        if case.get("plan"):
            row["plan"] = case["plan"]  # worker 0's; every worker's agree
        if row.get("analytic_wire_bytes") and "measured_tx_bytes" in row:
            row["measured_over_analytic"] = (
                row["measured_tx_bytes"] / row["analytic_wire_bytes"]
            )
        rows.append(row)
    by_kind = {r["name"]: r["step_s"] for r in rows}
    floor = by_kind["no communication"]
    # Every dense configuration a user could pick instead: fp32 with and
    # without MWMS's packs, tfgc's fp16 pipelined and not.
    best_dense = min(
        t for name, t in by_kind.items() if name.startswith("dense")
    )
    for row in rows:
        t = row["step_s"]
        row["speedup_vs_fp32"] = by_kind["dense fp32"] / t
        row["speedup_vs_fp16"] = by_kind["dense fp16"] / t
        row["speedup_vs_best_dense"] = best_dense / t
        row["times_floor"] = t / floor
        if row["kind"] == "local_compressed":
            row["compression_overhead_s"] = t - floor
        serial = by_kind.get(row["name"] + UNPIPELINED_SUFFIX)
        if serial is not None and serial > floor:
            # The unpipelined step is compute + communication (in series);
            # what the buckets save of it is communication hidden.
            row["hidden_share"] = (serial - t) / (serial - floor)
    return rows


def step_s(row: dict) -> float:
    """A row's step time: `step_s`, or the median of results written
    before rows had it."""
    return row.get("step_s", row["median_step_s"])


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
        "wait for each other's collectives); (mean): the mean, for a "
        "compressor that communicates once per several steps (SBC's "
        "delay). Bytes: per step, per host link, sent (veth tx) as "
        "measured and as tfgc's payload bytes times the ring's transport "
        "factor (all-reduce 2(n-1)/n, all-gather n-1, broadcast (n-1)/n; "
        "under the hierarchical communicator: the host's g shards, each "
        "exchanged among the m hosts); the measurement includes TCP/IP and "
        "gRPC headers. "
        "x floor: step time / the no-communication step time (each "
        "worker stepping on its own); synchronisation only: that step "
        "with a 4-byte all-reduce after the backward pass, so that every "
        "step waits for the slowest worker, as every exchange makes it. "
        "vs best dense: the fastest dense case's step time / this one's. "
        "Hidden: of the communication its unpipelined twin waits for "
        "(that step minus the floor), the share the buckets overlap with "
        "the backward pass.",
    ]
    if results.get("settings", {}).get("interleave"):
        lines += [
            "",
            "Interleaved: every case that communicates was built and "
            "warmed up first, then their timed steps ran one per case in "
            "turn (a round of every case, as many rounds as steps), so a "
            "slow spell of the machine falls on each alike; the "
            "no-communication cases ran one after another after them, and "
            "cases with other strategy options (bytes_per_pack) in their "
            "own processes.",
        ]
    for run in results["runs"]:
        rate = run["rate"] or "unshaped (localhost)"
        lines += [
            "",
            f"## {run['hosts']} hosts x {run['workers_per_host']} worker(s), "
            f"{rate}, latency {run['latency']}",
            "",
            f"Load average before/after: {run['load_before']} / "
            f"{run['load_after']}; compiled custom ops: {run['custom_ops']}"
            + _steal(run.get("steal_share"))
            + ".",
        ]
        for check in run.get("rate_check", []):
            lines.append(
                f"TCP {check['src']} -> {check['dst']}: "
                f"{check['rate_bits'] / 1e6:.0f} Mbit/s."
            )
        lines += [
            "",
            "| case | ms / step | steps / s | vs fp32 | vs fp16 "
            "| vs best dense | x floor | hidden "
            "| MB sent / step (measured) | MB (analytic) "
            "| measured / analytic |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in run["cases"]:
            ratio = r.get("measured_over_analytic")
            mean = " (mean)" if r.get("step_statistic") == "mean" else ""
            best = r.get("speedup_vs_best_dense")  # older results: none
            hidden = r.get("hidden_share")
            lines.append(
                f"| {r['name']}{mean} | {step_s(r) * 1e3:,.1f} | "
                f"{r['steps_per_s']:.2f} | {r['speedup_vs_fp32']:.2f}x | "
                f"{r['speedup_vs_fp16']:.2f}x | "
                f"{'-' if best is None else f'{best:.2f}x'} | "
                f"{r['times_floor']:.2f} | "
                f"{'-' if hidden is None else f'{100 * hidden:.0f} %'} | "
                f"{_mb(r.get('measured_tx_bytes'))} | "
                f"{_mb(r.get('analytic_wire_bytes'))} | "
                f"{'-' if ratio is None else f'{ratio:.3f}'} |"
            )
        lines += plan_lines(run["cases"])
        overheads = [
            f"{r['name'].removesuffix(LOCAL_SUFFIX)} "
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
    lines += [f"![{p}]({p})" for p in plots if "_fit_" not in p]
    if results.get("cost_model"):
        lines += cost_model_markdown(results["cost_model"], plots)
    return "\n".join(lines) + "\n"


def plan_lines(rows: list[dict]) -> list[str]:
    """For each case planned by `compressor="auto"`: its plan, the
    predicted step against the measured one, and its step against the
    best fixed compressor's (pipelined) and the best dense case's."""
    fixed = [
        step_s(r)
        for r in rows
        if r["kind"] == "compressed"
        and not r.get("plan")
        and not r["name"].endswith((UNPIPELINED_SUFFIX, PLAN_FIXED_SUFFIX))
    ]
    by_name = {r["name"]: r for r in rows}
    lines = []
    for r in rows:
        plan = r.get("plan")
        if not plan:
            continue
        t = step_s(r)
        twin = by_name.get(r["name"] + PLAN_FIXED_SUFFIX)
        caption, _, table = plan["table"].partition("\n")
        lines += ["", f"**{r['name']}**: {caption}", "", table, ""]
        found = plan.get("report")
        if found:
            # The step measured here with the predicted exposed exchange
            # in place of the measured one, that of the worker ready last
            # (the plan's own clock would count the other cases' steps
            # when they are interleaved).
            measured = found.get("critical", found["exposed"])
            predicted = t - measured + found["predicted_exposed"]
            lines.append(
                f"Predicted step (this step with the exchange left after "
                f"the last gradient as predicted in place of as measured "
                f"over {found['exchanges']} steps): "
                f"{_ms(predicted)} ms, measured here {_ms(t)} ms "
                f"({100 * (predicted - t) / t:+.0f} %); its exchange "
                f"{_ms(sum(found['busy']))} ms measured, "
                f"{_ms(sum(found['predicted_busy']))} ms predicted."
            )
        if found and found.get("trials"):
            medians = "; ".join(
                f"{_ms(float(np.median(p)))}" for p in found["trials"]
            )
            lines.append(
                f"The trials' periods on worker 0, each plan's median in the "
                f"order tried: {medians} ms."
            )
        if fixed:
            best = min(fixed)
            lines.append(
                f"Against the best fixed case ({_ms(best)} ms): "
                f"{t / best:.2f}x its step time; against the best dense "
                f"case: {r['speedup_vs_best_dense']:.2f}x faster."
            )
        if twin:
            lines.append(
                f"The plan it kept, built without the trials' switch "
                f"(`Auto(choices=...)`): {_ms(step_s(twin))} ms, auto "
                f"{t / step_s(twin):.2f}x that."
            )
    return lines


def _ms(x: float) -> str:
    return f"{x * 1e3:,.1f}"


def _density(d) -> str:
    return "never" if d is None else "any" if d >= 1 else f"{d:.3g}"


def cost_model_markdown(model: dict, plots: list[str]) -> list[str]:
    """The fitted parameters, the held-out error, the predicted grid."""
    f = model["fitted"]
    held, fit = model["held_out_summary"], model["in_fit_summary"]
    lines = [
        "",
        "## Cost model (benchmarks/lab/cost_fit.py)",
        "",
        f"Fitted on the runs of {_hosts(model['fit_hosts'])}, checked on "
        f"the held-out runs of {_hosts(model['holdout_hosts'])}"
        + (
            f" (fit again by `{model['command']}`)"
            if "command" in model
            else ""
        )
        + ". step = compute N + select N + sent k + overhead + ring steps "
        "x alpha + bytes x headers x (8 / rate + host time per byte), "
        "for N "
        "parameters, k sent elements, 2 (p - 1) ring steps of an "
        "all-reduce and p - 1 of an all-gather.",
        "",
        "| parameter | fitted |",
        "|---|---|",
        f"| compute per parameter | {f['compute_time'] * 1e9:.2f} ns |",
    ]
    for name in f["select_time"]:
        lines += [
            f"| {name}: select per element | "
            f"{f['select_time'][name] * 1e9:.2f} ns |",
            f"| {name}: per sent element | "
            f"{f['sent_time'][name] * 1e9:.1f} ns |",
        ]
    lines += [
        f"| distributed step overhead | {_ms(f['overhead'])} ms |",
    ]
    lines += [
        f"| alpha per ring step, {name} | {_ms(alpha)} ms |"
        for name, alpha in f["latency"].items()
    ]
    lines += [
        f"| host time per byte on the wire | "
        f"{f['host_byte_time'] * 1e9:.2f} ns |",
        f"| headers (measured / analytic bytes) | {f['header_overhead']:.4f} |",
        "",
        f"Prediction error, held out: median {held['median_abs_error_pct']:.0f}"
        f" %, max {held['max_abs_error_pct']:.0f} % over {held['points']} "
        f"points; in the fit: median {fit['median_abs_error_pct']:.0f} %, "
        f"max {fit['max_abs_error_pct']:.0f} % over {fit['points']}.",
        "",
        "| held out | case | measured ms | predicted ms | error |",
        "|---|---|---|---|---|",
    ]
    for r in model["held_out"]:
        lines.append(
            f"| {r['hosts']} hosts, {r['rate_gbit']:g} Gbit/s | {r['case']} "
            f"| {_ms(r['measured_s'])} | {_ms(r['predicted_s'])} | "
            f"{r['error_pct']:+.0f} % |"
        )
    if model.get("other_ops"):
        lines += [
            "",
            "Not counted: these runs had the compiled custom ops "
            f"{'not ' if model['custom_ops'] else ''}loaded, unlike the "
            "others, so they time another implementation of the "
            "compressor (the pure-TF fallback, or the compiled one).",
            "",
            "| not counted | case | measured ms | predicted ms | error |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['hosts']} hosts, {r['rate_gbit']:g} Gbit/s | {r['case']} "
            f"| {_ms(r['measured_s'])} | {_ms(r['predicted_s'])} | "
            f"{r['error_pct']:+.0f} % |"
            for r in model["other_ops"]
        ]
    names = list(model["predictions"][0]["step_s"])
    lines += [
        "",
        f"Predicted for the same model ({model['params'] / 1e6:.1f} M "
        "parameters), one worker per host: step time in ms (speed-up vs "
        "dense fp32).",
        "",
        "| workers | Gbit/s | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for p in model["predictions"]:
        cells = [
            f"{_ms(p['step_s'][n])} ({p['speedup_vs_fp32'][n]:.2f}x)"
            for n in names
        ]
        lines.append(
            f"| {p['workers']} | {p['rate_gbit']:g} | "
            + " | ".join(cells)
            + " |"
        )
    rates = sorted({c["rate_gbit"] for c in model["crossover"]})
    for compressor in dict.fromkeys(
        c["compressor"] for c in model["crossover"]
    ):
        mine = [c for c in model["crossover"] if c["compressor"] == compressor]
        lines += [
            "",
            f"Crossover density of {compressor}: below it the sparse "
            "all-gather step beats the dense fp32 all-reduce step "
            "(never: not even at density 0, the selection costs more; any: "
            "even at density 1, its fewer ring steps win).",
            "",
            "| workers | " + " | ".join(f"{r:g} Gbit/s" for r in rates) + " |",
            "|---|" + "---|" * len(rates),
        ]
        for w in dict.fromkeys(c["workers"] for c in mine):
            by_rate = {
                c["rate_gbit"]: c["density"] for c in mine if c["workers"] == w
            }
            lines.append(
                f"| {w} | "
                + " | ".join(_density(by_rate[r]) for r in rates)
                + " |"
            )
    lines.append("")
    lines += [f"![{p}]({p})" for p in plots if "_fit_" in p]
    return lines


def _label(run: dict) -> str:
    return (
        f"{run['hosts']} hosts, {run['rate'] or 'localhost'}, "
        f"latency {run['latency']}"
    )


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _barh(ax, groups: list[tuple[str, list[float]]], names: list[str]):
    """Horizontal bars, one row per case (top to bottom as listed), one
    bar per group in each row: long case names stay readable."""
    height = 0.8 / len(groups)
    for i, (label, values) in enumerate(groups):
        ys = [k + i * height for k in range(len(names))]
        ax.barh(ys, values, height, label=label)
    ax.set_yticks([k + 0.4 - height / 2 for k in range(len(names))], names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.legend(fontsize="small")


def _size(rows: int, groups: int) -> tuple[float, float]:
    return 9, 1.5 + 0.18 * rows * groups


def plot_step_times(results: dict, path: str) -> None:
    runs = results["runs"]
    names = [r["name"] for r in runs[0]["cases"]]
    fig, ax = plt.subplots(figsize=_size(len(names), len(runs)))
    _barh(
        ax,
        [(_label(run), [step_s(r) for r in run["cases"]]) for run in runs],
        names,
    )
    ax.set_xlabel("step time (s; median, or mean over SBC's rounds)")
    ax.set_title("Step time per case")
    _save(fig, path)


def plot_bytes(results: dict, path: str) -> None:
    run = results["runs"][0]
    rows = [r for r in run["cases"] if r.get("analytic_wire_bytes")]
    fig, ax = plt.subplots(figsize=_size(len(rows), 2))
    _barh(
        ax,
        [
            ("analytic", [r["analytic_wire_bytes"] for r in rows]),
            (
                "measured (veth)",
                [r.get("measured_tx_bytes", 0) for r in rows],
            ),
        ],
        [r["name"] for r in rows],
    )
    ax.set_xlabel("bytes sent per step per host")
    ax.set_title(f"Bytes on the wire ({_label(run)})")
    _save(fig, path)


def plot_speedup_vs_rate(results: dict, path: str) -> None:
    from benchmarks.lab.netns import parse_rate

    runs = [r for r in results["runs"] if r["rate"]]
    # One line per case: the runs of one host count (the largest).
    hosts = max(r["hosts"] for r in runs)
    runs = [r for r in runs if r["hosts"] == hosts]
    # The compressors' local steps do not depend on the rate: left out.
    shown = [
        (j, case["name"])
        for j, case in enumerate(runs[0]["cases"])
        if case["kind"] != "local_compressed"
    ]
    # Against the best dense configuration of each run where the results
    # have it (older ones: dense fp32).
    key = "speedup_vs_best_dense"
    if not all(key in case for r in runs for case in r["cases"]):
        key = "speedup_vs_fp32"
    fig, ax = plt.subplots(figsize=(9, 4 + 0.1 * len(shown)))
    rates = [parse_rate(r["rate"]) / 1e9 for r in runs]
    for n, (j, name) in enumerate(shown):
        ax.plot(
            rates,
            [r["cases"][j][key] for r in runs],
            "o-" if n < 10 else "s--",  # the colour cycle has 10
            label=name,
        )
    ax.set_xscale("log")
    ax.set_xlabel("link rate (Gbit/s)")
    ax.set_ylabel(
        "speed-up vs the best dense case"
        if key == "speedup_vs_best_dense"
        else "speed-up vs dense fp32"
    )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_title(f"{hosts} hosts")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small")
    _save(fig, path)


def _hosts(counts: list[int]) -> str:
    return ", ".join(map(str, counts)) + " hosts"


def plot_fit(model: dict, path: str) -> None:
    """Predicted vs measured step time, in the fit and held out."""
    fig, ax = plt.subplots(figsize=(5, 5))
    for key, marker, label in (
        ("in_fit", "o", f"fit ({_hosts(model['fit_hosts'])})"),
        ("held_out", "s", f"held out ({_hosts(model['holdout_hosts'])})"),
    ):
        rows = model[key]
        ax.scatter(
            [r["measured_s"] * 1e3 for r in rows],
            [r["predicted_s"] * 1e3 for r in rows],
            marker=marker,
            label=label,
        )
    every = [r["measured_s"] * 1e3 for r in model["in_fit"] + model["held_out"]]
    lo, hi = min(every) / 1.5, max(every) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")  # errors as ratios
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.legend()
    _save(fig, path)


def plot_predicted_speedup(model: dict, path: str) -> None:
    """Predicted speed-up vs dense fp32 per compressor over the rate."""
    names = [n for n in model["predictions"][0]["step_s"] if n != "dense fp32"]
    fig, axes = plt.subplots(
        1, len(names), figsize=(4 * len(names), 3.6), sharey=True
    )
    for ax, name in zip(np.atleast_1d(axes), names):
        for w in dict.fromkeys(p["workers"] for p in model["predictions"]):
            mine = [p for p in model["predictions"] if p["workers"] == w]
            ax.plot(
                [p["rate_gbit"] for p in mine],
                [p["speedup_vs_fp32"][name] for p in mine],
                "o-",
                label=f"{w} workers",
            )
        ax.axhline(1, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_xlabel("link rate (Gbit/s)")
        ax.set_title(name)
    np.atleast_1d(axes)[0].set_ylabel("predicted speed-up vs dense fp32")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    _save(fig, path)


def plot_crossover(model: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for compressor in dict.fromkeys(
        c["compressor"] for c in model["crossover"]
    ):
        for w in dict.fromkeys(c["workers"] for c in model["crossover"]):
            mine = [
                c
                for c in model["crossover"]
                if c["workers"] == w and c["compressor"] == compressor
            ]
            ax.plot(
                [c["rate_gbit"] for c in mine],
                [
                    np.nan if c["density"] is None else c["density"]
                    for c in mine
                ],
                "o-",
                label=f"{compressor}, {w} workers",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link rate (Gbit/s)")
    ax.set_ylabel("crossover density")
    ax.set_title("Sparse all-gather beats dense all-reduce below")
    ax.legend(fontsize=8)
    _save(fig, path)


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
    if results.get("cost_model"):
        for suffix, plot in (
            ("fit_validation", plot_fit),
            ("fit_predicted_speedup", plot_predicted_speedup),
            ("fit_crossover", plot_crossover),
        ):
            plots.append(f"{stem}_{suffix}.png")
            plot(results["cost_model"], os.path.join(out, plots[-1]))
    paths = [os.path.join(out, f"{stem}.json"), os.path.join(out, f"{stem}.md")]
    with open(paths[0], "w") as f:
        json.dump(results, f, indent=1)
    with open(paths[1], "w") as f:
        f.write(markdown(results, plots))
    return paths + [os.path.join(out, p) for p in plots]
