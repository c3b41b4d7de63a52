"""Workers that join and leave their cluster cleanly (models.common.cluster):
a start-up deadline that names missing tasks, and an end of run where no
worker outlives the leader or is left behind as crashed."""

from __future__ import annotations

import io
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


def _launch_main(model_dir: Path, *flags: str) -> tuple[int, str]:
    """A short 2-worker LSTM run through the launcher, with nothing of the
    launcher's own filtering (`verbose=True`), so that what shows is what
    the main prints; TF_CPP_MIN_LOG_LEVEL is left to the main too."""
    out = io.StringIO()
    code = launch.run(
        [
            sys.executable,
            "-m",
            "models.lstm_lm.main",
            "--use_synthetic_data",
            f"--model_dir={model_dir}",
            "--train_steps=4",
            "--log_steps=2",
            "--batch_size=2",
            "--skip_eval",
            *flags,
        ],
        2,
        timeout=300,
        env={"PYTHONPATH": str(REPO)},
        cwd=str(REPO),
        output=out,
        verbose=True,
    )
    return code, out.getvalue()


def test_two_worker_run_of_a_main_is_quiet(tmp_path, monkeypatch):
    """The chief's progress, once: no line twice, no TensorFlow INFO
    lines or start-up banners, nothing from worker 1, no shutdown
    errors. It printed 97 lines for 40 steps, most of them twice."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    code, log = _launch_main(tmp_path / "model")
    assert code == 0, log
    lines = log.splitlines()
    assert len(lines) == len(set(lines)), log
    for noise in (
        "INFO:tensorflow",
        "oneDNN",
        "absl::InitializeLog",
        "Using CollectiveAllReduceStrategy eagerly",
        *_SHUTDOWN_ERRORS,
    ):
        assert noise not in log, log
    assert not [line for line in lines if line.startswith("[worker 1]")], log
    assert "step 2: " in log and "step 4: " in log
    assert len(lines) <= 10, log


def test_verbose_main_shows_every_worker_once(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    code, log = _launch_main(tmp_path / "model", "--verbose")
    assert code == 0, log
    # TensorFlow's INFO lines, through absl's handler only (not twice).
    assert "MultiWorkerMirroredStrategy with cluster_spec" in log, log
    assert "INFO:tensorflow" not in log, log
    for index in range(2):
        assert f"[worker {index}] " in log and "step 4: " in log
