"""The benchmark lab: end-to-end step time on shaped hosts on one machine.

    sudo .venv/bin/python -m benchmarks.run --preset 1gbit
    .venv/bin/python -m benchmarks.run --preset smoke --out /tmp/lab
    .venv/bin/python -m benchmarks.run --preset smoke --localhost
    .venv/bin/python -m benchmarks.run --cleanup
    sudo .venv/bin/python -m benchmarks.run --preset costmodel
    .venv/bin/python -m benchmarks.run --refit docs/benchmarks/costmodel.json

Each run makes `--hosts` network namespaces behind a bridge, shapes every
host's link both ways (`benchmarks/lab/netns.py`), starts
`--workers_per_host` MultiWorkerMirroredStrategy workers in each
(`benchmarks/lab/worker.py`), and times dense fp32, dense fp16, every
`--compressors` entry and the no-communication floor in the same run. A
comma list of rates or latencies is a sweep: one run, one fresh testbed,
per pair, and a comma list of `--hosts` sweeps the host count. `--fit`
fits the cost model of `benchmarks/lab/cost_fit.py` to the sweep's
points, checks it on the `--holdout` host counts and predicts larger
clusters; `--refit` does that again on a saved JSON. Results go to
`--out` as `<preset>.json`, `<preset>.md` and plots
(`benchmarks/lab/report.py`). Everything created is removed on success,
failure, timeout, Ctrl-C and SIGTERM; `--cleanup` removes what a killed
run left. Flags given with `--preset` override the preset's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import tfgc
from benchmarks._common import cpu_model
from benchmarks.lab import cluster, cost_fit, netns, report, tcprate
from benchmarks.lab import worker as lab_worker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "docs", "benchmarks")
WORKER_PORT = 20000
EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 124

# Every compressor tfgc has: bf16 without error feedback (like the dense
# fp16 baseline), the sparsifiers at density 0.1 %, the low-rank ones at
# rank 4, SBC also with a delay of 4 steps (so a preset's warm-up and timed
# steps must be whole rounds of 4).
EVERY_COMPRESSOR = (
    "bf16:ef=0 topk:0.001 randomk:0.001 signsgd powersgd:rank=4 "
    "mstopk:0.001 redsync:0.001 sbc:0.001 sbc:0.001,delay=4 "
    "importance:0.001 acpsgd:rank=4"
)
# compressor="auto" and every candidate it chooses from by default.
PLANNER_CANDIDATES = (
    "identity:ef=0 topk:0.01 mstopk:0.01 powersgd:rank=4 acpsgd:rank=4 auto"
)
PRESETS = {
    # CI's test of the lab itself: set-up, shaping, counters, tear-down.
    "smoke": {
        "hosts": 2,
        "rate": "1gbit",
        "model": "standin-small",
        "compressors": "topk:0.01",
        "steps": 5,
        "warmup": 2,
        "timeout": 110,
        "check_rate": True,
    },
    "1gbit": {
        "hosts": 4,
        "rate": "1gbit",
        "model": "standin",
        "compressors": "topk:0.001",
        "steps": 10,
        "warmup": 2,
        "timeout": 900,
    },
    "10gbit": {
        "hosts": 4,
        "rate": "10gbit",
        "model": "standin",
        "compressors": "topk:0.001",
        "steps": 10,
        "warmup": 2,
        "timeout": 900,
    },
    # The real models, synthetic data (slow on 2 cores).
    "lstm-1gbit": {
        "hosts": 4,
        "rate": "1gbit",
        "model": "lstm-medium",
        "compressors": "topk:0.001",
        "steps": 5,
        "warmup": 2,
        "timeout": 1500,
    },
    "resnet50-1gbit": {
        "hosts": 4,
        "rate": "1gbit",
        "model": "resnet50",
        "compressors": "topk:0.001",
        "steps": 5,
        "warmup": 2,
        "timeout": 1500,
    },
    # Points for the fitted cost model; the 3-host
    # runs are held out and predicted from the 2- and 4-host fit.
    "costmodel": {
        "hosts": "2,3,4",
        "rate": "1gbit,10gbit",
        "model": "standin-small",
        "compressors": "topk:0.001 topk:0.1",
        "steps": 20,
        "warmup": 2,
        "timeout": 1800,
        "fit": True,
        "holdout": "3",
    },
    # Every compressor at both rates (which ones lose to dense fp32 or fp16
    # at 10 Gbit/s?).
    "compressors": {
        "hosts": 4,
        "rate": "1gbit,10gbit",
        "model": "standin",
        "compressors": EVERY_COMPRESSOR,
        "steps": 8,
        "warmup": 4,
        "timeout": 3000,
    },
    # Every compressor on the LSTM LM medium and on ResNet-50, both
    # compute-bound on 2 cores (the goal: each within 1.15x of the
    # no-communication floor).
    "compressors-lstm": {
        "hosts": 4,
        "rate": "1gbit",
        "model": "lstm-medium",
        "compressors": EVERY_COMPRESSOR,
        "steps": 12,
        "warmup": 4,
        "timeout": 3600,
    },
    "compressors-resnet50": {
        "hosts": 4,
        "rate": "1gbit",
        "model": "resnet50",
        "compressors": EVERY_COMPRESSOR,
        "steps": 4,
        "warmup": 4,
        "timeout": 4200,
    },
    # HiTopKComm: MSTopK's flat all-gather among all 4 workers vs the
    # hierarchical communicator (2 hosts x 2 workers, loopback inside a
    # host, only the compressed shards between hosts).
    "hitopk": {
        "hosts": 2,
        "workers_per_host": 2,
        "rate": "1gbit",
        "model": "standin-small",
        "compressors": "mstopk:0.001 mstopk:0.001,communicator=hierarchical",
        "steps": 20,
        "warmup": 2,
        "timeout": 600,
    },
    # The pipelined exchange against TensorFlow's own overlap: 2 hosts, a
    # worker each, a stand-in whose backward pass takes about as long as
    # its all-reduce at 1 Gbit/s; every case also unpipelined, the cases
    # taking turns step by step.
    "overlap": {
        "hosts": 2,
        "rate": "1gbit,10gbit",
        "model": "standin-compute",
        "compressors": "identity:ef=0 topk:0.001 powersgd:rank=4 acpsgd:rank=4",
        "steps": 10,
        "warmup": 3,
        "timeout": 2400,
        "interleave": True,
        "unpipelined": True,
        "bytes_per_pack": 25 * 2**20,
    },
    # The same comparison on the real models (2 hosts, 1 and 10 Gbit/s),
    # the cases taking turns step by step.
    "overlap-lstm": {
        "hosts": 2,
        "rate": "1gbit,10gbit",
        "model": "lstm-medium",
        "compressors": "topk:0.001 powersgd:rank=4 acpsgd:rank=4",
        "steps": 6,
        "warmup": 3,
        "timeout": 3000,
        "interleave": True,
        "unpipelined": True,
        "bytes_per_pack": 25 * 2**20,
    },
    "overlap-resnet50": {
        "hosts": 2,
        "rate": "1gbit,10gbit",
        "model": "resnet50",
        "compressors": "topk:0.001 powersgd:rank=4 acpsgd:rank=4",
        "steps": 6,
        "warmup": 3,
        "timeout": 3600,
        "interleave": True,
        "unpipelined": True,
        "bytes_per_pack": 25 * 2**20,
    },
    # compressor="auto" against every fixed candidate it may choose and
    # the tuned dense baselines, from a slow link to a fast one (an
    # unshaped run: the same with --localhost).
    "planner": {
        "hosts": 2,
        "rate": "100mbit,1gbit,10gbit",
        "model": "standin-compute",
        "compressors": PLANNER_CANDIDATES,
        # Each case's steps in turn with the others' (the machine's pace
        # drifts over minutes); `auto` warms up until its trials have
        # chosen.
        "steps": 10,
        "interleave": True,
        "warmup": 3,
        "timeout": 5400,
        "bytes_per_pack": 25 * 2**20,
    },
    # The same on the real models.
    "planner-lstm": {
        "hosts": 2,
        "rate": "100mbit,1gbit,10gbit",
        "model": "lstm-medium",
        "compressors": PLANNER_CANDIDATES,
        "steps": 10,
        "interleave": True,
        "warmup": 3,
        "timeout": 5400,
        "bytes_per_pack": 25 * 2**20,
    },
    "planner-resnet50": {
        "hosts": 2,
        # (At 100 Mbit/s each dense case takes minutes on 2 cores.)
        "rate": "1gbit,10gbit",
        "model": "resnet50",
        "compressors": PLANNER_CANDIDATES,
        # Steps vary by 5-10 % on 2 cores, and the machine's pace drifts
        # over minutes: more steps, each case's in turn with the others'.
        "steps": 12,
        "interleave": True,
        "warmup": 3,
        "timeout": 5400,
        "bytes_per_pack": 25 * 2**20,
    },
    # tfgc's fused collectives vs one collective per tensor.
    "fusion": {
        "hosts": 4,
        "rate": "1gbit",
        "model": "standin-small",
        "compressors": "topk:0.001",
        "steps": 20,
        "warmup": 2,
        "timeout": 600,
        "per_tensor": True,
    },
}
# The overlap comparison on 4 hosts: two workers share each core of a
# 2-core machine; the cases take turns step by step.
PRESETS["overlap-4hosts"] = dict(
    PRESETS["overlap"], hosts=4, steps=6, timeout=5400
)
# The real models on 4 hosts at 1 Gbit/s. ResNet-50's cases run one after
# another: interleaved, every case's model is held at once (about 1 GB a
# worker each), too much for four workers in this machine's 23 GB.
PRESETS["overlap-lstm-4hosts"] = dict(
    PRESETS["overlap-lstm"], hosts=4, rate="1gbit", timeout=3600
)
PRESETS["overlap-resnet50-4hosts"] = dict(
    PRESETS["overlap-resnet50"],
    hosts=4,
    rate="1gbit",
    interleave=False,
    timeout=3600,
)
# The same at 10 Gbit/s.
PRESETS["overlap-lstm-4hosts-10gbit"] = dict(
    PRESETS["overlap-lstm-4hosts"], rate="10gbit"
)
PRESETS["overlap-resnet50-4hosts-10gbit"] = dict(
    PRESETS["overlap-resnet50-4hosts"], rate="10gbit"
)

DEFAULTS = {
    "hosts": 2,
    "workers_per_host": 1,
    "rate": "1gbit",
    "latency": "0",
    "model": "standin",
    "compressors": "topk:0.001",
    "steps": 10,
    "warmup": 2,
    "timeout": 900,
    "check_rate": False,
    "fit": False,
    "holdout": "3",
    "per_tensor": False,
    "unpipelined": False,
    "bytes_per_pack": 0,
    "interleave": False,
}


class _Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the main thread is, so that every
    context manager on the stack tears down what it made."""


