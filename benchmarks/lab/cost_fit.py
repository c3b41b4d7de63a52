"""The lab's cost model: alpha-beta collectives plus per-element compute,
fitted to measured step times, checked on held-out runs, extrapolated.

The terms are those of `tfgc.compressors.CostModel` (latency
alpha per message step of a collective, bandwidth, `select_time` per
element), with what a whole training step adds. For p workers, a model of
N parameters, a link of `rate` bit/s and a case sending W bytes per host
link (tfgc's analytic payload times the ring's transport factor):

    step = compute_time N + select_time N + sent_time k
         + overhead + steps(p) latency[path] + h W (8 / rate + host_byte_time)

- compute_time: forward, backward and update per parameter, from the
  no-communication floor. No term for the lab's workers sharing its
  cores: the stand-in's floor stayed flat from 2 to 4 workers (a step of
  the small model is bound by dispatch, not by the cores).
- select_time, sent_time: tfgc's compress, decompress and error feedback
  per gradient element and per sent element k = density N, from each
  compressor's local step minus the floor (dense fp16's cast: 0).
- overhead: a distributed step's fixed cost (the floor runs outside the
  strategy).
- steps(p): ring message steps, 2 (p - 1) for an all-reduce, p - 1 for
  an all-gather; TensorFlow's CPU collectives are rings
  (`CostModel.sparse_time` counts ceil(log2 p), recursive doubling).
- latency[path]: alpha per message step of each way a case communicates:
  Keras's own all-reduce (dense fp32) and tfgc's fused all-reduce (fp16)
  and all-gather (top-k) are different launches, so each has its alpha.
- h: measured veth bytes / analytic (TCP/IP and gRPC headers).
- 8 / rate: beta of the shaped link (tbf shapes the bytes that the veth
  counters count); host_byte_time: what each byte costs the hosts on top
  (gRPC, copies, reduction), which bounds a step where the link is fast.

Each stage is a linear least-squares fit (the communication terms
non-negative): compute from the floors, then compression from the local
steps, then the communication terms from what remains of each step.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics

import numpy as np
from scipy.optimize import nnls

import tfgc
from benchmarks.lab.netns import parse_rate
from benchmarks.lab.worker import transport_factor
from tfgc.compressors import ALL_GATHER, ALL_REDUCE

DENSE_PATH = "keras all_reduce"  # the dense fp32 baseline
PATHS = (DENSE_PATH, "tfgc all_reduce", "tfgc all_gather")
# The worker's case kinds that the model covers (not: per tensor).
MODELLED = ("dense_fp32", "compressed", "floor", "local_compressed")
#: Predicted grid: workers x link rate (Gbit/s).
PREDICT_WORKERS = (8, 16, 32, 64, 128)
PREDICT_GBITS = (1, 3, 10, 30, 100)
FP32_BYTES = 4


@dataclasses.dataclass(frozen=True)
class FittedCosts:
    """The fitted parameters, in seconds (see the module docstring)."""

    compute_time: float
    select_time: dict  # per compressor name ("topk"); fp16: absent
    sent_time: dict
    overhead: float
    latency: dict  # per path, see PATHS
    host_byte_time: float
    header_overhead: float


@dataclasses.dataclass(frozen=True)
class Point:
    """One case of one run, as the fit sees it."""

    hosts: int
    rate_bits: float
    name: str
    kind: str  # the worker's case kinds
    compressor: str | None  # "topk", "fp16"; None for dense fp32, floor
    density: float
    params: int
    collective: str | None
    analytic_wire_bytes: float
    measured_wire_bytes: float | None
    step_s: float
    custom_ops: bool | None = None  # the run loaded tfgc's compiled ops


def _compressor_of(name: str) -> tuple[str | None, float]:
    """('topk', 0.001) from 'topk 0.001 +EF[, no communication]'."""
    if name in ("dense fp32", "no communication"):
        return None, 1.0
    if name == "dense fp16":
        return "fp16", 1.0
    words = name.split(",")[0].split()
    density = 1.0
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq or key == "density":
            try:
                density = float(value if eq else key)
            except ValueError:
                pass
    return words[0], density


def _collective(compressor: str | None) -> str:
    """The ring a case's payload rides: all-reduce or all-gather."""
    if compressor is None:  # dense fp32
        return ALL_REDUCE
    collective = tfgc.compressors.get(compressor).spec.collectives[0]
    # A ragged gather is a gather of sizes plus one of payloads; the
    # payload's ring dominates.
    return ALL_REDUCE if collective == ALL_REDUCE else ALL_GATHER


