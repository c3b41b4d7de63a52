"""What one exchange bucket costs under each codec: the planner's model.

A bucket's exchange is its compression, its collectives and its
decompression. The collectives of one device run in program order (they
share its ordering token), so buckets go on the wire one after another;
a bucket's compression can start as soon as its gradients exist.

* Collectives: a line per route, fitted to measured collectives of this
  cluster (`tfgc.communicators.probe.collective_costs`): seconds = fixed +
  per_byte * bytes of one worker's buffer. The line holds for the group
  of workers it was measured with; nothing about rings is assumed. Under
  the hierarchical communicator the codecs' payloads travel among the
  hosts (one worker of each), and each gradient is also summed and
  gathered inside its host (`HOST_REDUCE`, `HOST_GATHER`) or, below its
  size threshold, all-reduced dense among all workers (`EVERYONE`).
* Codecs: seconds = per_tensor * tensors + per_element * elements of the
  tensors the codec compresses, measured on this device with error
  feedback where the optimizer adds it (`tfgc.optimizers.auto_plan`).
  Tensors a codec declines travel dense in its all-reduce.

See docs/algorithms.md, "The planner".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from tfgc.core.wire import ALL_GATHER, ALL_REDUCE

#: Routes of the hierarchical exchange beside the codecs' own (ALL_REDUCE,
#: ALL_GATHER among the hosts): a gradient's sum inside its host (a
#: reduce-scatter, or an all-reduce where there is none), its summed
#: shards gathered inside the host, and a dense all-reduce among all
#: workers for gradients under the size threshold.
HOST_REDUCE = "host_reduce"
HOST_GATHER = "host_gather"
EVERYONE = "everyone"


class Line(NamedTuple):
    """seconds = fixed + slope * x."""

    fixed: float
    slope: float

    def __call__(self, x: float) -> float:
        return self.fixed + self.slope * x

    @classmethod
    def through(cls, x0: float, t0: float, x1: float, t1: float) -> Line:
        """The line through two measurements, neither part below zero."""
        slope = max((t1 - t0) / (x1 - x0), 0.0)
        return cls(max(t0 - slope * x0, 0.0), slope)


class CollectiveCosts(NamedTuple):
    """Seconds of one fused collective, by the bytes of one worker's buffer.

    Attributes:
        all_reduce: a sum of every worker's buffer (of the group the
            codecs' payloads travel in).
        all_gather: every worker's buffer, stacked.
        host_reduce: the hierarchical exchange's sum inside a host (None:
            a flat exchange, which has none); `host_gather`, `everyone`
            likewise (the routes of the same names).
    """

    all_reduce: Line
    all_gather: Line
    host_reduce: Line | None = None
    host_gather: Line | None = None
    everyone: Line | None = None

    def seconds(self, route: str, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        line = {
            ALL_REDUCE: self.all_reduce,
            ALL_GATHER: self.all_gather,
            HOST_REDUCE: self.host_reduce,
            HOST_GATHER: self.host_gather,
            EVERYONE: self.everyone,
        }[route]
        if line is None:
            raise ValueError(
                f"No cost was measured for the route {route!r}: the "
                "collectives were measured for a flat exchange."
            )
        return line(nbytes)


#: Nothing is communicated (one worker).
FREE = CollectiveCosts(Line(0.0, 0.0), Line(0.0, 0.0))


class CodecCosts(NamedTuple):
    """Seconds a codec adds to a step on this device (compress, local
    decompress, error feedback): per tensor it compresses, and per
    element of those tensors."""

    per_tensor: float
    per_element: float

    def seconds(self, tensors: int, elements: int) -> float:
        return self.per_tensor * tensors + self.per_element * elements

    @classmethod
    def solve(
        cls, one: tuple[int, int, float], two: tuple[int, int, float]
    ) -> CodecCosts:
        """From two measurements (tensors, elements, seconds), each part
        at least zero."""
        (m0, n0, t0), (m1, n1, t1) = one, two
        det = m0 * n1 - m1 * n0
        per_tensor = max((t0 * n1 - t1 * n0) / det, 0.0)
        per_element = max((m0 * t1 - m1 * t0) / det, 0.0)
        return cls(per_tensor, per_element)


class TensorLoad(NamedTuple):
    """What one tensor puts on the wire under one codec phase.

    Attributes:
        route: the collective of its rounds (ALL_REDUCE or ALL_GATHER).
        rounds: its dependent communication rounds.
        nbytes: its payload bytes per worker, over all rounds.
        elements: its elements, if the codec compresses it; 0 if it
            travels dense (no codec time).
    """

    route: str
    rounds: int
    nbytes: int
    elements: int


def bucket_seconds(
    phases: Sequence[Sequence[TensorLoad]],
    codec: CodecCosts,
    collectives: CollectiveCosts,
) -> float:
    """A bucket's predicted exchange seconds under one codec: the mean
    over the codec's phases (one per step, in turn) of its compute
    (`codec_seconds`) plus, per round, one fused collective per route (a
    tensor's bytes spread evenly over its rounds)."""
    total = 0.0
    for loads in phases:
        seconds = _compute(loads, codec)
        rounds = max(t.rounds for t in loads)
        routes = dict.fromkeys(t.route for t in loads)
        for r in range(rounds):
            for route in routes:
                nbytes = sum(
                    t.nbytes / t.rounds
                    for t in loads
                    if t.route == route and r < t.rounds
                )
                seconds += collectives.seconds(route, nbytes)
        total += seconds
    return total / len(phases)


def codec_seconds(
    phases: Sequence[Sequence[TensorLoad]], codec: CodecCosts
) -> float:
    """The compute part of `bucket_seconds`: the mean over the phases of
    the codec's seconds on the tensors it compresses."""
    return sum(_compute(loads, codec) for loads in phases) / len(phases)


def _compute(loads: Sequence[TensorLoad], codec: CodecCosts) -> float:
    compressed = [t for t in loads if t.elements]
    return codec.seconds(len(compressed), sum(t.elements for t in compressed))


def pipelined_seconds(
    ready: Sequence[float],
    exchange: Sequence[float],
    compute: Sequence[float] | None = None,
) -> float:
    """When the last bucket's exchange ends, buckets in exchange order.

    Bucket b's collectives start when its gradients exist (`ready[b]`,
    seconds from the step's start), its codec has run on them
    (`compute[b]` of its `exchange[b]` seconds; none without `compute`)
    and the previous bucket is off the wire: a bucket is compressed while
    the one before it travels. (Its decompression, after its collectives,
    is counted before them: the model keeps one number per codec.)"""
    if compute is None:
        compute = [0.0] * len(exchange)
    end = 0.0
    for at, seconds, work in zip(ready, exchange, compute):
        end = max(end, at + work) + seconds - work
    return end
