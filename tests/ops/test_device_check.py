"""The GPU check script (custom_ops/cuda_harness/device_check.py) on the CPU
emulation of CUDA, so that it works the day a GPU is at hand, and how it
judges what its commands print."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join(ROOT, "custom_ops", "cuda_harness", "device_check.py")
sys.path.insert(0, ROOT)
from custom_ops.cuda_harness import device_check as dc  # noqa: E402
from custom_ops.cuda_harness import run_harness  # noqa: E402

needs_emulation = pytest.mark.skipif(
    not sys.platform.startswith("linux") or run_harness.find_cxx() is None,
    reason="the CUDA emulation needs Linux and a C++ compiler",
)


def device_check(report: str, *args: str, timeout: int = 900):
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--emulate", "--quick", report, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    with open(os.path.join(report, "ops_gpu.json")) as f:
        return proc, json.load(f)


@needs_emulation
@pytest.mark.slow
def test_every_step_runs_on_the_emulation(tmp_path):
    proc, state = device_check(str(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert [s["name"] for s in state["steps"]] == [
        "build", "checks", "sanitizers", "timings",
    ]  # fmt: skip
    assert {s["status"] for s in state["steps"]} == {"passed"}, state["steps"]
    assert state["exit_code"] == 0
    # Every check at the small and the large sizes, each with cases.
    runs = {r["run"] for r in state["checks"]}
    for check in run_harness.CHECKS:
        assert f"{check} small" in runs and f"{check} 30011" in runs, runs
    assert all(r["cases"] > 0 and r["failures"] == 0 for r in state["checks"])
    assert {r["check"] for r in state["sanitizers"]} == set(run_harness.CHECKS)
    tables = state["timings"]["tables"]
    assert set(tables) == set(dc.timings_lib.TABLES)
    assert all(t["rows"] and t["command"] for t in tables.values())
    assert all(r["ms"] > 0 for r in tables["top_k_sample"]["rows"])
    assert [r["rule"] for r in tables["fused_update"]["rows"]] == [
        "momentum", "adam",
    ]  # fmt: skip
    assert all(r["tensors"] == 161 for r in tables["fused_update"]["rows"])
    md = (tmp_path / "ops_gpu.md").read_text()
    for heading in ("## Steps", "## Checks against numpy", "## Timings",
                    "### segments", "### fused_update",
                    "not a GPU"):  # fmt: skip
        assert heading in md, md[:3000]
    log = (tmp_path / "device_check.log").read_text()
    assert "=== top_k_sample small: rc=0" in log


@needs_emulation
def test_a_run_out_of_time_keeps_its_report(tmp_path):
    # Two seconds cannot build the library: the build is stopped, the run
    # says it did not finish (exit 3, not success), and the report exists.
    proc, state = device_check(str(tmp_path), "--budget", "2", timeout=120)
    assert proc.returncode == dc.EXIT_INCOMPLETE, proc.stdout + proc.stderr
    assert state["steps"] == [
        {**state["steps"][0], "name": "build", "status": "timed out"}
    ]
    assert "timed out" in (tmp_path / "ops_gpu.md").read_text()


def _cuda_device_visible() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                          check=False)  # fmt: skip
    return proc.returncode == 0 and b"GPU" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
@pytest.mark.skipif(_cuda_device_visible(), reason="a GPU would run it all")
def test_without_a_gpu_the_real_build_runs_and_exit_is_2(tmp_path):
    # The GPU path as far as a machine without a GPU can take it: the GPU
    # named by nvidia-smi (a stand-in here), the library built by nvcc for
    # its architecture alone, then exit 2 as no device answers.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *query-gpu*) '
        'echo "NVIDIA H100 80GB HBM3, 9.0, 580.159.04, 81559 MiB";; '
        "*) echo fake nvidia-smi;; esac\n"
    )
    fake.chmod(0o755)
    report = tmp_path / "report"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, SCRIPT, str(report)],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == dc.EXIT_NO_DEVICE, out[-3000:]
    state = json.loads((report / "ops_gpu.json").read_text())
    assert state["machine"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert state["machine"]["arch"] == "sm_90"
    assert "--arch sm_90" in state["build_command"]
    assert [(s["name"], s["status"]) for s in state["steps"]] == [
        ("build", "passed"), ("device", "missing"),
    ]  # fmt: skip


def job_result(output: str, returncode: int | None) -> dc.JobResult:
    return dc.JobResult("memcheck bits", "cmd", returncode, 1.0, output)


def harness_results(tmp_path, failures: int) -> dc.Job:
    path = tmp_path / "r.json"
    counts = {"cases": 10, "failures": failures, "skipped_inputs": 0}
    path.write_text(json.dumps({"checks": {"bits": counts}}))
    return dc.Job("memcheck bits", ["cmd"], str(path))


def test_check_runs_are_judged_by_their_counts(tmp_path):
    passed = dc.harness_counts(harness_results(tmp_path, 0), job_result("", 0))
    assert passed == {"status": "passed", "cases": 10, "failures": 0,
                      "skipped_inputs": 0}  # fmt: skip
    failed = dc.harness_counts(harness_results(tmp_path, 2), job_result("", 1))
    assert failed["status"] == "failed" and failed["failures"] == 2
    # Cut off before writing its counts: the mismatches it printed fail
    # it; with none it is only incomplete; a crash fails it.
    missing = dc.Job("top_k", ["cmd"], str(tmp_path / "none.json"))
    cut = dc.harness_counts(missing, job_result("MISMATCH a\nok b\n", None))
    assert cut["status"] == "failed" and cut["failures"] == 1
    assert dc.harness_counts(missing, job_result("ok b\n", None))[
        "status"] == "timed out"  # fmt: skip
    assert dc.harness_counts(missing, job_result("Abort", -6))[
        "status"] == "failed"  # fmt: skip


MEMCHECK_ERROR = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at tfgc::gpu::HistKernel+0x1a0
========= ERROR SUMMARY: 1 error
"""
RACECHECK_CLEAN = """\
========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""
RACE = "========= Error: Race reported between Write access at Foo\n"
REFUSED = """\
========= COMPUTE-SANITIZER
========= Error: Device not supported. Please refer to the documentation
========= Error: Target application returned an error
"""


def test_sanitizer_runs_are_judged_by_what_the_sanitizer_printed(tmp_path):
    clean = harness_results(tmp_path, 0)
    errors = dc.sanitizer_counts(clean, job_result(MEMCHECK_ERROR, 99))
    assert errors["status"] == "failed" and errors["errors"] == 1
    assert errors["summary"] == "ERROR SUMMARY: 1 error"
    race = dc.sanitizer_counts(clean, job_result(RACE + RACECHECK_CLEAN, 0))
    assert race["status"] == "failed" and race["errors"] == 1
    ok = dc.sanitizer_counts(clean, job_result(RACECHECK_CLEAN, 0))
    assert ok["status"] == "passed" and ok["errors"] == 0
    missing = dc.Job("memcheck bits", ["cmd"], str(tmp_path / "none.json"))
    refused = dc.sanitizer_counts(missing, job_result(REFUSED, 1))
    assert refused["status"] == "refused"
    # Cut off: the cases it printed with -v.
    cut = dc.sanitizer_counts(missing, job_result("ok a\nok b\n", None))
    assert cut["status"] == "timed out" and cut["cases"] == 2


def test_steps_and_exit_codes():
    assert dc.step_status([]) == "skipped"
    assert dc.step_status([{"status": "passed"}]) == "passed"
    assert dc.step_status([{"status": "passed"}, {"status": "refused"}]) == (
        "incomplete"
    )
    assert dc.step_status([{"status": "refused"}, {"status": "failed"}]) == (
        "failed"
    )


def test_commands_are_shown_as_a_person_reruns_them():
    command = [
        sys.executable,
        "run_harness.py",
        "--no-build",
        "--library",
        "/tmp/x/lib.so",
        "--checks",
        "bits",
        "--results",
        "/tmp/r",
    ]
    assert dc.shown(command) == (
        "python3 run_harness.py --no-build --checks bits"
    )  # fmt: skip


def test_kernel_names_are_shortened_to_the_kernel_and_its_types():
    short = dc.timings_lib.short_kernel_name
    assert short(
        "void tfgc::gpu::(anonymous namespace)::HistKernel<float, 3>"
        "(float const*, long)"
    ) == "HistKernel<float, 3>"  # fmt: skip
    assert short("tfgc::gpu::(anonymous namespace)::PlanKernel(long*)") == (
        "PlanKernel"
    )
    assert short("Memset (Device)") == "Memset (Device)"


def test_the_report_says_where_each_calls_time_goes():
    records = [
        {
            "table": "scatter_add_sum",
            "call": "tfgc_scatter_add_sum",
            "args": [0, 102232, 25557032],
            "kernels": [
                ["ScatterPassKernel<float>", 4, 300.0],
                ["Memset", 2, 40.5],
            ],
        }
    ]
    table = dc.timings_lib.kernel_lines(records)
    row = table.splitlines()[-1]
    assert row.startswith(
        "| scatter_add_sum | tfgc_scatter_add_sum | 0 102232 25557032 | 6 |"
    )
    assert "340.5" in row
    assert "ScatterPassKernel<float> 300.0 (x4); Memset 40.5 (x2)" in row
    # The report of the first H100 run (made before the records), with them.
    results = os.path.join(ROOT, "benchmarks", "results")
    with open(os.path.join(results, "ops_gpu_first_run.json")) as f:
        state = json.load(f)
    assert "## Where the time goes" not in dc.render(state)
    state["timings"]["kernels"] = records
    assert "## Where the time goes" in dc.render(state)
