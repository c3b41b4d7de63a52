"""The cluster a launch describes: free ports, host names, TF_CONFIG."""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``count`` distinct TCP ports that are currently free.

    Every socket stays bound until all ports are chosen, so the kernel
    cannot hand out the same port twice. The ports are released before
    returning; a different process could grab one in between, which is an
    accepted (and rare) race.

    Args:
        count: Number of ports wanted.
        host: Address to bind to.

    Returns:
        A list of ``count`` distinct port numbers.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def host_names(num_workers: int, num_hosts: int = 1) -> list[str]:
    """The host name of every worker when they stand for ``num_hosts``.

    One host: ``localhost``. Several: workers are split into consecutive
    groups of ``num_workers // num_hosts``, group h on 127.0.0.(h+1).

    Raises:
        ValueError: If ``num_hosts`` is not in [1, 254] or does not divide
            ``num_workers``.
    """
    if not 1 <= num_hosts <= 254 or num_workers % num_hosts:
        raise ValueError(
            f"hosts={num_hosts} must be in [1, 254] and divide num_workers="
            f"{num_workers}, so that every host runs as many workers; "
            f"e.g. -n {num_workers} --hosts 1"
        )
    if num_hosts == 1:
        return ["localhost"] * num_workers
    per_host = num_workers // num_hosts
    return [f"127.0.0.{1 + i // per_host}" for i in range(num_workers)]


def cluster_spec(
    num_workers: int,
    ports: Sequence[int],
    host: str = "localhost",
    hosts: Sequence[str] | None = None,
) -> dict[str, list[str]]:
    """Builds the ``cluster`` part of ``TF_CONFIG``.

    Args:
        num_workers: Number of workers; must equal ``len(ports)``.
        ports: One port per worker, in worker-index order.
        host: Host name each worker address uses.
        hosts: One host name per worker, instead of ``host``.

    Returns:
        ``{"worker": ["host:port", ...]}``.

    Raises:
        ValueError: If ``num_workers`` does not match the number of ports
            (or of ``hosts``).
    """
    if len(ports) != num_workers:
        raise ValueError(
            f"cluster_spec: got {len(ports)} ports for num_workers="
            f"{num_workers}; pass exactly one port per worker"
        )
    if hosts is None:
        hosts = [host] * num_workers
    if len(hosts) != num_workers:
        raise ValueError(
            f"cluster_spec: got {len(hosts)} host names for num_workers="
            f"{num_workers}; pass exactly one per worker"
        )
    return {"worker": [f"{h}:{port}" for h, port in zip(hosts, ports)]}


def tf_config(
    num_workers: int,
    ports: Sequence[int],
    index: int,
    hosts: Sequence[str] | None = None,
) -> str:
    """Returns the ``TF_CONFIG`` JSON string for one worker.

    Args:
        num_workers: Number of workers in the cluster.
        ports: One port per worker, in worker-index order.
        index: This worker's index, ``0 <= index < num_workers``.
        hosts: One host name per worker (default: all ``localhost``).

    Returns:
        JSON text as ``MultiWorkerMirroredStrategy`` expects it.

    Raises:
        ValueError: If ``index`` is out of range.
    """
    if not 0 <= index < num_workers:
        raise ValueError(
            f"tf_config: index={index} is out of range for num_workers="
            f"{num_workers}; use 0 <= index < num_workers"
        )
    return json.dumps(
        {
            "cluster": cluster_spec(num_workers, ports, hosts=hosts),
            "task": {"type": "worker", "index": index},
        }
    )