def parse_compressor(text: str) -> dict:
    """'topk:0.001' | 'powersgd:rank=4' | 'signsgd:scaled=false,ef=0' |
    'mstopk:0.001,communicator=hierarchical'.

    `ef` (error feedback, default on), `communicator` (a name of
    `tfgc.communicators`; "hierarchical" groups each host's
    `--workers_per_host` workers) and `bucket_bytes` (an integer, or
    "none" for one exchange after the backward pass) are the optimizer's;
    the rest go to the compressor ("none" is None).
    """
    name, _, args = text.partition(":")
    kwargs, error_feedback, communicator = {}, True, "auto"
    options = {}
    for item in filter(None, args.split(",")):
        key, eq, value = item.partition("=")
        if not eq:  # a bare number is the density
            key, value = "density", item
        value = {"true": True, "false": False, "none": None}.get(
            value.lower(), value
        )
        if isinstance(value, str):
            try:
                value = int(value) if value.isdigit() else float(value)
            except ValueError:
                pass
        if key == "ef":
            error_feedback = bool(value)
        elif key == "communicator":
            communicator = str(value)
        elif key == "bucket_bytes":
            options["bucket_bytes"] = value
        else:
            kwargs[key] = value
    label = (
        name
        + ("" if not args else f" {args}")
        + (" +EF" if error_feedback else "")
    )
    return {
        "name": label,
        "kind": "compressed",
        "compressor": name,
        "kwargs": kwargs,
        "error_feedback": error_feedback,
        "communicator": communicator,
        **options,
    }


