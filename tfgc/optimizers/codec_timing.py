"""How long each candidate of `tfgc.compressors.Auto` takes to compress and
decompress on this device: one local exchange (a group of one worker, so
nothing leaves it) of synthetic heavy-tailed tensors, driven as the
optimizer drives it, solved for seconds per tensor and per element.

See docs/algorithms.md, "The planner".
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgc.communicators import exchange, probe
from tfgc.communicators.collectives import Group
from tfgc.core.bucket_costs import CodecCosts
from tfgc.core.compressor import Network
from tfgc.core.wire import ALL_GATHER, num_elements
from tfgc.optimizers import planning

#: The two workloads each candidate's compute is timed on: one large
#: matrix, and many small ones (per-tensor costs).
WORKLOADS = (((1024, 1024),), ((64, 64),) * 16)
#: Timed calls per workload, and per collective size in `probe.collective_costs`
#: (their median counts).
REPEATS = 5


class _Stub(NamedTuple):
    """What planning reads of a variable, for a synthetic workload."""

    shape: tuple[int, ...]
    dtype: str = "float32"


def as_from_peers(received, kinds, peers: int) -> list:
    """A one-worker round's `received` payloads as `peers` workers would
    receive them: each gathered payload stacked `peers` times (this
    worker's, standing for every peer's), so that decompression sums as
    many as in the step. Sums (all-reduce) are the same size for any
    number of workers."""
    out = []
    for payload, kind in zip(received, kinds):
        if kind == ALL_GATHER:

            def stack(t):
                return tf.tile(t, [peers] + [1] * (t.shape.rank - 1))

            payload = tf.nest.map_structure(stack, payload)
        out.append(payload)
    return out


def codec_seconds(
    settings, candidate, shapes, communicator, topology, from_peers=None
):
    """Median seconds of one local exchange (one-worker group: nothing
    leaves this worker) of `shapes` under `candidate`, as the optimizer
    would drive it, averaged over its phases. Gathered payloads are
    decompressed as from `communicator.num_peers` workers: `from_peers
    (received, kinds, peers)` makes them (default `as_from_peers`)."""
    group = Group(topology, [0], 0, communicator.options)
    peers = communicator.num_peers
    from_peers = from_peers or as_from_peers

    def carry(payloads, kinds):
        received, overhead = communicator.carry(payloads, kinds, group)
        return from_peers(received, kinds, peers), overhead

    # Every workload tensor compressed, whatever the user's minimum.
    chosen = settings._replace(compressor=candidate, min_compress_size=0)
    net = Network(1, None)
    stubs = [_Stub(shape) for shape in shapes]
    tensors = [probe.heavy_tailed(s, i) for i, s in enumerate(shapes)]
    phase_lists = [
        planning.compressors_for(chosen, stub, stub.shape, net)[0]
        for stub in stubs
    ]
    count = max(len(p) for p in phase_lists)
    keys = [planning.key(i, 0) for i in range(len(shapes))]
    seconds = []
    for j in range(count):
        codecs = [p[j % len(p)] for p in phase_lists]
        states = [
            c.init_state(s, tf.float32, planning.key(i, planning.INIT_STEP))
            for i, (c, s) in enumerate(zip(codecs, shapes))
        ]

        @tf.function
        def run(codecs=codecs, states=states):
            totals, _, _, _ = exchange.run_rounds(
                codecs,
                tensors,
                states,
                keys,
                carry,
            )
            return tf.add_n([tf.reduce_sum(t) for t in totals])

        seconds.append(
            probe.median_seconds(lambda run=run: run().numpy(), REPEATS)
        )
    return float(np.mean(seconds))


def measure_codec(settings, candidate, communicator, topology) -> CodecCosts:
    """`candidate`'s compute per tensor and per element on this worker."""
    points = []
    for shapes in WORKLOADS:
        seconds = codec_seconds(
            settings, candidate, shapes, communicator, topology
        )
        points.append(
            (len(shapes), sum(num_elements(s) for s in shapes), seconds)
        )
    return CodecCosts.solve(*points)
