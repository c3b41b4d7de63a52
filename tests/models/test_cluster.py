"""Workers that join and leave their cluster cleanly (models.common.cluster):
a start-up deadline that names missing tasks, and an end of run where no
worker outlives the leader or is left behind as crashed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.workers import launch_worker_script
from tfgc import launch

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.multiworker

# What TensorFlow logs when workers leave in the wrong order.
_SHUTDOWN_ERRORS = (
    "The tasks have crashed",
    "Failed to send RPC to coordination service",
    "StartAbort",
)


@pytest.mark.parametrize("index, missing", [(0, 1), (1, 0)])
def test_missing_peer_fails_within_the_startup_timeout(index, missing):
    """One process of a two-worker TF_CONFIG: it used to wait forever.

    Worker 1 alone misses the leader (worker 0), which hosts the
    coordination service; worker 0 alone waits for worker 1.
    """
    ports = launch.free_ports(2)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO),
        TF_CONFIG=launch.tf_config(2, ports, index),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "models.lstm_lm.main",
            "--use_synthetic_data",
            "--model_dir=/tmp/unused",
            "--train_steps=1",
            "--startup_timeout=5",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stderr[-3000:]
    # Start-up (seconds of imports), the 5 s deadline, TensorFlow's retry.
    assert elapsed < 60
    assert (
        f"error: worker {missing} of 2 (localhost:{ports[missing]}) did not "
        "start within 5 s" in result.stderr
    ), result.stderr[-3000:]


def _errors(log: str) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if any(error in line for error in _SHUTDOWN_ERRORS)
    ]


def test_workers_leave_together_when_the_chief_is_slow():
    """The chief works 12 s longer: worker 1 waits for it at the end
    instead of leaving, which made the chief report it as crashed."""
    code, log = launch_worker_script("cluster_worker.py", 2, ["slow_chief"])
    assert code == 0, log[-5000:]
    assert not _errors(log), log[-5000:]
    assert log.count("] finished") == 2, log[-5000:]


def test_a_worker_that_leaves_early_fails_the_run():
    """Worker 1 exits 0 without finishing with the others: the chief's
    end barrier fails, so the run does not end with exit code 0."""
    code, log = launch_worker_script("cluster_worker.py", 2, ["worker_leaves"])
    assert code == 1, log[-5000:]
    assert "The workers did not all finish the run" in log, log[-5000:]
    assert "[worker 0] finished" not in log


def test_workers_leaving_unordered_log_errors():
    """The same slow chief without `finish_run`, as the mains ended: worker
    1 leaves first and the chief reports it crashed, yet all exit 0. This
    is the failure the end barrier removes."""
    code, log = launch_worker_script("cluster_worker.py", 2, ["no_finish"])
    assert code == 0, log[-5000:]
    assert "The tasks have crashed" in log, log[-5000:]
