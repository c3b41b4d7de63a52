"""Communicators carry payloads between workers, fused into few collectives."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfgc import _arguments
from tfgc.communicators import exchange, fusion
from tfgc.communicators import topology as topology_lib
from tfgc.communicators.collectives import Group
from tfgc.core import wire
from tfgc.core.wire import (
    ALL_GATHER,
    ALL_GATHER_RAGGED,
    ALL_REDUCE,
    BROADCAST,
    ROOT_FIELD,
    wire_fields,
)
from tfgc.ops import _checks

_Options = tf.distribute.experimental.CommunicationOptions
_Implementation = tf.distribute.experimental.CommunicationImplementation
# The exported name is a factory; instances are of this internal class.
_OPTIONS_TYPE = type(_Options())


def _options_to_config(options):
    if options is None:
        return None
    return {
        "bytes_per_pack": options.bytes_per_pack,
        "timeout_seconds": options.timeout_seconds,
        "implementation": options.implementation.name,
    }


def _options_from_config(config):
    if config is None:
        return None
    config = dict(config)
    config["implementation"] = _Implementation[config["implementation"]]
    return _Options(**config)


def replica_id() -> int:
    """This replica's id, in a replica context (a Python int)."""
    replica_context = tf.distribute.get_replica_context()
    if replica_context is None:
        raise ValueError(
            "Gradients can be communicated only in a replica context. "
            "Call `optimizer.apply` inside `strategy.run(...)` (as "
            "`model.fit` does), not in cross-replica context."
        )
    value = tf.get_static_value(replica_context.replica_id_in_sync_group)
    if value is None:
        raise ValueError(
            "tfgc needs the replica id while tracing, and this strategy "
            f"({type(tf.distribute.get_strategy()).__name__}) does not "
            "give it. Use MultiWorkerMirroredStrategy or MirroredStrategy."
        )
    return int(value)