def points(results: dict) -> list[Point]:
    """Every case of every shaped run; `hosts` workers, one per host."""
    out = []
    for run in results["runs"]:
        if not run["rate"] or run["workers_per_host"] != 1:
            continue  # loopback or hierarchical: not this model's
        rows = run["cases"]
        dense = next(r for r in rows if r["name"] == "dense fp32")
        params = round(dense["analytic_payload_bytes"] / FP32_BYTES)
        for row in rows:
            if row["kind"] not in MODELLED:
                continue
            compressor, density = _compressor_of(row["name"])
            communicates = row["kind"] in ("dense_fp32", "compressed")
            out.append(
                Point(
                    hosts=run["hosts"],
                    rate_bits=parse_rate(run["rate"]),
                    name=row["name"],
                    kind=row["kind"],
                    compressor=compressor,
                    density=density,
                    params=params,
                    collective=_collective(compressor)
                    if communicates
                    else None,
                    analytic_wire_bytes=row.get("analytic_wire_bytes") or 0.0,
                    measured_wire_bytes=row.get("measured_tx_bytes"),
                    step_s=row["median_step_s"],
                    custom_ops=run.get("custom_ops"),
                )
            )
    return out


def path(p: Point) -> str:
    return ("keras " if p.compressor is None else "tfgc ") + p.collective


def ring_steps(collective: str, workers: int) -> int:
    return (2 if collective == ALL_REDUCE else 1) * (workers - 1)


def _ls_scalar(xs, ys) -> float:
    """The c of y = c x that minimises the squared error."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    return float(xs @ ys / (xs @ xs))


def fit(pts: list[Point]) -> FittedCosts:
    """Fits every parameter to `pts` (see the module docstring)."""
    floors = {(p.hosts, p.rate_bits): p for p in pts if p.kind == "floor"}
    if not floors:
        raise ValueError("the fit needs the no-communication floor cases")
    compute_time = _ls_scalar(
        [p.params for p in floors.values()],
        [p.step_s for p in floors.values()],
    )

    def floor_of(p):
        return floors[(p.hosts, p.rate_bits)].step_s

    select_time, sent_time = {}, {}
    local = [p for p in pts if p.kind == "local_compressed"]
    for name in sorted({p.compressor for p in local}):
        mine = [p for p in local if p.compressor == name]
        a = np.array([[p.params, p.density * p.params] for p in mine])
        b = np.array([p.step_s - floor_of(p) for p in mine])
        if len({p.density for p in mine}) > 1:
            (select_time[name], sent_time[name]), _ = nnls(a, b)
        else:  # one density: the per-element cost carries it all
            select_time[name] = max(0.0, _ls_scalar(a[:, 0], b))
            sent_time[name] = 0.0

    comm = [p for p in pts if p.collective]
    measured = [p for p in comm if p.measured_wire_bytes is not None]
    header = (
        sum(p.measured_wire_bytes for p in measured)
        / sum(p.analytic_wire_bytes for p in measured)
        if measured and all(p.analytic_wire_bytes for p in measured)
        else 1.0
    )
    rows, rhs = [], []
    for p in comm:
        wire = (
            p.measured_wire_bytes
            if p.measured_wire_bytes is not None
            else p.analytic_wire_bytes * header
        )
        steps = ring_steps(p.collective, p.hosts)
        rows.append(
            [1.0] + [steps * (path(p) == name) for name in PATHS] + [wire]
        )
        rhs.append(
            p.step_s
            - wire * 8 / p.rate_bits
            - floor_of(p)
            - _compress_time(select_time, sent_time, p.compressor, p)
        )
    solution, _ = nnls(np.array(rows, float), np.array(rhs))
    overhead, *alphas, host_byte_time = solution
    return FittedCosts(
        compute_time=compute_time,
        select_time=select_time,
        sent_time=sent_time,
        overhead=float(overhead),
        latency={
            name: float(a)
            for name, a in zip(PATHS, alphas)
            if any(path(p) == name for p in comm)
        },
        host_byte_time=float(host_byte_time),
        header_overhead=float(header),
    )


def _compress_time(select_time, sent_time, compressor, p) -> float:
    """Compression's compute at one core (dense fp32, fp16: none)."""
    if compressor not in select_time:
        return 0.0
    return (
        select_time[compressor] * p.params
        + sent_time[compressor] * p.density * p.params
    )


