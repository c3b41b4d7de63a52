"""Checks and times every CUDA kernel of tfgc on a bare GPU machine.

One command, run from the repository root the moment a GPU is at hand:

    python3 custom_ops/cuda_harness/device_check.py REPORT_DIR

Within `--budget` seconds (default 460, for an 8-minute slot) it runs, in
order, each step bounded in time and printing a progress line:

1. machine: `nvidia-smi`, `nvcc --version` and the Python packages; then
   builds the harness library for this GPU's architecture (sm_90 on an
   H100 or H200) with the real build's flags.
2. checks: run_harness.py's checks of every kernel against numpy, exact,
   at its GPU sizes (up to 1 M, every special input), at 25 M (every
   kernel) and 100 M (TopKSample) with the cases of training.
3. sanitizers: compute-sanitizer memcheck, racecheck and synccheck over
   the small sizes of every kernel; any error fails the run, a sanitizer
   that refuses the device is recorded as such.
4. timings: timings.py (CUDA events, median of several launches) against
   torch.topk and a device-to-device copy; SBC's two-sided selection
   against two one-sign trimmed selections; the many-tensor kernels
   (segmented TopKSample, FusedUpdate of ResNet-50's 161 variables)
   against one launch per tensor; with PyTorch, each timed call once
   more under its profiler, for the device time of every kernel.
5. report: REPORT_DIR/ops_gpu.md and ops_gpu.json, rewritten after every
   step so that a run cut short keeps what finished, and
   REPORT_DIR/device_check.log with every command's output.

Exit status: 0 every step complete and passed; 1 a check or a sanitizer
failed; 2 no CUDA device is visible; 3 nothing failed but a step did not
finish (time, a refused or missing tool).

`--emulate` runs the same steps on the CPU emulation of CUDA
(cuda_emulation.h; no sanitizer: the checks run plain), `--quick` with
small sizes: `--emulate --quick` takes a few minutes on two cores, and the
test suite runs it so that this script cannot rot between GPU runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
from custom_ops.cuda_harness import run_harness as rh  # noqa: E402
from custom_ops.cuda_harness import timings as timings_lib  # noqa: E402

RUN_HARNESS = os.path.relpath(os.path.join(HERE, "run_harness.py"), ROOT)
TIMINGS = os.path.relpath(os.path.join(HERE, "timings.py"), ROOT)
SANITIZERS = ("memcheck", "racecheck", "synccheck")
EXIT_FAILED, EXIT_NO_DEVICE, EXIT_INCOMPLETE = 1, 2, 3
LOG_LINES = 400  # of each command's output kept in device_check.log


class Plan(NamedTuple):
    """What the checks and sanitizers run: check sizes for every kernel
    (`small`, every case; `large`, the cases of training), large sizes for
    TopKSample alone, and the sanitizers' sizes with the largest input each
    tool gets (memcheck, then racecheck and synccheck)."""

    small: tuple[int, ...]
    large: tuple[int, ...]
    large_top_k: tuple[int, ...]
    max_case_size: int | None
    sanitizer_sizes: tuple[int, ...]
    memcheck_max: int
    race_sync_max: int


GPU_PLAN = Plan(
    rh.GPU_SIZES,
    (25_000_000,),
    (100_000_000,),
    None,
    (0, 1, 31, 33, 1000, 4097),
    1_000_000,
    4097,
)
EMULATION_PLAN = Plan(
    rh.EMULATION_SIZES,
    (100_003,),
    (),
    None,
    (0, 1, 33, 4097),
    1_000_000,
    4097,
)
QUICK_PLAN = Plan((0, 1, 33, 2049), (30_011,), (), 20_001, (0, 33), 4097, 4097)


class Job(NamedTuple):
    name: str
    command: list[str]
    results: str | None = None  # run_harness.py's --results file


class JobResult(NamedTuple):
    name: str
    command: str
    returncode: int | None  # None: stopped at its time limit
    seconds: float
    output: str


def shown(command: list[str]) -> str:
    """`command` as a person reruns it from the repository root: python3,
    the library at its default place (so --library and the work files
    go), and the build left to run_harness.py's --build-only."""
    kept = timings_lib.without_options(
        command, ("--library", "--results", "--json")
    )
    return shlex.join("python3" if a == sys.executable else a for a in kept)


