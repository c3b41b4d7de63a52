"""Both mains as 2 local MultiWorkerMirroredStrategy workers (tfgc.launch)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
