"""How a worker joins its cluster, and how the workers leave it together.

A multi-worker run starts with every worker registering with TensorFlow's
coordination service, which lives in the leader task (the chief, or
worker 0); `multi_worker_strategy` gives up after `startup_timeout`
seconds, naming the tasks that never started, where TensorFlow would wait
forever. The run ends with `finish_run`: a barrier that every worker
passes only when all have finished (the chief has written its files by
then), after which the other workers exit and the leader waits for them
before it exits too. Leaving in any other order makes the survivors log
errors: without the leader a worker's heartbeats fail ("Failed to send RPC
to coordination service"), and a worker that is gone while the leader
still runs is declared crashed ten seconds later ("The tasks have
crashed"), which aborts any collective the leader still runs; the exit
code of such a run said nothing.
"""

from __future__ import annotations

import socket
import time
from typing import NamedTuple

import tensorflow as tf

# MultiWorkerMirroredStrategy configures the coordination service through
# these modules too, unless it is configured already; tf.distribute has no
# public switch for the start-up deadline or a barrier.
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.eager import context

# The jobs the coordination service coordinates (as MultiWorkerMirrored-
# Strategy sets it up): the leader is the chief if there is one.
_COORDINATED_JOBS = ("chief", "worker")
_END_BARRIER = "tfgc_end_of_run"
# How long the leader waits at the end for the other workers to exit.
_EXIT_WAIT_S = 30.0
_POLL_S = 0.1


class ClusterError(RuntimeError):
    """A worker could not join its cluster, or the workers did not all
    finish the run."""


class Task(NamedTuple):
    """One task of the cluster spec."""

    job: str
    index: int
    address: str  # "host:port"

    def describe(self, num_tasks: int) -> str:
        return f"{self.job} {self.index} of {num_tasks} ({self.address})"


class _Cluster(NamedTuple):
    """The cluster this process joined (see `multi_worker_strategy`)."""

    tasks: tuple[Task, ...]  # every coordinated task, the leader first
    me: Task
    timeout: float  # startup_timeout, also for the end barrier

    @property
    def is_leader(self) -> bool:
        return self.me == self.tasks[0]

    @property
    def others(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t != self.me)


# Set by `multi_worker_strategy` when this process joins a multi-worker cluster;
# read by `finish_run` at the end of the process's run.
_joined: _Cluster | None = None


def multi_worker_strategy(
    resolver: tf.distribute.cluster_resolver.ClusterResolver | None = None,
    startup_timeout: float = 300.0,
    communication_options: (
        tf.distribute.experimental.CommunicationOptions | None
    ) = None,
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """`MultiWorkerMirroredStrategy` that gives up on tasks that never start.

    Call `finish_run()` at the end of the process's work, so that the
    workers leave together.

    Args:
        resolver: the cluster; default: `TF_CONFIG`.
        startup_timeout: seconds to wait for every task to start.
        communication_options: for the strategy's own collectives.

    Raises:
        ClusterError: tasks did not start within `startup_timeout` (it
            names them).
    """
    if resolver is None:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = _coordinate(resolver, startup_timeout)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=communication_options,
        )
    except tf.errors.OpError as err:
        if cluster is None:
            raise
        raise _startup_error(cluster, err) from err
    global _joined
    _joined = cluster
    return strategy


def _tasks(resolver) -> tuple[Task, ...] | None:
    """The coordinated tasks, the leader first; None without a cluster."""
    if resolver.task_type not in _COORDINATED_JOBS:
        return None
    spec = resolver.cluster_spec().as_dict()
    return tuple(
        Task(job, index, address)
        for job in _COORDINATED_JOBS
        for index, address in enumerate(spec.get(job, ()))
    )


def _coordinate(resolver, timeout: float) -> _Cluster | None:
    """Sets up the coordination service as MultiWorkerMirroredStrategy
    would, but with a start-up deadline.

    Every task registers with the leader; with a registration barrier the
    registration fails after `timeout` seconds instead of waiting forever
    for a task that never starts.

    Returns:
        The cluster this process is joining, or None without one (or if
        the coordination service was configured elsewhere).
    """
    tasks = _tasks(resolver)
    if tasks is None or context.context().coordination_service is not None:
        return None
    spec = resolver.cluster_spec().as_dict()
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=f"/job:{tasks[0].job}/replica:0/task:0",
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(
                name=job, num_tasks=len(spec[job])
            )
            for job in _COORDINATED_JOBS
            if job in spec
        ],
        cluster_register_timeout_in_ms=int(timeout * 1000),
    )
    context.context().coordination_service.cluster_register_with_barrier = True
    me = next(
        t
        for t in tasks
        if t.job == resolver.task_type and t.index == int(resolver.task_id)
    )
    return _Cluster(tasks, me, timeout)


def _listening(address: str) -> bool:
    """Whether a task's server accepts connections at `address`."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _startup_error(cluster: _Cluster, err: Exception) -> Exception:
    """`ClusterError` naming the tasks that did not start, or `err` if
    every task is up (then something else failed)."""
    missing = [t for t in cluster.others if not _listening(t.address)]
    if not missing:
        return err
    n = len(cluster.tasks)
    names = " and ".join(t.describe(n) for t in missing)
    one = len(missing) == 1
    return ClusterError(
        f"{names} did not start within {cluster.timeout:g} s (nothing "
        f"accepts connections at {'its' if one else 'their'} address): "
        f"start {'it' if one else 'them'} with the same cluster in "
        "TF_CONFIG, or wait longer with --startup_timeout."
    )


def finish_run() -> None:
    """Ends this process's part of a multi-worker run; call it last.

    Every worker waits at a barrier until all have finished (at most
    `--startup_timeout` seconds); then the leader, which hosts the
    coordination service, waits up to 30 s for the others to exit, so
    that no worker outlives the service or is left behind as "crashed".
    Does nothing outside a multi-worker cluster.

    Raises:
        ClusterError: the barrier failed: a worker crashed or did not
            finish in time. The run did not succeed everywhere.
    """
    global _joined
    cluster, _joined = _joined, None
    if cluster is None:
        return
    try:
        context.context().wait_at_barrier(
            _END_BARRIER, int(cluster.timeout * 1000)
        )
    except tf.errors.OpError as err:
        raise ClusterError(
            "The workers did not all finish the run (waited up to "
            f"{cluster.timeout:g} s at the end for "
            f"{len(cluster.others)} other task(s)): "
            f"{str(err).splitlines()[0]}"
        ) from err
    if not cluster.is_leader:
        return
    deadline = time.monotonic() + _EXIT_WAIT_S
    waiting = list(cluster.others)
    while waiting and time.monotonic() < deadline:
        waiting = [t for t in waiting if _listening(t.address)]
        if waiting:
            time.sleep(_POLL_S)
