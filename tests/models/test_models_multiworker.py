"""Both mains as 2 local MultiWorkerMirroredStrategy workers (tfgc.launch)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tfgc
from tests.models.conftest import batch_summary_steps, saved_weights
from tests.workers import start_workers
from tfgc import launch

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.multiworker


def _launch(module, args, num_workers=2, hosts=1):
    out = io.StringIO()
    code = launch.run(
        [sys.executable, "-m", module, *args],
        num_workers=num_workers,
        hosts=hosts,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=str(REPO),
        output=out,
    )
    return code, out.getvalue()


def _check_chief_only_outputs(model_dir, log, num_workers=2):
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["chief"] is True
    assert summary["num_workers"] == num_workers
    assert summary["num_replicas"] == num_workers
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "model.keras",
        "model.weights.h5",
        "summary.json",
        "tensorboard",
    ], log[-3000:]
    # The chief logged throughput; worker 1, quiet, wrote nothing here.
    assert "[worker 0]" in log and "examples/s" in log
    assert "[worker 1] I" not in log
    return summary


def test_lstm_two_workers_on_ptb_subset(tmp_path, ptb_dir):
    model_dir = tmp_path / "model"
    code, log = _launch(
        "models.lstm_lm.main",
        [
            f"--data_dir={ptb_dir}",
            f"--model_dir={model_dir}",
            "--train_steps=6",
            "--epochs=2",
            "--eval_steps=2",
            "--log_steps=3",
            "--batch_size=10",
            "--compressor=topk",
            "--density=0.01",
            "--all_reduce_alg=ring",
        ],
    )
    assert code == 0, log[-5000:]
    summary = _check_chief_only_outputs(model_dir, log)
    assert summary["global_batch_size"] == 20
    assert summary["bytes_per_step"]["compression_ratio"] > 10
    assert "[worker 0] valid perplexity:" in log
    assert "[worker 1] valid perplexity:" not in log


def test_resnet_cifar_sized_two_workers_synthetic(tmp_path):
    model_dir = tmp_path / "model"
    code, log = _launch(
        "models.resnet50_imagenet.main",
        [
            "--use_synthetic_data",
            "--cifar_sized",
            f"--model_dir={model_dir}",
            "--train_steps=4",
            "--epochs=2",
            "--log_steps=2",
            "--batch_size=8",
            "--compressor=powersgd",
            "--rank=2",
            # Loss scaling around tfgc: both workers skip the same steps.
            "--precision=mixed_float16",
        ],
    )
    assert code == 0, log[-5000:]
    summary = _check_chief_only_outputs(model_dir, log)
    assert summary["global_batch_size"] == 16
    assert "accuracy" in summary["eval"]["test"]
    assert summary["precision"] == "mixed_float16"
    assert summary["loss_scale"] > 0


def test_lstm_hierarchical_mstopk_four_workers_on_two_hosts(tmp_path):
    """HiTopKComm + MSTopK, 4 workers that the cluster spec puts on 2 hosts.

    About 30-40 s on 2 CPU cores (four TensorFlow processes start and
    trace).
    """
    model_dir = tmp_path / "model"
    code, log = _launch(
        "models.lstm_lm.main",
        [
            "--use_synthetic_data",
            f"--model_dir={model_dir}",
            "--train_steps=2",
            "--log_steps=1",
            "--batch_size=2",
            "--skip_eval",
            "--communicator=hierarchical",
            "--compressor=mstopk",
            "--density=0.01",
            "--all_reduce_alg=ring",
        ],
        num_workers=4,
        hosts=2,
    )
    assert code == 0, log[-5000:]
    summary = _check_chief_only_outputs(model_dir, log, num_workers=4)
    assert summary["global_batch_size"] == 8
    assert summary["config"]["communicator"] == "hierarchical"
    assert summary["config"]["workers_per_host"] is None  # from the spec
    traffic = summary["bytes_per_step"]
    # The large gradients were summed inside each host (2 workers each) and
    # only their compressed shards crossed: k = density * n / 2 per worker,
    # so the ratio beats flat top-k's (about 49x at density 0.01).
    assert traffic["intra_host"] > traffic["dense"]
    assert traffic["compression_ratio"] > 60, traffic
    assert traffic["overhead"] == 0
    assert "all 4 worker(s) exited 0" in log


def test_slurm_cluster_resolver_two_tasks_on_one_node(tmp_path):
    """Two SLURM tasks on "localhost", as `srun -n 2` would start them."""
    model_dir = tmp_path / "model"
    port_base = launch.free_ports(1)[0]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")
    }
    env.update(
        PYTHONPATH=str(REPO),
        TF_CPP_MIN_LOG_LEVEL="2",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_TASKS_PER_NODE="2",
    )
    command = [
        sys.executable,
        "-m",
        "models.lstm_lm.main",
        "--cluster_resolver=slurm",
        f"--slurm_port_base={port_base}",
        "--use_synthetic_data",
        f"--model_dir={model_dir}",
        "--train_steps=2",
        "--eval_steps=1",
        "--batch_size=2",
    ]
    procs = [
        subprocess.Popen(
            command,
            env={**env, "SLURM_PROCID": str(rank)},
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=300)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:]
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["num_workers"] == 2
    assert summary["num_replicas"] == 2
    assert summary["config"]["cluster_resolver"] == "slurm"


# Generous: one step, the agreement, the backup and the process's exit.
STOP_BOUND_SECONDS = 60


def _start_workers(model_dir, ptb_dir, logs, name, num_workers=2):
    """Starts the LSTM main as workers with their own TF_CONFIG (no
    launcher: what the workers do by themselves is tested)."""
    command = [
        sys.executable,
        "-m",
        "models.lstm_lm.main",
        f"--data_dir={ptb_dir}",
        f"--model_dir={model_dir}",
        "--train_steps=24",
        "--epochs=3",
        "--log_steps=1",
        "--batch_size=10",
        "--skip_eval",
        "--compressor=topk",
        "--density=0.01",
    ]
    return start_workers(
        command,
        num_workers,
        lambda i: logs / f"{name}_worker{i}.log",
        cwd=str(REPO),
    )


def _run(model_dir, ptb_dir, logs, name, signal_to=(), at_step=None):
    """Runs the workers to their end; with `signal_to`, sends SIGTERM to
    those workers once the chief logged step `at_step`. Returns the exit
    codes and the seconds from the signal to the last exit."""
    procs = _start_workers(model_dir, ptb_dir, logs, name)
    chief_log = logs / f"{name}_worker0.log"
    sent = None
    deadline = time.monotonic() + 300
    try:
        while any(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, chief_log.read_text()[-3000:]
            if signal_to and sent is None:
                steps = re.findall(r"step (\d+):", chief_log.read_text())
                if steps and int(steps[-1]) >= at_step:
                    for i in signal_to:
                        procs[i].send_signal(signal.SIGTERM)
                    sent = time.monotonic()
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    took = None if sent is None else time.monotonic() - sent
    return [p.returncode for p in procs], took


def test_lstm_two_workers_stopped_by_sigterm_resume_bit_for_bit(
    tmp_path, ptb_dir
):
    """SIGTERM to worker 1 alone inside epoch 2, then to both workers in
    epoch 3: every time both workers stop at the same step with a backup,
    within the bound and with exit code 143; the rerun ends with the
    weights of the run that never stopped, bit for bit, with its step
    count, history and TensorBoard steps. Rerunning the finished command
    then trains nothing and exits 0.

    About 2 minutes on 2 CPU cores (4 runs of 2 workers).
    """
    through = tmp_path / "through"
    codes, _ = _run(through, ptb_dir, tmp_path, "through")
    assert codes == [0, 0], (tmp_path / "through_worker0.log").read_text()

    model_dir = tmp_path / "stopped"
    backup = tfgc.callbacks.BackupAndRestore(str(model_dir / "backup"))
    for name, signal_to, at_step in (("lone", [1], 10), ("both", [0, 1], 18)):
        codes, took = _run(
            model_dir, ptb_dir, tmp_path, name, signal_to, at_step
        )
        chief = (tmp_path / f"{name}_worker0.log").read_text()
        assert codes == [143, 143], chief[-3000:]
        assert took < STOP_BOUND_SECONDS, took
        for i in range(2):
            log = (tmp_path / f"{name}_worker{i}.log").read_text()
            assert "Stopped on SIGTERM at epoch" in log, log[-3000:]
        state = backup.find_backup()
        assert state.epoch * 8 + state.batch >= at_step, state
    codes, _ = _run(model_dir, ptb_dir, tmp_path, "resumed")
    assert codes == [0, 0], (tmp_path / "resumed_worker0.log").read_text()

    expected = saved_weights(through / "model.weights.h5")
    got = saved_weights(model_dir / "model.weights.h5")
    assert expected.keys() == got.keys() and expected
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], name)
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["finished"] is True
    assert summary["train_steps"] == 24
    assert len(summary["history"]["loss"]) == 3
    assert batch_summary_steps(model_dir) == list(range(1, 25))
    assert not (model_dir / "backup").exists()

    written = (model_dir / "summary.json").read_bytes()
    codes, _ = _run(model_dir, ptb_dir, tmp_path, "again")
    assert codes == [0, 0]
    assert (
        "holds a finished run" in (tmp_path / "again_worker0.log").read_text()
    )
    assert (model_dir / "summary.json").read_bytes() == written
