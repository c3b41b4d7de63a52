"""Communicators carry one round of payloads between workers."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfgc.communicators import fusion
from tfgc.compressors.base import ALL_GATHER, ALL_REDUCE

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


class Communicator:
    """Exchanges many tensors' payloads in as few collectives as possible.

    Linear payloads (`ALL_REDUCE`) are summed; the others (`ALL_GATHER`)
    are stacked by worker. The subclasses differ in the collective used for
    linear payloads. With one replica nothing is communicated: the result
    is what the one worker would receive.

    Args:
        options: `tf.distribute.experimental.CommunicationOptions` passed to
            every collective (implementation, bytes_per_pack, timeout).
    """

    name: str
    #: The collective that carries linear payloads.
    linear_via: str = ALL_REDUCE
    #: The payload kinds this communicator can carry.
    supported: tuple[str, ...] = (ALL_REDUCE, ALL_GATHER)

    def __init__(self, options: _Options | None = None):
        if options is not None and not isinstance(options, _OPTIONS_TYPE):
            raise TypeError(
                "`options` must be a tf.distribute.experimental."
                f"CommunicationOptions. Received: options={options!r}"
            )
        self.options = options

    def supports(self, collective: str) -> bool:
        return collective in self.supported

    def exchange(self, payloads: Sequence, collectives: Sequence[str]) -> list:
        """Returns, per payload, the sum (linear) or the stack (others)."""
        replica_context = tf.distribute.get_replica_context()
        if replica_context is None:
            raise ValueError(
                "Gradients can be communicated only in a replica context. "
                "Call `optimizer.apply` inside `strategy.run(...)` (as "
                "`model.fit` does), not in cross-replica context."
            )
        for c in collectives:
            if not self.supports(c):
                raise ValueError(
                    f"Communicator {self.name!r} cannot carry a payload "
                    f"that needs {c!r}. Use communicator='auto'."
                )
        flat = [tf.nest.flatten(p) for p in payloads]
        routes = [
            self.linear_via if c == ALL_REDUCE else ALL_GATHER
            for c in collectives
        ]
        by_route = {ALL_REDUCE: [], ALL_GATHER: []}
        for i, route in enumerate(routes):
            by_route[route].extend((i, j) for j in range(len(flat[i])))
        received = [list(f) for f in flat]
        single = replica_context.num_replicas_in_sync == 1
        for route, slots in by_route.items():
            if not slots:
                continue
            tensors = [flat[i][j] for i, j in slots]
            if single:
                results = (
                    tensors
                    if route == ALL_REDUCE
                    else [t[None] for t in tensors]
                )
            elif route == ALL_REDUCE:
                results = fusion.all_reduce_sum(
                    tensors, replica_context, self.options
                )
            else:
                results = fusion.all_gather(
                    tensors, replica_context, self.options
                )
            for (i, j), r in zip(slots, results):
                received[i][j] = r
        out = []
        for i, payload in enumerate(payloads):
            fields = received[i]
            if collectives[i] == ALL_REDUCE and routes[i] == ALL_GATHER:
                fields = [tf.reduce_sum(f, axis=0) for f in fields]
            out.append(tf.nest.pack_sequence_as(payload, fields))
        return out

    def get_config(self) -> dict:
        return {"options": _options_to_config(self.options)}

    @classmethod
    def from_config(cls, config):
        return cls(options=_options_from_config(config.get("options")))

    def __repr__(self):
        return f"{type(self).__name__}(options={self.options!r})"


class Auto(Communicator):
    """All-reduce for linear payloads, all-gather for the rest; both fused."""

    name = "auto"


class AllReduce(Communicator):
    """Only all-reduce: every payload must be linear (Identity, FP16,
    RandomK, PowerSGD); sparse or packed payloads are refused."""

    name = "allreduce"
    supported = (ALL_REDUCE,)


class AllGather(Communicator):
    """Only all-gather: linear payloads are gathered and summed locally."""

    name = "allgather"
    linear_via = ALL_GATHER