class Communicator:
    """Exchanges many tensors' payloads in as few collectives as possible.

    Linear payloads (`ALL_REDUCE`) are summed; fixed-size ones
    (`ALL_GATHER`) are stacked by worker; payloads whose size differs
    between workers (`ALL_GATHER_RAGGED`) arrive as ragged rows. The
    subclasses differ in the collective used for linear payloads and in
    how workers are grouped. With one replica nothing is communicated: the
    result is what the one worker would receive.

    The optimizer drives a communicator through `build` (once, before any
    collective, with the run's topology), `compressed_shape` and
    `sends_dense` (per variable, to plan compressors and their state), and
    `step` (per training step, in the replica context).

    Args:
        options: `tf.distribute.experimental.CommunicationOptions` for every
            collective (implementation and timeout; tfgc fuses tensors
            itself, so `bytes_per_pack` is not used).
    """

    name: str
    #: The collective that carries linear payloads.
    linear_via: str = ALL_REDUCE
    #: Whether the planner (`compressor="auto"`) may join neighbouring
    #: buckets under a codec that sizes its own by what it sends.
    joins_buckets: bool = True
    #: The payload kinds this communicator can carry.
    supported: tuple[str, ...] = (
        ALL_REDUCE,
        ALL_GATHER,
        ALL_GATHER_RAGGED,
        BROADCAST,
    )

    def __new__(cls, *args, **kwargs):
        # A misspelled keyword is named with the closest valid one.
        del args
        _arguments.check_keywords(cls.__name__, cls.__init__, kwargs)
        return super().__new__(cls)

    def __init__(self, options: _Options | None = None):
        if options is not None and not isinstance(options, _OPTIONS_TYPE):
            raise TypeError(
                "`options` must be a tf.distribute.experimental."
                f"CommunicationOptions. Received: options={options!r}"
            )
        self.options = options
        self.topology: topology_lib.Topology | None = None

    def supports(self, collective: str) -> bool:
        return collective in self.supported

    # --- planning (cross-replica, before any collective) -------------------

    def build(self, topology: topology_lib.Topology) -> None:
        """Checks that this communicator can run on `topology`; keeps it.

        Raises:
            ValueError: the topology does not fit (before any collective).
        """
        self.topology = topology

    def compressed_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the part of a gradient one worker compresses."""
        return tuple(shape)

    def sends_dense(self, shape: tuple[int, ...]) -> bool:
        """True where this communicator sends a gradient uncompressed."""
        del shape
        return False

    @property
    def num_peers(self) -> int:
        """How many workers exchange each compressed payload."""
        return self._topology().num_replicas

    def route(self, shape: tuple[int, ...], collective: str) -> str:
        """The route (a line of `CollectiveCosts`) a payload of
        `collective` takes for a gradient of `shape`: the planner's view."""
        del shape
        return self.linear_via if collective == ALL_REDUCE else collective

    def host_loads(self, shape: tuple[int, ...], dtype) -> tuple:
        """What a gradient of `shape` puts on collectives inside its host
        beside its codec's payloads, as `TensorLoad`s (none: a flat
        exchange has no such step)."""
        del shape, dtype
        return ()

    def _topology(self) -> topology_lib.Topology:
        return self.topology or topology_lib.current()

    # --- communicating (replica context) ------------------------------------

    def group(self) -> Group:
        """All replicas, as seen by the calling one."""
        topology = self._topology()
        return Group(
            topology, range(topology.num_replicas), replica_id(), self.options
        )

    def all_true(self, flag: tf.Tensor) -> tf.Tensor:
        """True on every replica if the scalar bool `flag` is True on all
        of them (one small all-reduce; none with one replica)."""
        topology = self._topology()
        if topology.num_replicas == 1:
            return flag
        false_count = self.group().all_reduce(
            tf.reshape(tf.cast(tf.logical_not(flag), tf.float32), [1])
        )
        return tf.equal(false_count[0], 0.0)

    def gather_flags(self, flags: tf.Tensor) -> tf.Tensor:
        """Every replica's 1-D bool `flags` (all of one length), as
        [replicas, length] in replica order (one small all-gather; none
        with one replica)."""
        gathered = self.group().all_gather(tf.cast(flags, tf.int32))
        return tf.cast(gathered, tf.bool)

    def step(
        self,
        compressors,
        tensors,
        states,
        keys,
        variables=None,
        bucket_bytes: int | None = None,
    ) -> exchange.StepResult:
        """Compresses, exchanges and decompresses every tensor.

        Args:
            compressors, tensors, states, keys: per tensor, its compressor,
                gradient, compressor state and stateless key.
            variables: per tensor, the variable's value, for compressors
                that read it (`Spec.reads_step_info`); or None.
            bucket_bytes: exchange the tensors in buckets of about this
                many uncompressed bytes (`exchange.buckets`); None: one.

        Returns:
            `StepResult`: the sum over workers of each tensor, the
            compressors' next states, and the bytes this worker sent.
        """
        group = self.group()
        totals, new_states, sent, overhead = exchange.run_rounds(
            compressors,
            tensors,
            states,
            keys,
            lambda payloads, kinds: self.carry(payloads, kinds, group),
            exchange.step_infos(variables, group.rank, group.size),
            bucket_bytes,
        )
        traffic = wire.Traffic(sent, overhead, wire.zero_bytes())
        return exchange.StepResult(totals, new_states, traffic)

    def carry(
        self,
        payloads: Sequence,
        collectives: Sequence[str],
        group: Group | None = None,
    ) -> tuple[list, tf.Tensor]:
        """One round: per payload, the sum (linear), the stack (fixed-size
        gathers), ragged rows (unequal gathers) or the root's payload
        (broadcasts), over `group` (default: all replicas).

        Returns:
            (received, overhead): the payloads as received, and the int64
            bytes sent beyond them.
        """
        for c in collectives:
            if not self.supports(c):
                raise ValueError(
                    f"Communicator {self.name!r} cannot carry a payload "
                    f"that needs {c!r}. Use communicator='auto'."
                )
        group = group or self.group()
        flat = [tf.nest.flatten(p) for p in payloads]
        routes = [
            self.linear_via if c == ALL_REDUCE else c for c in collectives
        ]
        slots: dict[str, list[tuple[int, int]]] = {}
        for i, route in enumerate(routes):
            # A broadcast's root names the sender; it is not sent.
            sent = (
                wire_fields(payloads[i])
                if route == BROADCAST
                else range(len(flat[i]))
            )
            slots.setdefault(route, []).extend((i, j) for j in sent)
        received = [list(f) for f in flat]
        overhead = wire.zero_bytes()
        for route, members in slots.items():
            tensors = [flat[i][j] for i, j in members]
            if route == ALL_REDUCE:
                results = fusion.all_reduce_sum(tensors, group)
            elif route == ALL_GATHER:
                results = fusion.all_gather(tensors, group)
            elif route == BROADCAST:
                results = fusion.broadcast(
                    tensors, group, _one_root(payloads, routes)
                )
            else:
                results, extra = fusion.all_gather_ragged(tensors, group)
                overhead += extra
            for (i, j), r in zip(members, results):
                received[i][j] = r
        out = []
        for i, payload in enumerate(payloads):
            fields = received[i]
            if collectives[i] == ALL_REDUCE and routes[i] == ALL_GATHER:
                fields = [tf.reduce_sum(f, axis=0) for f in fields]
            out.append(tf.nest.pack_sequence_as(payload, fields))
        return out, overhead

    # --- configuration -------------------------------------------------------

    def get_config(self) -> dict:
        return {"options": _options_to_config(self.options)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        options = _options_from_config(config.pop("options", None))
        return cls(options=options, **config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def _one_root(payloads, routes) -> tf.Tensor:
    """The root of a round's broadcasts, which they must share (checked)."""
    roots = [
        getattr(p, ROOT_FIELD)
        for p, r in zip(payloads, routes)
        if r == BROADCAST
    ]
    checks = _checks.independent(
        lambda: [
            tf.debugging.assert_equal(
                root,
                roots[0],
                message="The broadcasts of one round must share their root.",
            )
            for root in roots[1:]
        ]
    )
    with tf.control_dependencies(checks):
        return tf.identity(tf.cast(roots[0], tf.int32))


class Auto(Communicator):
    """All-reduce for linear payloads, all-gather for the rest; both fused."""

    name = "auto"


class AllReduce(Communicator):
    """Only all-reduce: every payload must be linear (Identity, FP16,
    RandomK, PowerSGD); sparse or packed payloads are refused."""

    name = "allreduce"
    supported = (ALL_REDUCE,)


class AllGather(Communicator):
    """All-gather for linear payloads too (gathered, summed locally)."""

    name = "allgather"
    linear_via = ALL_GATHER