def predict(costs: FittedCosts, p: Point) -> float:
    """Step time of `p` from its analytic bytes."""
    t = costs.compute_time * p.params + _compress_time(
        costs.select_time, costs.sent_time, p.compressor, p
    )
    if p.collective:
        t += (
            costs.overhead
            + ring_steps(p.collective, p.hosts) * costs.latency[path(p)]
            + p.analytic_wire_bytes
            * costs.header_overhead
            * (8 / p.rate_bits + costs.host_byte_time)
        )
    return t


def split_hosts(hosts: list[int], holdout: list[int]):
    """(fit, held-out) host counts; the fit needs two to separate the
    per-step latency from the fixed overhead."""
    missing = sorted(set(holdout) - set(hosts))
    if missing:
        raise ValueError(
            f"`holdout` must name swept host counts {sorted(hosts)}. "
            f"Received: holdout={missing}"
        )
    fit_hosts = sorted(set(hosts) - set(holdout))
    if len(fit_hosts) < 2 or min(fit_hosts) < 2:
        raise ValueError(
            "The fit needs two host counts of 2 or more outside `holdout`."
            f" Received: hosts={sorted(hosts)}, holdout={sorted(holdout)}"
        )
    return fit_hosts, sorted(set(holdout))


def validate(costs: FittedCosts, pts: list[Point]) -> list[dict]:
    """Predicted vs measured step time of each point, error in percent
    of the measurement."""
    out = []
    for p in pts:
        predicted = predict(costs, p)
        out.append(
            {
                "hosts": p.hosts,
                "rate_gbit": p.rate_bits / 1e9,
                "case": p.name,
                "measured_s": p.step_s,
                "predicted_s": predicted,
                "error_pct": 100 * (predicted - p.step_s) / p.step_s,
            }
        )
    return out


def _summary(rows: list[dict]) -> dict:
    errors = [abs(r["error_pct"]) for r in rows]
    return {
        "points": len(rows),
        "median_abs_error_pct": statistics.median(errors) if errors else None,
        "max_abs_error_pct": max(errors) if errors else None,
    }


def _scaled(template: Point, workers: int, rate_bits: float) -> Point:
    """`template`'s case on `workers` hosts at `rate_bits`, analytic bytes
    from its payload times the ring's transport factor."""
    payload = template.analytic_wire_bytes / transport_factor(
        template.collective, template.hosts
    )
    return dataclasses.replace(
        template,
        hosts=workers,
        rate_bits=rate_bits,
        analytic_wire_bytes=payload
        * transport_factor(template.collective, workers),
        measured_wire_bytes=None,
        step_s=float("nan"),
    )


