"""A short start-up probe of the real collectives and of selection speed.

`measure()` times dense all-reduces of two sizes among all replicas and
fits RedSync's alpha-beta model to them (time = 2(p-1) alpha + 2 (p-1)/p M
beta), times threshold selection and decompression of a heavy-tailed
tensor on this worker, and then averages every number over the workers
with an all-reduce. Decisions made from the result are therefore the same
on every worker, which they must be: a tensor sent dense by one worker and
sparse by another would hang the collectives. `collective_costs()` does
the same for the planner (`compressor="auto"`): a line through two sizes
of all-reduce and of all-gather, without a ring formula.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import tensorflow as tf

from tfgc import ops
from tfgc.communicators import topology as topology_lib
from tfgc.communicators.collectives import Group
from tfgc.communicators.communicator import replica_id
from tfgc.communicators.hierarchical import REDUCE_SCATTER, Hierarchical
from tfgc.core.bucket_costs import FREE, CollectiveCosts, Line
from tfgc.core.cost_model import CostModel

#: Bytes of the two all-reduces the line is fitted to.
SIZES = (16 * 1024, 4 * 1024 * 1024)
#: Elements of the tensor selection and decompression are timed on.
COMPUTE_ELEMENTS = 1 << 21
_DENSITY = 0.001
_FIELDS = ("latency", "bandwidth", "select_time", "scatter_time")


def median_seconds(fn, repeats: int) -> float:
    """The median wall time of `repeats` calls of `fn`, after one call
    that traces and warms up."""
    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _collective_fn(
    strategy, num_floats: int, options, method: str, group_of=None
):
    """A callable that runs one `Group` collective (`method`) of a float32
    buffer of `num_floats` and waits for it: among all replicas, or in
    the group `group_of()` returns in the replica context."""
    topology = topology_lib.current(strategy)

    @tf.function
    def run():
        def replica_fn():
            if group_of is None:
                group = Group(
                    topology,
                    range(topology.num_replicas),
                    replica_id(),
                    options,
                )
            else:
                group = group_of()
            # A reduce-scatter splits its buffer evenly among the group.
            length = num_floats - num_floats % group.size
            return getattr(group, method)(tf.ones([length], tf.float32))

        result = strategy.run(replica_fn)
        return strategy.experimental_local_results(result)[0][0]

    return lambda: run().numpy()


def heavy_tailed(shape, seed: int = 0) -> tf.Tensor:
    """float32 values like real gradients' (Student's t, 2 degrees of
    freedom), the same for the same `shape` and `seed`."""
    rng = np.random.default_rng(seed)
    return tf.constant(rng.standard_t(2, size=shape).astype(np.float32))


def measure_local(
    strategy: tf.distribute.Strategy | None = None,
    repeats: int = 5,
    options=None,
) -> CostModel:
    """This worker's own measurements (they differ between workers).

    Call in a cross-replica context, outside `tf.function`, on every worker
    at the same time (the all-reduces are collective).
    """
    strategy = strategy or tf.distribute.get_strategy()
    p = strategy.num_replicas_in_sync
    latency, bandwidth = 0.0, float("inf")
    if p > 1:
        small, large = (
            median_seconds(
                _collective_fn(strategy, size // 4, options, "all_reduce"),
                repeats,
            )
            for size in SIZES
        )
        slope = max((large - small) / (SIZES[1] - SIZES[0]), 1e-15)
        fixed = max(small - slope * SIZES[0], 0.0)
        latency = fixed / (2 * (p - 1))
        bandwidth = 2 * (p - 1) / (p * slope)
    x = heavy_tailed(COMPUTE_ELEMENTS)
    k = max(1, int(_DENSITY * COMPUTE_ELEMENTS))
    select = tf.function(lambda: ops.top_k_sample(x, k, mode="threshold")[1])
    indices = select()
    values = tf.gather(x, indices)
    scatter = tf.function(
        lambda: ops.scatter_add_sum(values, indices, COMPUTE_ELEMENTS)
    )
    select_time = median_seconds(lambda: select().numpy(), repeats)
    scatter_time = median_seconds(lambda: scatter().numpy(), repeats)
    return CostModel(
        latency=latency,
        bandwidth=bandwidth if np.isfinite(bandwidth) else 1e30,
        select_time=select_time / COMPUTE_ELEMENTS,
        scatter_time=scatter_time / COMPUTE_ELEMENTS,
    )


def agree(
    local: CostModel,
    strategy: tf.distribute.Strategy | None = None,
    options=None,
) -> CostModel:
    """The mean over all replicas of every field of `local`.

    Every worker gets the same result (one all-reduce in float64).
    """
    means = agree_values(
        [getattr(local, f) for f in _FIELDS], strategy, options
    )
    return dataclasses.replace(
        local, **{f: float(v) for f, v in zip(_FIELDS, means)}
    )


def agree_values(
    values, strategy: tf.distribute.Strategy | None = None, options=None
) -> np.ndarray:
    """The mean over all replicas of each of this worker's `values`
    (numbers), the same on every worker: one all-reduce in float64, whose
    result every member receives alike. Call as `measure_local`."""
    strategy = strategy or tf.distribute.get_strategy()
    p = strategy.num_replicas_in_sync
    mine = np.asarray(values, np.float64)
    if p == 1:
        return mine
    topology = topology_lib.current(strategy)
    constant = tf.constant(mine)

    @tf.function
    def run():
        def replica_fn():
            group = Group(
                topology, range(topology.num_replicas), replica_id(), options
            )
            return group.all_reduce(tf.identity(constant))

        result = strategy.run(replica_fn)
        return strategy.experimental_local_results(result)[0]

    return run().numpy() / p


def collective_costs(
    strategy: tf.distribute.Strategy | None = None,
    repeats: int = 5,
    options=None,
    communicator=None,
) -> CollectiveCosts:
    """Lines through this cluster's all-reduce and all-gather times at the
    two buffer sizes of `SIZES` (median of `repeats`), averaged over the
    workers so that every worker gets the same (`agree_values`). Under the
    hierarchical `communicator` the two are measured among the hosts (one
    worker of each, as its payloads travel), and its other routes too:
    the sum inside a host (its reduce-scatter, or all-reduce), the gather
    inside a host and the all-reduce among all workers.

    Call in a cross-replica context, outside `tf.function`, on every
    worker at the same time, the communicator built. With one replica
    nothing is communicated: every line is zero.
    """
    strategy = strategy or tf.distribute.get_strategy()
    if strategy.num_replicas_in_sync == 1:
        return FREE
    measured = [(None, "all_reduce"), (None, "all_gather")]
    if isinstance(communicator, Hierarchical):
        hosts = lambda: communicator.groups()[2]  # noqa: E731
        host = lambda: communicator.groups()[1]  # noqa: E731
        everyone = lambda: communicator.groups()[0]  # noqa: E731
        host_sum = (
            "reduce_scatter"
            if communicator.intra_host_reduce == REDUCE_SCATTER
            else "all_reduce"
        )
        measured = [
            (hosts, "all_reduce"),
            (hosts, "all_gather"),
            (host, host_sum),
            (host, "all_gather"),
            (everyone, "all_reduce"),
        ]
    times = [
        median_seconds(
            _collective_fn(strategy, size // 4, options, method, group_of),
            repeats,
        )
        for group_of, method in measured
        for size in SIZES
    ]
    times = agree_values(times, strategy, options)
    small, large = SIZES
    return CollectiveCosts(
        *(
            Line.through(small, times[2 * i], large, times[2 * i + 1])
            for i in range(len(measured))
        )
    )


def measure(
    strategy: tf.distribute.Strategy | None = None,
    repeats: int = 5,
    options=None,
) -> CostModel:
    """`agree(measure_local())`: the same `CostModel` on every worker."""
    return agree(measure_local(strategy, repeats, options), strategy, options)
