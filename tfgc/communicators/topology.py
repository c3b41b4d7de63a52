"""Where every replica runs: the host of each one, read from the strategy.

Replicas are numbered as `tf.distribute` numbers them
(`replica_id_in_sync_group`). Under `MultiWorkerMirroredStrategy` the
replicas of one worker task are consecutive, tasks in cluster order (the
chief first, then the workers), and a task's host is the host name of its
`TF_CONFIG` address. Every other strategy runs on one host.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf


class Topology(NamedTuple):
    """The replicas of a run and the host each runs on.

    Attributes:
        hosts: host index of every replica, by replica id; hosts are
            numbered in order of first appearance.
        devices: this worker's replica devices, by local replica index
            (`strategy.extended.worker_devices`).
        cluster: text that names the cluster (its task addresses, or the
            local devices): groups of different clusters get different
            collective keys in one process.
        from_cluster_spec: whether `hosts` came from the addresses of a
            cluster spec (False: one process, or an unnamed cluster).
    """

    hosts: tuple[int, ...]
    devices: tuple[str, ...]
    cluster: str
    from_cluster_spec: bool = False

    @property
    def num_replicas(self) -> int:
        return len(self.hosts)

    @property
    def num_hosts(self) -> int:
        return len(set(self.hosts))

    def device(self, replica_id: int) -> str:
        """The device of one of this worker's replicas."""
        return self.devices[replica_id % len(self.devices)]

    def host_members(self, host: int) -> tuple[int, ...]:
        """The replicas on `host`, in replica order."""
        return tuple(r for r, h in enumerate(self.hosts) if h == host)


def _host_name(address: str) -> str:
    """The host part of "host:port" ("[::1]:port" for IPv6)."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    return address.rsplit(":", 1)[0] if ":" in address else address


def _task_addresses(strategy) -> list[str] | None:
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return None
    spec = resolver.cluster_spec().as_dict()
    addresses = []
    for job in ("chief", "worker"):
        tasks = spec.get(job, [])
        if isinstance(tasks, dict):  # sparse task lists: index -> address
            tasks = [tasks[i] for i in sorted(tasks)]
        addresses += list(tasks)
    return addresses or None


def current(strategy: tf.distribute.Strategy | None = None) -> Topology:
    """The topology of `strategy` (default: the current one).

    Call in a cross-replica context (e.g. `optimizer.build` inside
    `strategy.scope()`), or inside a replica function: both see the same
    strategy.
    """
    strategy = strategy or tf.distribute.get_strategy()
    num_replicas = strategy.num_replicas_in_sync
    try:
        devices = tuple(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy: one replica, no collective
        devices = ("",)
    addresses = _task_addresses(strategy)
    if addresses and num_replicas % len(addresses) == 0:
        per_task = num_replicas // len(addresses)
        names: list[str] = []
        for address in addresses:
            name = _host_name(address)
            if name not in names:
                names.append(name)
        hosts = tuple(
            names.index(_host_name(addresses[r // per_task]))
            for r in range(num_replicas)
        )
        return Topology(hosts, devices, ",".join(addresses), True)
    return Topology((0,) * num_replicas, devices, ",".join(devices), False)