def check_compressors(text: str, workers_per_host: int) -> None:
    """Builds every `--compressors` entry's optimizer once, in this
    process, so that an unknown name or a bad argument is a usage error
    before any namespace or worker exists.

    Raises:
        ValueError: naming the entry, the problem and the known names.
    """
    for entry in text.split():
        case = parse_compressor(entry)
        known = (
            f"Known compressors: {', '.join(tfgc.compressors.names())}; "
            "communicators: "
            f"{', '.join(tfgc.communicators.names())}."
        )
        try:
            lab_worker.make_optimizer(case, workers_per_host)
        except (TypeError, ValueError) as err:
            reason = str(err).rstrip(".")
            raise ValueError(
                f"`--compressors` entry {entry!r} cannot be built: {reason}."
                f" {known} Received: --compressors={text!r}"
            ) from None


def cases(
    compressors: str,
    per_tensor: bool = False,
    unpipelined: bool = False,
    bytes_per_pack: int = 0,
) -> list[dict]:
    """Dense fp32 (with `bytes_per_pack`, also in MWMS's packs that
    overlap the backward pass) and fp16 (tfgc's FP16), the compressors
    (with `per_tensor`, each also with a collective per tensor instead of
    tfgc's fused ones; with `unpipelined`, each, fp16 included, also in
    one exchange after the backward pass, `bucket_bytes=None`; `auto`
    with trials also with the plan it kept, fixed), the floor, then each
    compressor in the floor's local step (its compute overhead)."""
    fp16 = {
        "name": "dense fp16",
        "kind": "compressed",
        "compressor": "fp16",
        "kwargs": {},
        "error_feedback": False,
    }
    packed = []
    if bytes_per_pack:
        mib = bytes_per_pack / 2**20
        packed.append(
            {
                "name": f"dense fp32, bytes_per_pack={mib:g} MiB",
                "kind": "dense_fp32",
                "bytes_per_pack": bytes_per_pack,
            }
        )
    listed = [parse_compressor(c) for c in compressors.split() if c]
    # `auto` with trials: also the plan it kept, built without the switch
    # that trials need (`lab_worker.prepare`), for what the switch costs.
    fixed = [
        dict(c, name=c["name"] + report.PLAN_FIXED_SUFFIX, plan_of=c["name"])
        for c in listed
        if c["compressor"] == "auto"
        and "choices" not in c["kwargs"]
        and tfgc.compressors.get("auto", **c["kwargs"]).trial_steps
    ]
    # No twin where the entry chose its buckets or the compressor has a
    # size of its own (ACP-SGD's), which `bucket_bytes=None` keeps.
    serial = [
        dict(c, name=c["name"] + report.UNPIPELINED_SUFFIX, bucket_bytes=None)
        for c in [fp16] + listed
        if unpipelined
        and "bucket_bytes" not in c
        and not tfgc.compressors.get(
            c["compressor"], **c["kwargs"]
        ).spec.bucket_bytes
    ]
    # One local case per compressor: the communicator does not matter.
    local, seen = [], set()
    for c in listed:
        key = repr((c["compressor"], c["kwargs"], c["error_feedback"]))
        if key not in seen:
            seen.add(key)
            local.append(
                dict(
                    c,
                    name=c["name"] + report.LOCAL_SUFFIX,
                    kind="local_compressed",
                )
            )
    unfused = [
        dict(c, name=f"{c['name']}, per tensor", kind="compressed_per_tensor")
        for c in listed
        if per_tensor
    ]
    return (
        [{"name": "dense fp32", "kind": "dense_fp32"}]
        + packed
        + [fp16]
        + listed
        + fixed
        + serial
        + unfused
        + [{"name": "synchronisation only", "kind": "barrier"}]
        + [{"name": "no communication", "kind": "floor"}]
        + local
    )


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_ticks() -> list[int]:
    """The machine's cumulative CPU times (/proc/stat's "cpu" line: user,
    nice, system, idle, iowait, irq, softirq, steal, ...); [] where there
    is none."""
    try:
        with open("/proc/stat") as f:
            return [int(t) for t in f.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def _steal_share(before: list[int], after: list[int]) -> float | None:
    """The share of CPU time the hypervisor took from this VM between two
    `_cpu_ticks` (steal time: a VM's cores run someone else meanwhile)."""
    if len(before) < 8 or len(after) < 8:
        return None
    # guest and guest_nice (9th, 10th) are already counted in user, nice.
    delta = [b - a for a, b in zip(before[:8], after[:8])]
    return delta[7] / sum(delta) if sum(delta) else None


def run_once(
    args,
    run_cases: list[dict],
    hosts: int,
    rate: str | None,
    latency: str,
    deadline: float,
) -> dict:
    """One testbed (or loopback), every case of `run_cases` (`cases`): one
    set of workers per strategy's options (`_run_groups`)."""
    per_host = args.workers_per_host
    spec = {
        "model": args.model,
        "cases": run_cases,
        "steps": args.steps,
        "warmup": args.warmup,
        "workers_per_host": per_host,
        "interleave": args.interleave,
    }
    result = {
        "rate": rate,
        "latency": latency,
        "hosts": hosts,
        "workers_per_host": per_host,
        "load_before": _load(),
    }
    ticks = _cpu_ticks()
    with tempfile.TemporaryDirectory(prefix="tfgc-lab-") as tmp:
        spec["result_dir"] = tmp
        if args.localhost:
            from tfgc.launch import free_ports, host_names

            # One loopback address per host, as `tfgc.launch --hosts`,
            # so that the hierarchical communicator finds the hosts.
            count = hosts * per_host
            workers = [
                cluster.Worker(address, port, label=f"w{i}")
                for i, (address, port) in enumerate(
                    zip(host_names(count, hosts), free_ports(count))
                )
            ]
            per_worker = _run_groups(workers, spec, tmp, deadline)
        else:
            with netns.Testbed(hosts, rate, latency) as testbed:
                result["qdiscs"] = testbed.qdiscs()
                if args.check_rate and hosts >= 2:
                    a, b = testbed.hosts[:2]
                    rate_bits = testbed.rate_bits
                    result["rate_check"] = [
                        tcprate.capacity(a, b, rate_bits),
                        tcprate.capacity(b, a, rate_bits),
                    ]
                    for check in result["rate_check"]:
                        print(
                            f"[lab] TCP {check['src']} -> {check['dst']}: "
                            f"{check['rate_bits'] / 1e6:.0f} Mbit/s "
                            f"(configured {rate})",
                            flush=True,
                        )
                workers = [
                    cluster.Worker(
                        host.address,
                        WORKER_PORT + g,
                        tuple(host.exec_prefix()),
                        host.peer,
                        f"h{host.index}w{g}",
                    )
                    for host in testbed.hosts
                    for g in range(per_host)
                ]
                per_worker = _run_groups(workers, spec, tmp, deadline)
    result["load_after"] = _load()
    result["steal_share"] = _steal_share(ticks, _cpu_ticks())
    result["custom_ops"] = per_worker[0]["custom_ops"]
    result["cases"] = report.summarize(per_worker, hosts, per_host, args.steps)
    return result


def _run_groups(workers, spec, tmp, deadline) -> list[dict]:
    """Runs the spec's cases on `workers`, a set of worker processes per
    value of `bytes_per_pack` (a strategy's options are fixed for its
    process), and returns each worker's results with the cases in the
    spec's order."""
    groups: dict[int, list[dict]] = {}
    for case in spec["cases"]:
        groups.setdefault(case.get("bytes_per_pack", 0), []).append(case)
    per_worker = [None] * len(workers)
    for number, (pack, group) in enumerate(groups.items()):
        result_dir = os.path.join(tmp, f"group{number}")
        os.mkdir(result_dir)
        part = dict(
            spec, cases=group, bytes_per_pack=pack, result_dir=result_dir
        )
        _run_workers(workers, part, result_dir, deadline)
        for i in range(len(workers)):
            with open(os.path.join(result_dir, f"worker{i}.json")) as f:
                result = json.load(f)
            if per_worker[i] is None:
                per_worker[i] = dict(result, cases=[])
            per_worker[i]["cases"] += result["cases"]
    order = {case["name"]: n for n, case in enumerate(spec["cases"])}
    for result in per_worker:
        result["cases"].sort(key=lambda case: order[case["name"]])
    return per_worker


def _run_workers(workers, spec, tmp, deadline) -> None:
    spec_path = os.path.join(tmp, "spec.json")
    # The host's own veth end, named in the spec per worker below.
    for i, worker in enumerate(workers):
        spec_i = dict(spec, netdev=worker.netdev)
        with open(f"{spec_path}.{i}", "w") as f:
            json.dump(spec_i, f)
    commands = [
        [sys.executable, "-m", "benchmarks.lab.worker", f"{spec_path}.{i}"]
        for i in range(len(workers))
    ]
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [REPO, os.environ.get("PYTHONPATH")])
        ),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("no time left for this run")
    cluster.run(workers, commands, remaining, env=env)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="smoke: CI's 2-host check of the lab; 1gbit, 10gbit: 4 hosts, "
        "the stand-in, TopK; compressors: every compressor, 4 hosts, 1 and "
        "10 Gbit/s, the stand-in; lstm-1gbit, resnet50-1gbit: 4 hosts, "
        "those models, TopK; costmodel: 2, 3 and 4 hosts at "
        "1 and 10 Gbit/s and the fit; fusion: fused vs one collective per "
        "tensor; hitopk: MSTopK flat vs hierarchical, 2 hosts x 2 workers; "
        "overlap, overlap-lstm, overlap-resnet50: tfgc's buckets vs one "
        "exchange vs MWMS's bytes_per_pack, 2 hosts (the -4hosts ones: 4); "
        "planner, "
        'planner-lstm, planner-resnet50: compressor="auto" vs its '
        "candidates and the tuned dense cases, 2 hosts, 100 Mbit/s to "
        "10 Gbit/s; "
        "convergence (first flag, no root): loss curves per compressor on "
        "real data, "
        "benchmarks/convergence_benchmark.py",
    )
    parser.add_argument("--hosts", help="hosts, e.g. 4; a comma list sweeps")
    parser.add_argument("--workers_per_host", type=int)
    parser.add_argument("--rate", help="per host and direction, e.g. 1gbit; "
                        "a comma list sweeps")  # fmt: skip
    parser.add_argument("--latency", help="one-way host to host, e.g. 0.2ms "
                        "(needs sch_netem); a comma list sweeps")  # fmt: skip
    parser.add_argument(
        "--model",
        choices=[
            "standin",
            "standin-small",
            "standin-compute",
            "lstm-medium",
            "resnet50",
        ],
        help="the 25 M-parameter Dense stand-in (communication-bound), its "
        "2.1 M smoke twin, its 25.2 M twin whose backward pass takes about "
        "as long as the all-reduce at 1 Gbit/s (six Dense(2048, relu) at "
        "batch 128), models/lstm_lm medium or models/resnet50_imagenet "
        "(synthetic data)",
    )
    parser.add_argument(
        "--compressors",
        help="space-separated, e.g. 'topk:0.001 powersgd:rank=4 "
        "signsgd:scaled=false,ef=0 mstopk:0.001,communicator=hierarchical'"
        " (error feedback unless ef=0; the hierarchical communicator "
        "groups each host's --workers_per_host workers)",
    )
    parser.add_argument("--steps", type=int, help="timed steps per case")
    parser.add_argument("--warmup", type=int, help="untimed steps first")
    parser.add_argument("--timeout", type=float, help="seconds, whole command")
    parser.add_argument(
        "--check_rate",
        action=argparse.BooleanOptionalAction,
        help="measure the TCP rate between two hosts first",
    )
    parser.add_argument(
        "--localhost",
        action="store_true",
        help="no namespaces, no shaping: workers on 127.0.0.1 (no root "
        "needed; no bytes on the wire)",
    )
    parser.add_argument(
        "--per_tensor",
        action=argparse.BooleanOptionalAction,
        help="also run each compressor with one collective per tensor "
        "(one CompressedOptimizer per variable) against tfgc's fusion",
    )
    parser.add_argument(
        "--unpipelined",
        action=argparse.BooleanOptionalAction,
        help="also run fp16 and each compressor in one exchange after the "
        "backward pass (bucket_bytes=None) against tfgc's buckets, which "
        "overlap it; the table then shows the share of communication hidden",
    )
    parser.add_argument(
        "--bytes_per_pack",
        type=int,
        help="also run dense fp32 through MultiWorkerMirroredStrategy with "
        "CommunicationOptions(bytes_per_pack=N), TensorFlow's own overlap "
        "(0: not)",
    )
    parser.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        help="build and warm up every case that communicates first, then "
        "time one step of each in turn, --steps rounds: the machine's slow "
        "spells fall on every case alike (each keeps its model in memory "
        "meanwhile); the no-communication cases follow one after another",
    )
    parser.add_argument(
        "--fit",
        action=argparse.BooleanOptionalAction,
        help="fit the cost model to the sweep, validate it on --holdout "
        "and predict 8 to 128 workers at 1 to 100 Gbit/s",
    )
    parser.add_argument(
        "--holdout", help="host counts left out of the fit, e.g. 3"
    )
    parser.add_argument(
        "--refit",
        metavar="JSON",
        help="fit a saved result (e.g. docs/benchmarks/costmodel.json) "
        "again and rewrite its files in --out; measures nothing",
    )
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="remove namespaces and links that a killed run left, and exit",
    )
    return parser


