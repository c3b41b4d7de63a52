"""Starts the lab's workers, streams their output, stops them all.

Each worker is its own session (`start_new_session`), so stopping it
stops whatever it started; any worker failing, or the deadline passing,
stops the others (`tfgc.launch.stop_workers`). Unlike `tfgc.launch`,
every worker may run behind its own command prefix (`ip netns exec
<host>`) and address.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tfgc.launch import stop_workers

GRACE_S = 5.0


@dataclass(frozen=True)
class Worker:
    """One worker: where it listens and what runs it."""

    address: str
    port: int
    prefix: tuple[str, ...] = ()  # e.g. ("ip", "netns", "exec", "<ns>")
    netdev: str | None = None  # the host's veth end, for its counters
    label: str = ""


class WorkerFailed(RuntimeError):
    pass


def _pump(pipe, prefix: str, lock: threading.Lock) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            with lock:
                sys.stdout.write(prefix + raw.decode("utf-8", "replace"))
                sys.stdout.flush()


def run(
    workers: Sequence[Worker],
    commands: Sequence[Sequence[str]],
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> None:
    """Runs `commands[i]` as worker i with its TF_CONFIG; waits for all.

    Raises:
        WorkerFailed: a worker exited non-zero (the others are stopped).
        TimeoutError: `timeout_s` passed (all are stopped).
    """
    cluster = {"worker": [f"{w.address}:{w.port}" for w in workers]}
    procs: list[subprocess.Popen] = []
    pumps = []
    lock = threading.Lock()
    try:
        for index, worker in enumerate(workers):
            worker_env = dict(os.environ, **(env or {}))
            worker_env.update(
                TF_CONFIG=json.dumps(
                    {
                        "cluster": cluster,
                        "task": {"type": "worker", "index": index},
                    }
                ),
                TFGC_WORKER_INDEX=str(index),
                PYTHONUNBUFFERED="1",
            )
            proc = subprocess.Popen(
                [*worker.prefix, *commands[index]],
                env=worker_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(proc)
            label = worker.label or f"worker {index}"
            pump = threading.Thread(
                target=_pump,
                args=(proc.stdout, f"[{label}] ", lock),
                daemon=True,
            )
            pump.start()
            pumps.append(pump)
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise WorkerFailed(
                    f"worker {failed[0]} exited with {codes[failed[0]]}"
                )
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the workers ran past the {timeout_s:.0f} s limit"
                )
            time.sleep(0.1)
    finally:
        # Also on success: a worker's stray children go with its session.
        stop_workers(procs, GRACE_S)
        for pump in pumps:
            pump.join(timeout=2.0)
