"""HiTopKComm: compress only what crosses the slow network between hosts."""

from __future__ import annotations

import math

import tensorflow as tf

from tfgc import _arguments
from tfgc.communicators import exchange, fusion
from tfgc.communicators.collectives import Group
from tfgc.communicators.communicator import Communicator, replica_id
from tfgc.communicators.topology import Topology
from tfgc.core import wire
from tfgc.core.bucket_costs import (
    EVERYONE,
    HOST_GATHER,
    HOST_REDUCE,
    TensorLoad,
)
from tfgc.core.wire import num_elements

#: The collectives that can sum a gradient inside a host (step 1), as
#: `Hierarchical.intra_host_reduce` names them.
REDUCE_SCATTER = "reduce_scatter"
ALL_REDUCE_AND_SLICE = "all_reduce_and_slice"


def _shard_rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of the view that is split by rows among a host."""
    if len(shape) < 2:
        return num_elements(shape), 1
    cols = int(shape[-1])
    return num_elements(shape) // max(cols, 1), cols


def _host_reduce(host: Group) -> str:
    """Step 1's collective in `host`.

    Decided while tracing from the group's device type and communication
    options, which every worker of a host shares, so all members issue the
    same collective (a mismatch would hang). Hosts may differ: no
    collective of step 1 spans hosts.
    """
    return REDUCE_SCATTER if host.has_reduce_scatter else ALL_REDUCE_AND_SLICE


def _intra_host_bytes(block: tf.Tensor) -> int:
    """Bytes one worker puts into the host's collectives for one [g, shard
    size] block: the block into step 1, its shard into step 4's gather.

    Like every count of `compression_stats`, this is before the
    collective's own transport, so it is the same for either step 1: a
    reduce-scatter and an all-reduce both take the whole block. On a ring
    the reduce-scatter then moves (g-1)/g of it per worker and the
    all-reduce 2(g-1)/g; `Hierarchical.intra_host_reduce` says which ran.
    """
    g, shard = block.shape
    return (g + 1) * shard * block.dtype.size


class Hierarchical(Communicator):
    """Two-level exchange for m hosts of g workers each (HiTopKComm).

    Shi et al., "Towards Scalable Distributed Training of Deep Learning on
    Public Cloud Clusters" (MLSys 2021); docs/algorithms.md, section
    "HiTopKComm", says what is reconstructed. For every gradient of at
    least `dense_threshold` elements:

    1. Inside each host the workers sum the gradient and worker l keeps
       shard l: rows l*R .. (l+1)*R - 1 of the (prod(shape[:-1]),
       shape[-1]) view, R = ceil(rows / g), zero-padded (1-D tensors are
       split into g pieces). On GPUs with the NCCL implementation this
       is a reduce-scatter; TensorFlow has none elsewhere (CPU, RING,
       AUTO), so there it is an all-reduce inside the host followed by a
       slice: twice a reduce-scatter's transport, none of it on the
       network between hosts. `intra_host_reduce` says which.
    2. The compressor (with error feedback, if asked) compresses the shard;
       with `MSTopK(density)` that is k = density * n / g per worker.
    3. Workers with the same local rank on every host exchange the
       compressed shards: the only traffic between hosts.
    4. Inside each host the workers all-gather their decompressed shards.

    Smaller gradients go through one dense all-reduce among all workers,
    uncompressed. With one worker per host the scheme is the flat exchange
    of the compressor; with one host nothing crosses a slow network, so
    every gradient is summed exactly (dense) and nothing is compressed.

    Hosts come from the cluster spec (workers whose `TF_CONFIG` addresses
    share a host name share a host; every host must have as many workers),
    or from `workers_per_host` (then workers g*h .. g*h + g - 1 form host
    h, which must agree with the cluster spec's host names when it has
    them). With several GPUs per worker task, each GPU counts as a worker.

    Args:
        workers_per_host: g; None reads it from the cluster spec.
        dense_threshold: gradients with fewer elements go dense, in one
            all-reduce among all workers (16384 in the paper's systems).
        options: `tf.distribute.experimental.CommunicationOptions` for
            every collective.
    """

    name = "hierarchical"
    #: Every bucket is also summed whole inside the host, as gradients,
    #: whatever its codec sends: joined buckets would hold that sum back
    #: until the backward pass ends.
    joins_buckets = False

    def __init__(
        self,
        workers_per_host: int | None = None,
        dense_threshold: int = 16384,
        options=None,
    ):
        super().__init__(options=options)
        self.workers_per_host = (
            None
            if workers_per_host is None
            else _arguments.check_int("workers_per_host", workers_per_host, 1)
        )
        self.dense_threshold = _arguments.check_int(
            "dense_threshold", dense_threshold, minimum=0
        )
        self._hosts: tuple[int, ...] | None = None

    # --- planning ------------------------------------------------------------

    def build(self, topology: Topology) -> None:
        self._hosts = self._host_of_each_replica(topology)
        self.topology = topology

    def _host_of_each_replica(self, topology: Topology) -> tuple[int, ...]:
        p = topology.num_replicas
        if p < 2:
            raise ValueError(
                "communicator='hierarchical' needs at least 2 workers; this "
                f"run has {p}. Use communicator='auto' for one worker, or "
                "start more workers (python -m tfgc.launch -n 4 ...)."
            )
        g = self.workers_per_host
        if g is None:
            hosts = topology.hosts
            sizes = sorted({h: hosts.count(h) for h in set(hosts)}.items())
            if len({n for _, n in sizes}) != 1:
                raise ValueError(
                    "communicator='hierarchical' needs the same number of "
                    "workers on every host; the cluster spec has "
                    + ", ".join(f"host {h}: {n}" for h, n in sizes)
                    + ". Give every host as many workers, or pass "
                    "workers_per_host=g to group the workers yourself."
                )
            return hosts
        if p % g:
            raise ValueError(
                f"`workers_per_host` must divide the number of workers ({p})."
                f" Received: workers_per_host={g}. Use a divisor of {p}."
            )
        hosts = tuple(r // g for r in range(p))
        if topology.from_cluster_spec and hosts != topology.hosts:
            raise ValueError(
                f"workers_per_host={g} disagrees with the cluster spec, whose "
                f"host names put the {p} workers on hosts {topology.hosts}. "
                "Drop workers_per_host to use the cluster spec, or list the "
                "workers of each host consecutively in TF_CONFIG."
            )
        return hosts

    def _require_built(self) -> tuple[int, ...]:
        if self._hosts is None:
            raise ValueError(
                "The hierarchical communicator is not built: build the "
                "optimizer inside strategy.scope() first "
                "(optimizer.build(model.trainable_variables); model.fit "
                "does this itself)."
            )
        return self._hosts

    @property
    def num_hosts(self) -> int:
        return len(set(self._require_built()))

    @property
    def per_host(self) -> int:
        return len(self._require_built()) // self.num_hosts

    @property
    def intra_host_reduce(self) -> str:
        """Which collective sums a gradient inside the host (step 1):
        "reduce_scatter" (GPUs with NCCL) or "all_reduce_and_slice".

        Read after the build; it is decided from this worker's device and
        `options`, as the step decides it while tracing.
        """
        hosts = self._require_built()
        # topology.device maps any replica id to one of this worker's.
        members = [r for r, h in enumerate(hosts) if h == hosts[0]]
        return _host_reduce(Group(self.topology, members, 0, self.options))

    @property
    def num_peers(self) -> int:
        return self.num_hosts

    def sends_dense(self, shape):
        return num_elements(shape) < self.dense_threshold or self.num_hosts == 1

    def compressed_shape(self, shape):
        shape = tuple(shape)
        if self.sends_dense(shape):
            return shape
        rows, cols = _shard_rows(shape)
        shard_rows = math.ceil(rows / self.per_host)
        return (shard_rows, cols) if len(shape) >= 2 else (shard_rows,)

    def route(self, shape, collective):
        """A gradient under the size threshold is all-reduced among all
        workers; a shard's payloads travel among the hosts."""
        if self.sends_dense(tuple(shape)):
            return EVERYONE
        return super().route(shape, collective)

    def host_loads(self, shape, dtype):
        """A sharded gradient's sum inside the host (each worker puts in
        the whole gradient, as g shards) and its summed shards gathered
        inside the host."""
        shape = tuple(shape)
        if self.sends_dense(shape) or self.per_host == 1:
            return ()
        shard = num_elements(self.compressed_shape(shape))
        size = tf.as_dtype(dtype).size
        return (
            TensorLoad(HOST_REDUCE, 1, self.per_host * shard * size, 0),
            TensorLoad(HOST_GATHER, 1, shard * size, 0),
        )

    # --- communicating -------------------------------------------------------

    def groups(self) -> tuple[Group, Group, Group]:
        """(everyone, this host, this local rank on every host), in the
        replica context."""
        hosts = self._require_built()
        me = replica_id()
        host = hosts[me]
        local = hosts[:me].count(host)
        same_host = [r for r, h in enumerate(hosts) if h == host]
        same_rank = [
            r for r, h in enumerate(hosts) if hosts[:r].count(h) == local
        ]
        topology = self.topology
        return (
            Group(topology, range(len(hosts)), me, self.options),
            Group(topology, same_host, me, self.options),
            Group(topology, same_rank, me, self.options),
        )

    def _blocks(self, tensor: tf.Tensor, g: int) -> tf.Tensor:
        """The tensor as [g, shard size]: row l is local rank l's shard."""
        shard_size = num_elements(self.compressed_shape(tensor.shape))
        flat = tf.reshape(tensor, [-1])
        flat = tf.pad(flat, [[0, g * shard_size - flat.shape[0]]])
        return tf.reshape(flat, [g, shard_size])

    def _host_shard_sums(self, blocks, host: Group):
        """Row `host.rank` of each [g, shard size] block summed over the
        host (step 1), with the collective `_host_reduce` picks."""
        if _host_reduce(host) == REDUCE_SCATTER:
            return fusion.reduce_scatter_sum(blocks, host)
        return [s[host.rank] for s in fusion.all_reduce_sum(blocks, host)]

    def step(
        self,
        compressors,
        tensors,
        states,
        keys,
        variables=None,
        bucket_bytes=None,
    ):
        everyone, host, peers = self.groups()
        n = len(tensors)
        totals, new_states = [None] * n, [None] * n
        sent = overhead = intra = wire.zero_bytes()
        routes = {True: [], False: []}
        for i, t in enumerate(tensors):
            routes[self.sends_dense(tuple(t.shape))].append(i)

        def run(indices, inputs, group, values):
            def carry(payloads, kinds):
                return self.carry(payloads, kinds, group)

            return exchange.run_rounds(
                [compressors[i] for i in indices],
                inputs,
                [states[i] for i in indices],
                [keys[i] for i in indices],
                carry,
                exchange.step_infos(values, group.rank, group.size),
                bucket_bytes,
            )

        dense = routes[True]
        if dense:
            out, out_states, s, o = run(
                dense,
                [tensors[i] for i in dense],
                everyone,
                None if variables is None else [variables[i] for i in dense],
            )
            sent, overhead = sent + s, overhead + o
            for i, total, state in zip(dense, out, out_states):
                totals[i], new_states[i] = total, state

        sharded = routes[False]
        if sharded:
            g = host.size

            def as_shard(i, row):
                return tf.reshape(row, self.compressed_shape(tensors[i].shape))

            blocks = [self._blocks(tensors[i], g) for i in sharded]
            host_sums = self._host_shard_sums(blocks, host)
            shards = [as_shard(i, row) for i, row in zip(sharded, host_sums)]
            values = None
            if variables is not None:
                values = [
                    as_shard(i, self._blocks(variables[i], g)[host.rank])
                    for i in sharded
                ]
            out, out_states, s, o = run(sharded, shards, peers, values)
            sent, overhead = sent + s, overhead + o
            gathered = fusion.all_gather(
                [tf.reshape(t, [-1]) for t in out], host
            )
            for i, whole, state, block in zip(
                sharded, gathered, out_states, blocks
            ):
                n_i = num_elements(tensors[i].shape)
                flat = tf.reshape(whole, [-1])[:n_i]
                totals[i] = tf.reshape(flat, tensors[i].shape)
                new_states[i] = state
                if g > 1:
                    intra += _intra_host_bytes(block)
        traffic = wire.Traffic(sent, overhead, tf.cast(intra, tf.int64))
        return exchange.StepResult(totals, new_states, traffic)

    def get_config(self):
        return {
            "workers_per_host": self.workers_per_host,
            "dense_threshold": self.dense_threshold,
            **super().get_config(),
        }
