"""Communicators: the only code that calls the replica context."""

from __future__ import annotations

from tfgc.communicators.communicator import (
    AllGather,
    AllReduce,
    Auto,
    Communicator,
)
from tfgc.communicators.exchange import StepResult
from tfgc.communicators.hierarchical import Hierarchical
from tfgc.communicators.topology import Topology
from tfgc.core.wire import Traffic

_BY_NAME = {c.name: c for c in (Auto, AllReduce, AllGather, Hierarchical)}


def names() -> list[str]:
    return sorted(_BY_NAME)


def get(identifier, options=None) -> Communicator:
    """Returns a communicator from a name ("auto", "allreduce",
    "allgather", "hierarchical"), a `{"name": ..., "config": ...}` dict,
    or an instance."""
    if isinstance(identifier, Communicator):
        if options is not None:
            raise ValueError(
                "Pass `options` with a communicator name, or give the "
                "Communicator instance its own options. Received both: "
                f"{identifier!r} and options={options!r}"
            )
        return identifier
    if isinstance(identifier, dict):
        cls = _BY_NAME.get(identifier.get("name"))
        if cls is not None:
            return cls.from_config(identifier.get("config", {}))
    if isinstance(identifier, str):
        key = identifier.lower().replace("-", "").replace("_", "")
        if key in _BY_NAME:
            return _BY_NAME[key](options=options)
    raise ValueError(
        f"Unknown communicator {identifier!r}. Use one of {names()} or a "
        "tfgc.communicators.Communicator instance."
    )


def serialize(communicator: Communicator) -> dict:
    return {"name": communicator.name, "config": communicator.get_config()}


__all__ = [
    "AllGather",
    "AllReduce",
    "Auto",
    "Communicator",
    "Hierarchical",
    "StepResult",
    "Topology",
    "Traffic",
    "get",
    "names",
    "serialize",
]
