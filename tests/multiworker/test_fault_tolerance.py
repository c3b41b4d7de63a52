"""A worker lost mid-training, on 3 real workers: the others stop on their
own within a bounded time with an error that names the lost worker, and
the same command run again resumes from the last backup with every
worker's compressor state, to the weights of the run that never stopped.

The workers here are started without the launcher, which would stop the
others itself as soon as one dies: this checks what TensorFlow and tfgc
do on a cluster where nothing watches the processes. SIGKILL is a crash
(the peers' connections are refused); SIGSTOP is a host that stops
answering (only the coordination service's heartbeats can tell).
"""

import os
import sys
import time

import numpy as np
import pytest

from tests.workers import TESTS, run_worker_script, start_workers

pytestmark = pytest.mark.multiworker

NUM_WORKERS = 3
SCRIPT = os.path.join(TESTS, "multiworker", "checkpoint_worker.py")
# TensorFlow's coordination service reports a task that stopped sending
# heartbeats after about 20 s here; a crash is seen at once.
BOUND_SECONDS = 120


def _start(out, backup, phase, sig):
    return start_workers(
        [
            sys.executable,
            SCRIPT,
            f"--out={out}",
            f"--backup={backup}",
            f"--phase={phase}",
            f"--signal={sig}",
        ],
        NUM_WORKERS,
        lambda i: out / f"{phase}_{sig}_worker{i}.log",
    )


def _launch(out, backup, phase):
    return run_worker_script(
        "checkpoint_worker.py",
        NUM_WORKERS,
        out,
        args=[f"--backup={backup}", f"--phase={phase}"],
        prefix=f"{phase}_",
    )


@pytest.fixture(scope="module")
def through(tmp_path_factory):
    out = tmp_path_factory.mktemp("through")
    return _launch(out, out / "backup", "through")


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_the_others_stop_naming_the_lost_worker_and_a_rerun_resumes(
    tmp_path, through, sig
):
    backup = tmp_path / "backup"
    procs = _start(tmp_path, backup, "killed", sig)
    lost = procs[-1]
    try:
        deadline = time.monotonic() + 300
        # The last worker signals itself in the second epoch.
        while time.monotonic() < deadline:
            if lost.poll() is not None:
                break
            if sig == "SIGSTOP" and _stopped(lost.pid):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the last worker never signalled itself")
        lost_at = time.monotonic()
        logs = []
        for i, proc in enumerate(procs[:-1]):
            remaining = lost_at + BOUND_SECONDS - time.monotonic()
            proc.wait(timeout=max(remaining, 1))
            assert proc.returncode != 0, i
            logs.append((tmp_path / f"killed_{sig}_worker{i}.log").read_text())
        # The first survivor to fail names the lost task; one that fails
        # later may report the first one's exit instead (TensorFlow
        # aborts every collective on the first error it hears of).
        assert any(f"task:{NUM_WORKERS - 1}" in log for log in logs), [
            log[-2000:] for log in logs
        ]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert backup.is_dir()

    resumed = _launch(tmp_path, backup, "resume")
    for got, expected in zip(resumed, through):
        assert int(got["steps"]) == int(expected["steps"])
        for key in got.files:
            np.testing.assert_allclose(
                got[key], expected[key], rtol=1e-6, atol=1e-7, err_msg=key
            )


def _stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"