def _settings(args) -> argparse.Namespace:
    merged = dict(DEFAULTS, **PRESETS.get(args.preset, {}))
    for key in DEFAULTS:
        if getattr(args, key) is not None:
            merged[key] = getattr(args, key)
    out = argparse.Namespace(**vars(args))
    out.__dict__.update(merged)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--preset", "convergence"]:
        # Item 6: no network, its own script and flags (see its --help).
        script = os.path.join(REPO, "benchmarks", "convergence_benchmark.py")
        return subprocess.call([sys.executable, script, *argv[2:]])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cleanup:
        if not netns.have_net_admin():
            print(netns.no_privilege_message(), file=sys.stderr)
            return EXIT_USAGE
        removed = netns.cleanup_leftovers()
        print(f"[lab] removed {len(removed)}: {' '.join(removed) or '-'}")
        return 0
    if args.refit:
        return _refit(args, argv)
    args = _settings(args)
    try:
        host_counts = _int_list(args.hosts, "hosts")
        holdout = _int_list(args.holdout, "holdout") if args.fit else []
        if args.fit:
            cost_fit.split_hosts(host_counts, holdout)
        rates = [r for r in args.rate.split(",") if r]
        latencies = [x for x in args.latency.split(",") if x]
        for r in rates:
            netns.parse_rate(r)
        for x in latencies:
            netns.parse_time(x)
        cases(args.compressors)
    except ValueError as err:
        parser.error(str(err))
    if (
        not all(1 <= h <= netns.MAX_HOSTS for h in host_counts)
        or args.workers_per_host < 1
    ):
        parser.error("--hosts must be in [1, 99], --workers_per_host >= 1")
    try:
        check_compressors(args.compressors, args.workers_per_host)
    except ValueError as err:
        parser.error(str(err))
    if not args.localhost and not netns.have_net_admin():
        print(netns.no_privilege_message(), file=sys.stderr)
        return EXIT_USAGE

    def on_signal(signum, frame):
        raise _Terminated(signal.Signals(signum).name)

    previous = {
        s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)
    }
    start = time.monotonic()
    deadline = start + args.timeout
    grid = [
        (h, r, x)
        for h in host_counts
        for r, x in (
            [(None, "0")]
            if args.localhost
            else [(r, x) for r in rates for x in latencies]
        )
    ]
    command = "python -m benchmarks.run " + shlex.join(argv)
    spec_cases = cases(
        args.compressors, args.per_tensor, args.unpipelined, args.bytes_per_pack
    )
    runs = []
    code = 0
    try:
        for i, (hosts, rate, latency) in enumerate(grid):
            print(
                f"[lab] run {i + 1}/{len(grid)}: {hosts} hosts x "
                f"{args.workers_per_host} worker(s), rate {rate or 'unshaped'},"
                f" latency {latency}, {args.model}, "
                f"{len(spec_cases)} cases, "
                f"{deadline - time.monotonic():.0f} s left",
                flush=True,
            )
            t0 = time.monotonic()
            runs.append(
                run_once(args, spec_cases, hosts, rate, latency, deadline)
            )
            print(
                f"[lab] run {i + 1}/{len(grid)} done in "
                f"{time.monotonic() - t0:.0f} s",
                flush=True,
            )
    except TimeoutError as err:
        print(f"[lab] stopped: {err}", file=sys.stderr)
        code = EXIT_TIMEOUT
    except (cluster.WorkerFailed, RuntimeError) as err:  # ip, tc, tcprate
        print(f"[lab] failed: {err}", file=sys.stderr)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        print(
            "[lab] interrupted; everything created was removed", file=sys.stderr
        )
        code = 128 + signal.SIGINT
    except _Terminated as err:
        print(
            f"[lab] got {err}; everything created was removed", file=sys.stderr
        )
        code = 128 + signal.SIGTERM
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if code:
        return code
    results = {
        "preset": args.preset,
        "command": command,
        "settings": {k: getattr(args, k) for k in DEFAULTS}
        | {"localhost": args.localhost},
        "machine": machine(),
        "uptime": subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "seconds": round(time.monotonic() - start, 1),
        "runs": runs,
    }
    if args.fit:
        try:
            results["cost_model"] = cost_fit.analyse(results, holdout)
        except (ValueError, ArithmeticError) as err:
            # The measurements are still written: --refit can try again.
            print(f"[lab] fit failed: {err}", file=sys.stderr)
            code = EXIT_FAILED
    paths = report.write(results, args.out, args.preset or "custom")
    print(f"[lab] wrote {', '.join(paths)}")
    return code


def _int_list(text, name: str) -> list[int]:
    try:
        return [int(h) for h in str(text).split(",") if h]
    except ValueError:
        raise ValueError(
            f"`{name}` must be a comma list of integers. Received: "
            f"{name}={text!r}"
        ) from None


def _refit(args, argv: list[str]) -> int:
    """Fits a saved sweep again (after a change to the fit, or another
    --holdout) and rewrites its files; the measurements stay as they were."""
    with open(args.refit) as f:
        results = json.load(f)
    holdout = _int_list(
        args.holdout or results["settings"].get("holdout", "3"), "holdout"
    )
    results["cost_model"] = cost_fit.analyse(results, holdout)
    results["cost_model"]["command"] = "python -m benchmarks.run " + (
        shlex.join(argv)
    )
    stem = os.path.splitext(os.path.basename(args.refit))[0]
    paths = report.write(results, args.out, stem)
    print(f"[lab] wrote {', '.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