def crossover_density(
    costs: FittedCosts,
    compressor: str,
    bytes_per_sent: float,
    params: int,
    workers: int,
    rate_bits: float,
) -> float | None:
    """The density below which `compressor`'s all-gather step beats the
    dense fp32 all-reduce step (one core per worker), None if it never
    does; 1.0 when it wins even sending everything. Both steps are linear
    in the density, so the crossing is where they are equal."""
    gather = "tfgc " + ALL_GATHER
    per_byte = costs.header_overhead * (8 / rate_bits + costs.host_byte_time)
    dense = (
        ring_steps(ALL_REDUCE, workers) * costs.latency[DENSE_PATH]
        + transport_factor(ALL_REDUCE, workers) * FP32_BYTES * params * per_byte
    )
    fixed = (
        ring_steps(ALL_GATHER, workers) * costs.latency[gather]
        + costs.select_time.get(compressor, 0.0) * params
    )
    slope = (
        costs.sent_time.get(compressor, 0.0)
        + transport_factor(ALL_GATHER, workers) * bytes_per_sent * per_byte
    ) * params
    density = (dense - fixed) / slope
    if density <= 0:
        return None
    return min(1.0, density)


def analyse(results: dict, holdout: list[int]) -> dict:
    """Fit on the runs outside `holdout`, validate on those inside,
    predict the grid and the crossover densities."""
    every = points(results)
    hosts = sorted({p.hosts for p in every})
    fit_hosts, held = split_hosts(hosts, holdout)
    # A run without the compiled ops (they failed to load, or were being
    # rebuilt) times the pure-TF fallback: another implementation, so it
    # is kept out of the fit and of the error summary, and listed apart.
    ops = collections.Counter(p.custom_ops for p in every).most_common(1)[0][0]
    pts = [p for p in every if p.custom_ops == ops]
    costs = fit([p for p in pts if p.hosts in fit_hosts])
    in_fit = validate(costs, [p for p in pts if p.hosts in fit_hosts])
    held_out = validate(costs, [p for p in pts if p.hosts in held])
    other_ops = validate(costs, [p for p in every if p.custom_ops != ops])

    templates = {}
    for p in pts:
        if p.collective and p.name not in templates:
            templates[p.name] = p
    predictions = []
    for workers in PREDICT_WORKERS:
        for gbit in PREDICT_GBITS:
            times = {
                name: predict(costs, _scaled(t, workers, gbit * 1e9))
                for name, t in templates.items()
            }
            predictions.append(
                {
                    "workers": workers,
                    "rate_gbit": gbit,
                    "step_s": times,
                    "speedup_vs_fp32": {
                        n: times["dense fp32"] / t for n, t in times.items()
                    },
                }
            )
    crossovers, seen = [], set()
    for t in templates.values():
        # One per compressor: the density is the variable.
        if t.collective != ALL_GATHER or t.compressor in seen:
            continue
        seen.add(t.compressor)
        sent = t.analytic_wire_bytes / transport_factor(ALL_GATHER, t.hosts)
        bytes_per_sent = sent / (t.density * t.params)
        for workers in PREDICT_WORKERS:
            for gbit in PREDICT_GBITS:
                crossovers.append(
                    {
                        "compressor": t.compressor,
                        "workers": workers,
                        "rate_gbit": gbit,
                        "density": crossover_density(
                            costs,
                            t.compressor,
                            bytes_per_sent,
                            t.params,
                            workers,
                            gbit * 1e9,
                        ),
                    }
                )
    return {
        "fit_hosts": fit_hosts,
        "holdout_hosts": held,
        "params": pts[0].params,
        "fitted": dataclasses.asdict(costs),
        "in_fit": in_fit,
        "in_fit_summary": _summary(in_fit),
        "held_out": held_out,
        "held_out_summary": _summary(held_out),
        "custom_ops": ops,
        "other_ops": other_ops,
        "predictions": predictions,
        "crossover": crossovers,
    }