def _join(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


class DeviceCheck:
    """The five steps, their time budget and the report they write."""

    SHARES = {
        "build": 0.25,
        "checks": 0.35,
        "sanitizers": 0.25,
        "timings": 0.15,
    }

    def __init__(
        self,
        report_dir: str,
        emulate: bool,
        quick: bool,
        budget: float,
        jobs: int,
    ):
        self.report_dir = report_dir
        self.emulate, self.quick = emulate, quick
        self.plan = (
            QUICK_PLAN if quick else (EMULATION_PLAN if emulate else GPU_PLAN)
        )
        self.deadline = time.monotonic() + budget
        self.jobs = max(1, jobs)
        self.work = tempfile.mkdtemp(prefix="tfgc_device_check_")
        self.library = os.path.join(
            self.work,
            "libtfgc_cuda_emulation.so"
            if emulate
            else "libtfgc_cuda_harness.so",
        )
        self.log_path = os.path.join(report_dir, "device_check.log")
        self.state: dict[str, Any] = {
            "title": "tfgc CUDA kernels on "
            + ("the CPU emulation (not a GPU)" if emulate else "a GPU"),
            "emulated": emulate,
            "quick": quick,
            "started": datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds"
            ),
            "command": shlex.join(
                ["python3", os.path.relpath(__file__, ROOT), *sys.argv[1:]]
            ),
            "budget_s": budget,
            "plan": self.plan._asdict(),
            "machine": {},
            "steps": [],
            "checks": [],
            "sanitizers": [],
            "timings": None,
            "goals": [],
        }
        os.makedirs(report_dir, exist_ok=True)
        with open(self.log_path, "w") as f:
            f.write(f"{self.state['command']}\n")

    # -- time and output ----------------------------------------------

    def allotted(self, step: str) -> float:
        """This step's share of the time left, by the shares of the steps
        not yet run: what a step leaves unused goes to the later ones."""
        done = {s["name"] for s in self.state["steps"]}
        left = [s for s in self.SHARES if s not in done]
        share = self.SHARES[step] / sum(self.SHARES[s] for s in left)
        return max(0.0, (self.deadline - time.monotonic()) * share)

    def say(self, text: str) -> None:
        print(f"[device-check] {text}", flush=True)

    def log(self, result: JobResult) -> None:
        lines = result.output.splitlines()
        kept = lines[-LOG_LINES:]
        mismatches = [ln for ln in lines[:-LOG_LINES] if "MISMATCH" in ln]
        with open(self.log_path, "a") as f:
            f.write(
                f"\n=== {result.name}: rc={result.returncode} "
                f"{result.seconds:.1f} s\n$ {result.command}\n"
            )
            if len(lines) > len(kept):
                f.write(
                    f"[{len(lines) - len(kept)} earlier lines left out, "
                    f"{len(mismatches)} of them mismatches:]\n"
                )
                f.writelines(ln + "\n" for ln in mismatches[:200])
            f.writelines(ln + "\n" for ln in kept)

    def write_report(self) -> None:
        path = os.path.join(self.report_dir, "ops_gpu")
        with open(path + ".json.tmp", "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(path + ".json.tmp", path + ".json")
        with open(path + ".md.tmp", "w") as f:
            f.write(render(self.state))
        os.replace(path + ".md.tmp", path + ".md")

    def finish_step(
        self, name: str, status: str, started: float, detail: str
    ) -> None:
        seconds = time.monotonic() - started
        self.state["steps"].append(
            {
                "name": name,
                "status": status,
                "seconds": round(seconds),
                "detail": detail,
            }
        )
        self.say(f"{name}: {status} in {seconds:.0f} s. {detail}")
        self.write_report()

    # -- running commands ---------------------------------------------

    def run(self, job: Job, timeout: float) -> JobResult:
        """Runs `job` in its own process group, output to a file, killed
        (with its children) at `timeout` seconds."""
        out_path = os.path.join(self.work, re.sub(r"\W+", "_", job.name))
        start = time.monotonic()
        with open(out_path + ".out", "w") as out:
            proc = subprocess.Popen(
                job.command,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            try:
                code = proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        with open(out_path + ".out", errors="replace") as f:
            output = f.read()
        result = JobResult(
            job.name,
            shown(job.command),
            code,
            time.monotonic() - start,
            output,
        )
        self.log(result)
        return result

    def run_all(self, jobs: list[Job], step_deadline: float):
        """Runs `jobs` `self.jobs` at a time, each until `step_deadline`;
        yields (job, result) as they finish."""
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            futures = {
                pool.submit(
                    lambda j: self.run(j, step_deadline - time.monotonic()), j
                ): j
                for j in jobs
            }
            for future in concurrent.futures.as_completed(futures):
                yield futures[future], future.result()

    def quick_command(self, command: list[str], timeout: float = 20) -> str:
        """What `command` prints, or why it printed nothing useful."""
        try:
            proc = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"not available ({shlex.join(command)}: {e})"
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            last = out.splitlines()[-1] if out else ""
            return (
                f"not available ({shlex.join(command)}: exit "
                f"{proc.returncode}; {last})"
            )
        return out

    # -- the steps -------------------------------------------------------

    def machine_and_build(self) -> bool:
        started = time.monotonic()
        m = self.state["machine"]
        m["python"] = sys.version.split()[0]
        m["numpy"] = rh.np.__version__
        m["platform"] = platform.platform()
        if self.emulate:
            cxx = rh.find_cxx()
            m["compiler"] = (
                self.quick_command([cxx, "--version"]).splitlines()[0]
                if cxx
                else "no C++ compiler"
            )
            m["gpu"] = "none (CPU emulation of CUDA)"
        else:
            m["nvidia_smi"] = self.quick_command(["nvidia-smi"])
            query = self.quick_command(
                [
                    "nvidia-smi",
                    "--query-gpu=name,compute_cap,driver_version,memory.total",
                    "--format=csv,noheader",
                ]
            ).splitlines() or ["nvidia-smi printed nothing"]
            fields = [f.strip() for f in query[0].split(",")]
            if len(fields) == 4:
                m["gpu"], m["compute_cap"], m["driver"], m["memory"] = fields
            else:
                m["gpu"] = query[0]
            m["nvcc"] = self.quick_command(["nvcc", "--version"])
            m["compute_sanitizer"] = self.quick_command(
                ["compute-sanitizer", "--version"]
            )
            m["torch"] = self.quick_command(
                [
                    sys.executable,
                    "-c",
                    "import torch; print(torch.__version__, 'CUDA',"
                    " torch.version.cuda, torch.cuda.is_available())",
                ]
            )
        command = [
            sys.executable,
            RUN_HARNESS,
            "--build-only",
            "--library",
            self.library,
        ]
        if self.emulate:
            command.append("--emulate")
        elif re.fullmatch(r"\d+\.\d+", m.get("compute_cap", "")):
            m["arch"] = "sm_" + m["compute_cap"].replace(".", "")
            command += ["--arch", m["arch"]]
        self.state["build_command"] = shown(command)
        self.write_report()
        self.say(f"building the harness: {shown(command)}")
        result = self.run(Job("build", command), self.allotted("build"))
        ok = result.returncode == 0
        status = (
            "passed"
            if ok
            else ("timed out" if result.returncode is None else "failed")
        )
        self.finish_step(
            "build",
            status,
            started,
            f"{m.get('gpu', '')} {m.get('arch', '')}".strip(),
        )
        return ok

    def harness_command(self, check: str, small, large, max_case) -> list[str]:
        command = [
            sys.executable,
            RUN_HARNESS,
            "--no-build",
            "--library",
            self.library,
            "--checks",
            check,
            "--check-sizes",
            _join(small),
            "--large-sizes",
            _join(large),
        ]
        if self.emulate:
            command.append("--emulate")
        if max_case is not None:
            command += ["--max-case-size", str(max_case)]
        return command

    def check_jobs(self) -> list[Job]:
        p = self.plan
        jobs = []
        for label, checks, small, large in (
            ("small", rh.CHECKS, p.small, ()),
            (_join(p.large), rh.CHECKS, (), p.large),
            (_join(p.large_top_k), ["top_k_sample"], (), p.large_top_k),
        ):
            if not small and not large:
                continue
            for check in checks:
                name = f"{check} {label}"
                results = os.path.join(self.work, re.sub(r"\W+", "_", name))
                command = self.harness_command(
                    check, small, large, p.max_case_size if small else None
                )
                jobs.append(
                    Job(
                        name,
                        [*command, "--results", results + ".json"],
                        results + ".json",
                    )
                )
        return jobs

    def checks(self) -> None:
        started = time.monotonic()
        deadline = started + self.allotted("checks")
        jobs = self.check_jobs()
        self.say(
            f"checks: {len(jobs)} runs of run_harness.py, {self.jobs} at a time"
        )
        for job, result in self.run_all(jobs, deadline):
            row = {
                "run": job.name,
                **harness_counts(job, result),
                "seconds": round(result.seconds),
                "command": result.command,
            }
            self.state["checks"].append(row)
            self.say(
                f"  {job.name}: {row['status']} ({row['cases']} cases, "
                f"{row['failures']} failures, {result.seconds:.0f} s)"
            )
            self.write_report()
        rows = self.state["checks"]
        self.finish_step(
            "checks",
            step_status(rows),
            started,
            f"{sum(r['cases'] for r in rows)} cases, "
            f"{sum(r['failures'] for r in rows)} failures",
        )

    def sanitizer_jobs(self) -> list[Job]:
        p = self.plan
        tools = ("none",) if self.emulate else SANITIZERS
        jobs = []
        for tool in tools:
            biggest = (
                p.memcheck_max
                if tool in ("memcheck", "none")
                else (p.race_sync_max)
            )
            for check in rh.CHECKS:
                name = f"{tool} {check}"
                results = os.path.join(self.work, re.sub(r"\W+", "_", name))
                command = self.harness_command(
                    check, p.sanitizer_sizes, (), biggest
                )
                command += ["--results", results + ".json", "-v"]
                if tool != "none":
                    command = [
                        "compute-sanitizer",
                        "--tool",
                        tool,
                        "--error-exitcode",
                        "99",
                        "--print-limit",
                        "50",
                        *command,
                    ]
                jobs.append(Job(name, command, results + ".json"))
        return jobs

    def sanitizers(self) -> None:
        started = time.monotonic()
        deadline = started + self.allotted("sanitizers")
        if not self.emulate and not shutil.which("compute-sanitizer"):
            self.finish_step(
                "sanitizers",
                "skipped",
                started,
                "compute-sanitizer was not found",
            )
            return
        jobs = self.sanitizer_jobs()
        self.say(f"sanitizers: {len(jobs)} runs, {self.jobs} at a time")
        for job, result in self.run_all(jobs, deadline):
            tool, check = job.name.split(" ", 1)
            row = {
                "tool": tool,
                "check": check,
                **sanitizer_counts(job, result),
                "seconds": round(result.seconds),
                "command": result.command,
            }
            self.state["sanitizers"].append(row)
            self.say(
                f"  {job.name}: {row['status']} ({row['cases']} cases, "
                f"{row['errors']} sanitizer errors, "
                f"{result.seconds:.0f} s)"
            )
            self.write_report()
        rows = self.state["sanitizers"]
        note = (
            "emulation: no compute-sanitizer, the checks ran plain. "
            if (self.emulate)
            else ""
        )
        self.finish_step(
            "sanitizers",
            step_status(rows),
            started,
            note + f"{sum(r['errors'] for r in rows)} errors",
        )

    def timings(self) -> None:
        started = time.monotonic()
        out = os.path.join(self.work, "timings.json")
        command = [
            sys.executable,
            TIMINGS,
            "--library",
            self.library,
            "--json",
            out,
        ]
        if self.emulate:
            command.append("--emulate")
        if self.quick:
            command.append("--quick")
        self.say(f"timings: {shown(command)}")
        result = self.run(Job("timings", command), self.allotted("timings"))
        if os.path.exists(out):
            with open(out) as f:
                self.state["timings"] = json.load(f)
            tables = {
                k: t["rows"] for k, t in self.state["timings"]["tables"].items()
            }
            self.state["goals"] = [
                g._asdict() for g in timings_lib.goals(tables)
            ]
        if result.returncode == 0:
            status = "passed"
        elif result.returncode is None:
            status = "timed out"
        else:
            status = "failed"
        done = len((self.state["timings"] or {}).get("tables", {}))
        self.finish_step(
            "timings",
            status,
            started,
            f"{done} of {len(timings_lib.TABLES)} tables",
        )

    def device_count(self) -> int:
        h = rh.Harness(self.library)
        return 1 if h.emulated else h.devices()

    def main(self) -> int:
        self.say(
            f"report in {self.report_dir}; budget "
            f"{self.deadline - time.monotonic():.0f} s"
        )
        try:
            if not self.machine_and_build():
                return self.exit(None)
            if self.device_count() == 0:
                self.finish_step(
                    "device", "missing", time.monotonic(),
                    "no CUDA device is visible (cudaGetDeviceCount)",
                )  # fmt: skip
                return self.exit(EXIT_NO_DEVICE)
            self.checks()
            self.sanitizers()
            self.timings()
            return self.exit(None)
        finally:
            shutil.rmtree(self.work, ignore_errors=True)

    def exit(self, code: int | None) -> int:
        if code is None:
            statuses = {s["status"] for s in self.state["steps"]}
            if "failed" in statuses:
                code = EXIT_FAILED
            elif statuses - {"passed"}:
                code = EXIT_INCOMPLETE
            else:
                code = 0
        self.state["exit_code"] = code
        self.write_report()
        self.say(
            f"done: exit {code}; {os.path.join(self.report_dir, 'ops_gpu.md')}"
        )
        return code


def harness_counts(job: Job, result: JobResult) -> dict:
    """A run_harness.py run's status and counts, from its --results file."""
    counts = {"cases": 0, "failures": 0, "skipped_inputs": 0}
    if job.results and os.path.exists(job.results):
        with open(job.results) as f:
            for c in json.load(f)["checks"].values():
                for key in counts:
                    counts[key] += c[key]
        status = (
            "failed" if counts["failures"] or result.returncode else ("passed")
        )
    else:
        # Killed or crashed before the end: the cases it printed.
        counts["failures"] = result.output.count("MISMATCH")
        if result.returncode is None:
            status = "failed" if counts["failures"] else "timed out"
        else:
            status = "failed"
    return {"status": status, **counts}


# Lines of compute-sanitizer's reports: errors, and racecheck's warnings.
SANITIZER_ERROR = re.compile(
    r"^========= (Invalid |Error|Barrier error|Program hit|Out-of-range|"
    r"Misaligned|Uninitialized|Malloc/Free error|Race reported)",
    re.M,
)
SANITIZER_REFUSED = re.compile(
    r"Device not supported|not supported on this|Unable to find injection|"
    r"Target application terminated before first instrumented API call",
)


def sanitizer_counts(job: Job, result: JobResult) -> dict:
    """A sanitizer run's status: failed on any sanitizer error (or check
    failure), refused when the sanitizer would not run on this device."""
    counts = harness_counts(job, result)
    errors = len(SANITIZER_ERROR.findall(result.output))
    summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", result.output)
    status = counts["status"]
    if SANITIZER_REFUSED.search(result.output) and not counts["cases"]:
        status = "refused"
    elif errors or result.returncode == 99:
        status = "failed"
    if counts["cases"] == 0 and result.returncode is None:
        # Cut off: the cases it had printed (-v) show how far it got.
        counts["cases"] = len(
            re.findall(r"^(?:ok|MISMATCH) ", result.output, re.M)
        )
    return {
        **counts,
        "status": status,
        "errors": errors,
        "summary": summary[-1] if summary else "",
    }


def step_status(rows: list[dict]) -> str:
    statuses = {r["status"] for r in rows}
    if not rows:
        return "skipped"
    if "failed" in statuses:
        return "failed"
    return "passed" if statuses == {"passed"} else "incomplete"


def render(state: dict) -> str:
    """ops_gpu.md from the report's state."""
    m = state["machine"]
    lines = [f"# {state['title']}", ""]
    if state["emulated"]:
        lines += [
            "**Emulation on a CPU: the timings below measure the "
            "emulator, not a GPU.**",
            "",
        ]
    lines += [
        f"Command: `{state['command']}` (from the repository root), "
        f"started {state['started']}, budget {state['budget_s']:.0f} s. "
        f"Exit code: {state.get('exit_code', 'running')}.",
        "",
        "## Machine",
        "",
    ]
    for key in (
        "gpu",
        "compute_cap",
        "arch",
        "driver",
        "memory",
        "python",
        "numpy",
        "torch",
        "compiler",
        "platform",
    ):
        if m.get(key):
            lines.append(f"- {key}: {m[key]}")
    for key in ("nvcc", "compute_sanitizer"):
        if m.get(key):
            lines.append(f"- {key}: {m[key].splitlines()[-1]}")
    if m.get("nvidia_smi"):
        lines += ["", "```", m["nvidia_smi"], "```"]
    lines += [
        "",
        "## Steps",
        "",
        timings_lib.markdown_table(
            state["steps"],
            [
                ("step", "name"),
                ("status", "status"),
                ("seconds", "seconds"),
                ("detail", "detail"),
            ],
        ),
        "",
    ]
    if state.get("build_command"):
        lines += [
            f"The harness library: `{state['build_command']}`; the commands "
            "below reuse it (`--no-build`).",
            "",
        ]
    if state["checks"]:
        lines += [
            "## Checks against numpy (exact)",
            "",
            timings_lib.markdown_table(
                state["checks"],
                [
                    ("run", "run"),
                    ("status", "status"),
                    ("cases", "cases"),
                    ("failures", "failures"),
                    ("inputs skipped", "skipped_inputs"),
                    ("seconds", "seconds"),
                ],
            ),
            "",
            "Commands:",
            "",
        ]
        lines += [f"- {r['run']}: `{r['command']}`" for r in state["checks"]]
        lines.append("")
    if state["sanitizers"]:
        lines += [
            "## compute-sanitizer",
            "",
            timings_lib.markdown_table(
                state["sanitizers"],
                [
                    ("tool", "tool"),
                    ("check", "check"),
                    ("status", "status"),
                    ("cases", "cases"),
                    ("errors", "errors"),
                    ("summary", "summary"),
                    ("seconds", "seconds"),
                ],
            ),
            "",
            "Commands:",
            "",
        ]
        lines += [
            f"- {r['tool']} {r['check']}: `{r['command']}`"
            for r in state["sanitizers"]
        ]
        lines.append("")
    if state["goals"] and not state["emulated"]:
        lines += ["## Goals", ""]
        for g in state["goals"]:
            met = {True: " (met)", False: " (NOT met)", None: ""}[g["met"]]
            lines.append(f"- {g['name']}: {g['measured']}{met}")
        lines.append("")
    if state["timings"]:
        t = state["timings"]
        lines += [
            "## Timings",
            "",
            f"Median of {t['settings']['reps']} launches after "
            f"{t['settings']['warmup']} warm-up ones, CUDA events; "
            f"PyTorch {t['torch'] or 'not available'}.",
            "",
            timings_lib.render(t),
        ]
        if t.get("kernels"):
            lines += [
                "## Where the time goes",
                "",
                "Each tfgc call timed above, run once more under PyTorch's "
                "profiler (CUPTI): the device time of the kernels, memsets "
                "and copies it launched, in microseconds (launches that "
                "overlap count in full).",
                "",
                timings_lib.kernel_lines(t["kernels"]),
                "",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument(
        "report_dir",
        nargs="?",
        default=os.environ.get("TFGC_DEVICE_REPORT", "device_report"),
        help="where ops_gpu.md, ops_gpu.json and device_check.log go "
        "(default $TFGC_DEVICE_REPORT or ./device_report)",
    )
    parser.add_argument(
        "--emulate",
        action="store_true",
        help="run on the CPU emulation of CUDA",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (minutes on a CPU)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=460.0,
        help="seconds for the whole run (default 460)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="checks and sanitizer runs at a time",
    )
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget must be positive. Received: {args.budget}")
    return DeviceCheck(
        os.path.abspath(args.report_dir),
        args.emulate,
        args.quick,
        args.budget,
        args.jobs,
    ).main()


if __name__ == "__main__":
    sys.exit(main())
