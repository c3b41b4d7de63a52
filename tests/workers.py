"""Runs a script of tests/multiworker/ on real workers (one process each)."""

import io
import os
import subprocess
import sys

import numpy as np

from tfgc import launch

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def launch_worker_script(
    script: str, num_workers: int, args=(), timeout=300
) -> tuple[int, str]:
    """Runs `tests/multiworker/<script> <args>` on `num_workers` workers
    through `tfgc.launch`; returns its exit code and the workers' output.

    The default timeout is short: in these tests a hang is the failure.
    """
    log = io.StringIO()
    code = launch.run(
        [sys.executable, os.path.join(TESTS, "multiworker", script), *args],
        num_workers=num_workers,
        timeout=timeout,
        env={"PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"},
        output=log,
    )
    return code, log.getvalue()


def run_worker_script(
    script: str, num_workers: int, out, timeout=300, args=(), prefix=""
):
    """Runs `tests/multiworker/<script> --out <out> <args>` on
    `num_workers` workers, which must succeed, and returns what each wrote
    to `<out>/<prefix>worker<i>.npz`."""
    code, log = launch_worker_script(
        script, num_workers, ["--out", str(out), *args], timeout
    )
    assert code == 0, log[-5000:]
    return [
        np.load(os.path.join(out, f"{prefix}worker{i}.npz"))
        for i in range(num_workers)
    ]


def weights_of(result, run: str) -> list:
    """The weights a worker script saved as `<run>/weight<j>`, in order."""
    keys = [k for k in result.files if k.startswith(f"{run}/weight")]
    return [
        result[k] for k in sorted(keys, key=lambda k: int(k[len(run) + 7 :]))
    ]


def start_worker():
    """In a worker script: (the `--out` directory, the strategy, this
    worker's index)."""
    import argparse

    import tensorflow as tf

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return args.out, strategy, strategy.cluster_resolver.task_id


def start_workers(command, num_workers: int, log_path, cwd=None) -> list:
    """Starts `command` as `num_workers` workers, each with its own
    `TF_CONFIG` and without the launcher (which would stop the others when
    one exits); worker i writes its output to `log_path(i)`. Returns the
    `subprocess.Popen`s."""
    ports = launch.free_ports(num_workers)
    procs = []
    for i in range(num_workers):
        env = dict(
            os.environ,
            TF_CONFIG=launch.tf_config(num_workers, ports, i),
            PYTHONPATH=ROOT,
            PYTHONUNBUFFERED="1",
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        with open(log_path(i), "w") as log:
            procs.append(
                subprocess.Popen(
                    list(command),
                    env=env,
                    cwd=cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs
