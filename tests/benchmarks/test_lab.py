"""The benchmark lab: set-up, shaping, counters and tear-down.

As root (or with CAP_NET_ADMIN) every privileged test runs and fails on
anything wrong, a missing `ip` or `tc` included; without the privilege
they skip and say why. The smoke test's TCP rate is the one timing check:
the issue asks that the shaping hold the configured rate within 15 %.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import pytest

from benchmarks import run as lab_run
from benchmarks.lab import netns, report, worker

REPO = Path(__file__).resolve().parents[2]
PRIVILEGED = netns.have_net_admin()
needs_net_admin = pytest.mark.skipif(
    not PRIVILEGED,
    reason="needs root or CAP_NET_ADMIN to create network namespaces, "
    "veth pairs and tc qdiscs",
)


def _lab(*args: str, env=None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.run", *args],
        cwd=REPO,
        env=dict(os.environ, **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def _marked_smoke(tmp_path, *args: str) -> tuple[str, subprocess.Popen]:
    """The smoke preset without its rate check, its processes marked by
    an environment variable that `_processes_with` finds."""
    marker = f"TFGC_LAB_TEST_{uuid.uuid4().hex}"
    proc = _lab(
        "--preset", "smoke", "--no-check_rate", "--out", str(tmp_path),
        *args, env={marker: "1"},
    )  # fmt: skip
    return marker, proc


def _ours() -> tuple[set, set]:
    return set(netns.list_namespaces()), set(netns.list_links())


def _state_files() -> set:
    path = Path(netns.STATE_DIR)
    return set(path.iterdir()) if path.is_dir() else set()


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment carries `marker` (the lab's children)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


# --- without privilege ------------------------------------------------------


def test_parsers():
    assert netns.parse_rate("1gbit") == 1e9
    assert netns.parse_rate("100mbit") == 1e8
    assert netns.parse_time("0.2ms") == pytest.approx(2e-4)
    assert netns.parse_time("0") == 0
    with pytest.raises(ValueError, match="rate"):
        netns.parse_rate("1gb")
    with pytest.raises(ValueError, match="latency"):
        netns.parse_time("fast")
    case = lab_run.parse_compressor("topk:0.001")
    assert case["kwargs"] == {"density": 0.001} and case["error_feedback"]
    case = lab_run.parse_compressor("signsgd:scaled=false,ef=0")
    assert case["kwargs"] == {"scaled": False} and not case["error_feedback"]
    names = [c["name"] for c in lab_run.cases("topk:0.01")]
    assert names == [
        "dense fp32",
        "dense fp16",
        "topk 0.01 +EF",
        "synchronisation only",
        "no communication",
        "topk 0.01 +EF, no communication",
    ]
    unfused = lab_run.cases("topk:0.01", per_tensor=True)[3]
    assert unfused["name"] == "topk 0.01 +EF, per tensor"
    assert unfused["kind"] == "compressed_per_tensor"


def test_transport_factors():
    assert worker.transport_factor("all_reduce", 4) == 1.5
    assert worker.transport_factor("all_gather", 4) == 3
    assert worker.transport_factor("broadcast", 4) == 0.75
    assert worker.transport_factor("unknown", 4) is None


def test_interleaved_steps_take_turns_and_sum_each_cases_bytes(
    monkeypatch,
):
    log, sent = [], iter(range(0, 1000, 10))
    monkeypatch.setattr(
        worker,
        "read_counters",
        lambda netdev: {"tx_bytes": next(sent), "rx_bytes": 0},
    )

    def case(name):
        def one_step():
            log.append(name)
            return len(log) / 1000

        return worker.Prepared({"name": name}, None, [], one_step, False)

    measured = worker.interleaved(
        [case("a"), case("b")], 3, lambda: log.append("|"), "veth"
    )
    steps = [x for x in log if x != "|"]
    assert steps == ["a", "b"] * 3
    (a_times, a_sent), (b_times, b_sent) = measured
    assert len(a_times) == len(b_times) == 3
    # Each step's counters are read between barriers, 10 bytes apart.
    assert a_sent == {"tx_bytes": 30, "rx_bytes": 0} == b_sent
    assert log[:5] == ["|", "|", "a", "|", "|"]


def test_compressor_options_and_cases():
    case = lab_run.parse_compressor("mstopk:0.001,communicator=hierarchical")
    assert case["kwargs"] == {"density": 0.001}
    assert case["communicator"] == "hierarchical"
    assert lab_run.parse_compressor("topk:0.01")["communicator"] == "auto"
    case = lab_run.parse_compressor("redsync:0.001,cost_model=none")
    assert case["kwargs"] == {"density": 0.001, "cost_model": None}
    # One local (no communication) case per compressor, not per
    # communicator.
    local = [
        c["name"]
        for c in lab_run.cases("mstopk:0.001 mstopk:0.001,communicator=x")
        if c["kind"] == "local_compressed"
    ]
    assert local == ["mstopk 0.001 +EF, no communication"]


@pytest.mark.parametrize(
    "entry, words",
    [
        ("nosuch:0.1", ["Unknown compressor 'nosuch'"]),
        ("topk:2", ["`density`", "density=2"]),
        ("acpsgd:0.001", ["density"]),  # a rank, not a density
        ("topk:0.01,communicator=allreduce", ["cannot carry"]),
        ("topk:0.01,communicator=ring", ["Unknown communicator"]),
    ],
)
def test_a_bad_compressor_is_a_usage_error_before_anything_starts(
    monkeypatch, capsys, entry, words
):
    started = []

    def must_not_run(*args, **kwargs):
        started.append(args)
        raise AssertionError("started before the compressors were checked")

    # As if privileged: the check must come before any namespace or worker.
    monkeypatch.setattr(netns, "have_net_admin", lambda: True)
    monkeypatch.setattr(netns, "Testbed", must_not_run)
    monkeypatch.setattr(lab_run.cluster, "run", must_not_run)
    for mode in ([], ["--localhost"]):
        with pytest.raises(SystemExit) as exit:
            lab_run.main(
                ["--hosts", "2", "--compressors", f"topk:0.001 {entry}", *mode]
            )
        assert exit.value.code == lab_run.EXIT_USAGE
        err = capsys.readouterr().err
        assert f"entry {entry!r}" in err, err
        assert "Known compressors: acpsgd" in err and "mstopk" in err, err
        for word in words:
            assert word in err, err
    assert not started


def test_analytic_bytes_per_host_link():
    """A flat ring's host link carries what one worker sends; under the
    hierarchical communicator, the host's g compressed shards, each
    exchanged among the m hosts, and the small tensors' all-reduce."""
    import tfgc

    kernel = types.SimpleNamespace(shape=(1024, 1024), dtype="float32")
    bias = types.SimpleNamespace(shape=(1024,), dtype="float32")

    class Flat:
        name = "auto"

        def compressed_shape(self, shape):
            return shape

        def sends_dense(self, shape):
            return False

    class Hierarchical(Flat):
        name = "hierarchical"

        def compressed_shape(self, shape):
            return (shape[0] // 2, *shape[1:]) if len(shape) > 1 else shape

        def sends_dense(self, shape):
            return len(shape) < 2

    def optimizer(compressor, communicator):
        return types.SimpleNamespace(
            compressor=compressor,
            communicator=communicator,
            min_compress_size=2048,  # the bias goes dense
            network_cost=None,
        )

    case = {"kind": "compressed"}
    mstopk = tfgc.compressors.MSTopK(0.001)
    flat = worker.analytic_bytes(
        case, optimizer(mstopk, Flat()), [kernel, bias], 4
    )
    k = 1049  # ceil(0.001 * 1024**2)
    assert flat["wire_bytes"] == 3 * k * 8 + 1.5 * 1024 * 4
    hier = worker.analytic_bytes(
        case, optimizer(mstopk, Hierarchical()), [kernel, bias], 4, 2
    )
    shard_k = 525  # ceil(0.001 * 512 * 1024)
    assert hier["wire_bytes"] == 2 * 1 * shard_k * 8 + 1.5 * 1024 * 4
    # SBC with a delay exchanges once per `delay` steps, the tensors it
    # sends dense (the bias) too.
    sbc = tfgc.compressors.SBC(0.001, delay=4)
    sbc1 = tfgc.compressors.SBC(0.001)
    one = worker.analytic_bytes(
        case, optimizer(sbc1, Flat()), [kernel, bias], 4
    )
    four = worker.analytic_bytes(
        case, optimizer(sbc, Flat()), [kernel, bias], 4
    )
    assert four["wire_bytes"] == pytest.approx(one["wire_bytes"] / 4)
    assert four["payload_bytes"] == pytest.approx(one["payload_bytes"] / 4)
    # Importance pruning: the root's positions broadcast, the values
    # all-reduced.
    importance = tfgc.compressors.ImportancePruning(0.001)
    wire = worker.analytic_bytes(
        case, optimizer(importance, Flat()), [kernel], 4
    )["wire_bytes"]
    assert wire == pytest.approx(k * 4 * 0.75 + k * 4 * 1.5)
    # Its flat broadcast among 2 hosts x 2 workers: not modelled.
    two_per_host = worker.analytic_bytes(
        case, optimizer(importance, Flat()), [kernel], 4, 2
    )
    assert two_per_host["wire_bytes"] is None
    assert two_per_host["payload_bytes"] == k * 4 * 2


def test_steal_share_is_the_hypervisors_part_of_the_cpu_time():
    # user, nice, system, idle, iowait, irq, softirq, steal, guest, ...
    before = [10, 0, 10, 70, 0, 0, 0, 10, 5, 0]
    after = [20, 0, 20, 140, 0, 0, 0, 30, 9, 0]
    assert lab_run._steal_share(before, after) == pytest.approx(20 / 110)
    assert lab_run._steal_share([], after) is None
    assert lab_run._steal_share(after, after) is None  # no time passed
    assert len(lab_run._cpu_ticks()) >= 8  # Linux


def test_summary_relates_cases():
    def case(name, kind, t, tx):
        return {
            "name": name,
            "kind": kind,
            "median_step_s": t,
            "counters_delta": {"tx_bytes": tx, "rx_bytes": tx},
            "analytic": None
            if kind == "floor"
            else {"payload_bytes": 100, "wire_bytes": 200.0},
            "tfgc_stats": None,
        }

    cases = [
        case("dense fp32", "dense_fp32", 2.0, 4000),
        case("dense fp16", "compressed", 1.0, 2000),
        case("no communication", "floor", 0.5, 0),
    ]
    rows = report.summarize([{"cases": cases}] * 2, 2, 1, steps=10)
    fp32, fp16, floor = rows
    assert fp16["speedup_vs_fp32"] == 2 and fp16["speedup_vs_fp16"] == 1
    assert fp32["times_floor"] == 4 and floor["times_floor"] == 1
    assert fp32["measured_tx_bytes"] == 400
    assert fp32["measured_over_analytic"] == 2
    # One host: nothing crosses a link.
    assert (
        report.summarize([{"cases": cases}], 1, 1, 10)[0]["analytic_wire_bytes"]
        == 0
    )


def test_summary_compares_with_the_best_dense_case_and_the_unpipelined():
    def case(name, kind, t):
        return {
            "name": name,
            "kind": kind,
            "median_step_s": t,
            "counters_delta": None,
            "analytic": None,
            "tfgc_stats": None,
        }

    cases = [
        case("dense fp32", "dense_fp32", 2.0),
        case("dense fp32, bytes_per_pack=25 MiB", "dense_fp32", 0.8),
        case("dense fp16", "compressed", 1.0),
        case("topk 0.001 +EF", "compressed", 0.6),
        case("topk 0.001 +EF" + report.UNPIPELINED_SUFFIX, "compressed", 0.9),
        case("no communication", "floor", 0.5),
    ]
    rows = {
        r["name"]: r for r in report.summarize([{"cases": cases}] * 2, 2, 1, 10)
    }
    topk = rows["topk 0.001 +EF"]
    # The packed fp32 is the fastest dense case here, not fp16.
    assert topk["speedup_vs_best_dense"] == pytest.approx(0.8 / 0.6)
    assert topk["hidden_share"] == pytest.approx(0.3 / 0.4)
    assert "hidden_share" not in rows["dense fp16"]  # no twin ran
    table = report.markdown(
        {
            "machine": {"cpu": "x", "cores": 2, "kernel": "k"},
            "preset": "overlap",
            "command": "c",
            "seconds": 1,
            "uptime": "u",
            "runs": [
                {
                    "rate": "1gbit",
                    "latency": "0",
                    "hosts": 2,
                    "workers_per_host": 1,
                    "load_before": [0],
                    "load_after": [0],
                    "custom_ops": True,
                    "cases": list(rows.values()),
                }
            ],
        },
        [],
    )
    row = (
        "| topk 0.001 +EF | 600.0 | 1.67 | 3.33x | 1.67x | 1.33x | 1.20 | 75 %"
    )
    assert row in table


def test_cases_add_the_packed_dense_and_the_unpipelined_twins():
    names = [
        c["name"]
        for c in lab_run.cases(
            "topk:0.001 topk:0.01,bucket_bytes=none acpsgd:rank=4",
            unpipelined=True,
            bytes_per_pack=25 * 2**20,
        )
    ]
    assert names[:3] == [
        "dense fp32",
        "dense fp32, bytes_per_pack=25 MiB",
        "dense fp16",
    ]
    # A twin for fp16 and for the entry that did not choose its buckets.
    assert "dense fp16, unpipelined" in names
    assert "topk 0.001 +EF, unpipelined" in names
    assert not any("0.01" in n and "unpipelined" in n for n in names)
    # ACP-SGD's own bucket size stays with bucket_bytes=None: no twin.
    assert not any("acpsgd" in n and "unpipelined" in n for n in names)
    chosen = lab_run.parse_compressor("topk:0.01,bucket_bytes=none")
    assert (
        chosen["bucket_bytes"] is None
        and "bucket_bytes" not in chosen["kwargs"]
    )


def test_auto_with_trials_gets_a_twin_with_its_plan_fixed():
    listed = lab_run.cases("topk:0.01 auto auto:trial_steps=none")
    twins = [c for c in listed if c.get("plan_of")]
    # Only where trials switch plans; after the case whose plan it runs.
    assert [c["name"] for c in twins] == ["auto +EF, its plan fixed"]
    names = [c["name"] for c in listed]
    assert names.index("auto +EF") < names.index(twins[0]["name"])
    assert twins[0]["plan_of"] == "auto +EF"


def test_plan_lines_set_auto_beside_fixed_cases_and_its_twin():
    def row(name, step, plan=None):
        return {
            "name": name,
            "kind": "compressed",
            "step_s": step,
            "median_step_s": step,
            "plan": plan,
            "speedup_vs_best_dense": 1.5,
        }

    plan = {
        "table": "caption\n| bucket |",
        "report": {
            "exchanges": 5,
            "exposed": 0.25,
            "critical": 0.2,
            "predicted_exposed": 0.1,
            "busy": [0.3],
            "predicted_busy": [0.25],
            "trials": [[0.3, 0.1, 0.2], [0.25, 0.5, 0.4]],
        },
    }
    text = "\n".join(
        report.plan_lines(
            [
                row("topk", 1.0),
                row("auto", 1.1, plan),
                row("auto" + report.PLAN_FIXED_SUFFIX, 0.88),
            ]
        )
    )
    # The twin is not a fixed candidate: the best fixed case is TopK.
    assert "best fixed case (1,000.0 ms): 1.10x" in text
    assert "built without the trials' switch" in text
    assert "880.0 ms, auto 1.25x that" in text
    # Predicted: the measured 1.1 s less the 0.2 s the worker ready last
    # left exposed (not this worker's 0.25) plus 0.1 predicted.
    assert "1,000.0 ms, measured here 1,100.0 ms (-9 %)" in text
    # Each plan tried: the median of its trial periods.
    assert "in the order tried: 200.0; 400.0 ms." in text


def test_each_strategys_options_get_their_own_workers(monkeypatch, tmp_path):
    spec = {
        "cases": lab_run.cases("topk:0.001", bytes_per_pack=1024),
        "steps": 1,
    }
    started = []

    def fake_run_workers(workers, part, result_dir, deadline):
        started.append(part["bytes_per_pack"])
        for i in range(len(workers)):
            with open(os.path.join(result_dir, f"worker{i}.json"), "w") as f:
                json.dump({"worker": i, "cases": part["cases"]}, f)

    monkeypatch.setattr(lab_run, "_run_workers", fake_run_workers)
    per_worker = lab_run._run_groups([None, None], spec, str(tmp_path), 0)
    assert started == [0, 1024]
    for result in per_worker:
        assert result["cases"] == spec["cases"]  # the spec's order


def test_without_privilege_says_so_and_offers_localhost(tmp_path):
    if PRIVILEGED and os.geteuid() != 0:
        pytest.skip("cannot drop CAP_NET_ADMIN without being root")
    if not PRIVILEGED:
        proc = _lab("--preset", "smoke", "--out", str(tmp_path))
    else:  # root: drop every capability for the child
        proc = subprocess.Popen(
            ["setpriv", "--inh-caps=-all", "--bounding-set=-all",
             sys.executable, "-m", "benchmarks.run", "--preset", "smoke",
             "--out", str(tmp_path)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == lab_run.EXIT_USAGE, out
    assert "CAP_NET_ADMIN" in out and "--localhost" in out
    assert not list(tmp_path.iterdir())


# --- with privilege ---------------------------------------------------------


@needs_net_admin
def test_cleanup_removes_a_killed_runs_leftovers_only():
    before = _ours()
    # A run that dies without tearing down (os._exit skips __exit__).
    code = (
        "import os; from benchmarks.lab import netns\n"
        "tb = netns.Testbed(2, '1gbit').__enter__()\n"
        "print(tb.state_file, flush=True); os._exit(0)\n"
    )
    dead = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    state_file = dead.stdout.strip()
    left_ns, left_links = (a - b for a, b in zip(_ours(), before))
    assert len(left_ns) == 2 and len(left_links) == 3  # bridge, 2 veths
    with netns.Testbed(1, "1gbit") as alive:
        proc = _lab("--cleanup")
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        namespaces, links = _ours()
        assert not left_ns & namespaces and not left_links & links
        assert not os.path.exists(state_file)
        # A live run's testbed is left alone.
        assert alive.hosts[0].namespace in namespaces
        assert alive.bridge in links
    assert _ours() == before


@needs_net_admin
def test_a_testbed_never_takes_a_live_ones_names(monkeypatch):
    before = _ours()
    with netns.Testbed(1, None) as first:
        other = "beef" if first.run_id != "beef" else "cafe"
        ids = iter([first.run_id, first.run_id, other])
        monkeypatch.setattr(netns.secrets, "token_hex", lambda n: next(ids))
        with netns.Testbed(1, None) as second:
            assert second.run_id == other
        # The second one's teardown left the first one alone.
        assert first.hosts[0].namespace in netns.list_namespaces()
        assert first.bridge in netns.list_links()
    assert _ours() == before


@needs_net_admin
@pytest.mark.multiworker
def test_smoke_preset(tmp_path):
    before = _ours(), _state_files()
    proc = _lab("--preset", "smoke", "--out", str(tmp_path))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert "[lab] run 1/1" in out  # the progress line

    # Tear-down: nothing of this run is left, its record neither. (Only
    # what appeared is checked: another lab run may end meanwhile.)
    (namespaces, links), states = before
    (namespaces_after, links_after), states_after = _ours(), _state_files()
    assert not namespaces_after - namespaces
    assert not links_after - links
    assert not states_after - states

    results = json.loads((tmp_path / "smoke.json").read_text())
    (run,) = results["runs"]
    # Set-up: both ends of both hosts' links shaped with tbf at 1 Gbit/s.
    qdiscs = run["qdiscs"].splitlines()
    assert len(qdiscs) == 4
    assert all("tbf" in q and "rate 1Gbit" in q for q in qdiscs), qdiscs
    # Shaping: TCP both ways within 15 % of the configured rate.
    assert len(run["rate_check"]) == 2
    for check in run["rate_check"]:
        assert abs(check["rate_bits"] / 1e9 - 1) <= 0.15, check

    rows = {r["name"]: r for r in run["cases"]}
    assert list(rows) == [
        "dense fp32",
        "dense fp16",
        "topk 0.01 +EF",
        "synchronisation only",
        "no communication",
        "topk 0.01 +EF, no communication",
    ]
    for row in rows.values():
        assert row["median_step_s"] > 0
    dense = rows["dense fp32"]
    # 2.1 M float32 in a 2-worker ring all-reduce: 2(n-1)/n = 1 buffer.
    params = 2 * (1024 * 1024 + 1024)
    assert dense["analytic_wire_bytes"] == 4 * params
    for name in ("dense fp32", "dense fp16", "topk 0.01 +EF"):
        row = rows[name]
        assert row["measured_tx_bytes"] > 0
        # Headers and barriers on top, never less than the payload.
        assert 0.98 <= row["measured_over_analytic"] <= 1.15, row
        assert 0.9 <= row["measured_rx_bytes"] / row["measured_tx_bytes"] <= 1.1
    # tfgc's own byte count is the formula's.
    for name in ("dense fp16", "topk 0.01 +EF"):
        assert (
            rows[name]["tfgc_sent_bytes"]
            == rows[name]["analytic_payload_bytes"]
        )
    # The floor and the compressor's local step have no collective; the
    # synchronised floor one of 4 bytes.
    assert rows["synchronisation only"]["analytic_wire_bytes"] == 4.0
    for name in (
        "synchronisation only",
        "no communication",
        "topk 0.01 +EF, no communication",
    ):
        assert (
            rows[name]["measured_tx_bytes"] < 0.01 * dense["measured_tx_bytes"]
        )
    local = rows["topk 0.01 +EF, no communication"]
    assert local["compression_overhead_s"] == pytest.approx(
        local["median_step_s"] - rows["no communication"]["median_step_s"]
    )
    assert "Compression overhead" in (tmp_path / "smoke.md").read_text()

    markdown = (tmp_path / "smoke.md").read_text()
    assert results["machine"]["cpu"] in markdown
    assert "python -m benchmarks.run --preset smoke" in markdown
    assert 0 <= run["steal_share"] < 1 and "CPU steal" in markdown
    for png in ("smoke_step_time.png", "smoke_bytes.png"):
        assert (tmp_path / png).stat().st_size > 1000


@needs_net_admin
@pytest.mark.multiworker
def test_hierarchical_communicator_sends_only_shards_between_hosts(tmp_path):
    """2 hosts x 2 workers: the flat all-gather crosses the host links
    with every worker's payload, the hierarchical communicator with the
    host's compressed shards only; both as the analytic count says."""
    proc = _lab(
        "--preset", "hitopk", "--no-check_rate", "--steps", "2",
        "--warmup", "1", "--timeout", "170", "--out", str(tmp_path),
        "--compressors", "mstopk:0.01 mstopk:0.01,communicator=hierarchical",
    )  # fmt: skip
    out, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0, out
    (run,) = json.loads((tmp_path / "hitopk.json").read_text())["runs"]
    assert run["hosts"] == 2 and run["workers_per_host"] == 2
    rows = {r["name"]: r for r in run["cases"]}
    flat = rows["mstopk 0.01 +EF"]
    hierarchical = rows["mstopk 0.01,communicator=hierarchical +EF"]
    for row in (flat, hierarchical):
        assert 0.98 <= row["measured_over_analytic"] <= 1.15, row
    # Per kernel: 3 payloads of k leave a host in the flat ring, 2 shards
    # of k / 2 in the hierarchical exchange (the biases go dense in both).
    assert hierarchical["measured_tx_bytes"] < 0.5 * flat["measured_tx_bytes"]


@needs_net_admin
@pytest.mark.multiworker
def test_sigterm_tears_everything_down(tmp_path):
    before = _ours()
    marker, proc = _marked_smoke(tmp_path)
    try:
        # Wait until the workers run inside the namespaces.
        deadline = time.monotonic() + 60
        while len(_processes_with(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_processes_with(marker)) >= 3, "workers never started"
        assert _ours() != before
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert _ours() == before
    assert _processes_with(marker) == []
    assert not list(tmp_path.iterdir())


@needs_net_admin
@pytest.mark.multiworker
def test_timeout_bounds_the_run_and_tears_down(tmp_path):
    before = _ours()
    # Steps enough that no machine ends the run within the limit (the
    # smoke preset's own took 8 s on a fast day).
    marker, proc = _marked_smoke(
        tmp_path, "--timeout", "8", "--steps", "100000"
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == lab_run.EXIT_TIMEOUT, out
    assert "limit" in out
    assert _ours() == before
    assert _processes_with(marker) == []


@pytest.mark.multiworker
def test_localhost_mode(tmp_path):
    proc = _lab(
        "--localhost", "--hosts", "2", "--model", "standin-small",
        "--compressors", "topk:0.01", "--steps", "2", "--warmup", "1",
        "--per_tensor", "--interleave", "--timeout", "150",
        "--out", str(tmp_path),
    )  # fmt: skip
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    (run,) = json.loads((tmp_path / "custom.json").read_text())["runs"]
    assert run["rate"] is None and "qdiscs" not in run
    assert len(run["cases"]) == 7
    assert all("measured_tx_bytes" not in r for r in run["cases"])
    # One optimizer per variable sends what the fused one sends.
    rows = {r["name"]: r for r in run["cases"]}
    fused, unfused = rows["topk 0.01 +EF"], rows["topk 0.01 +EF, per tensor"]
    assert unfused["tfgc_sent_bytes"] == fused["tfgc_sent_bytes"] > 0
    markdown = (tmp_path / "custom.md").read_text()
    assert "unshaped (localhost)" in markdown
    assert "Interleaved: every case" in markdown
