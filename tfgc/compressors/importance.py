"""Importance-weighted pruning with one index set per step (ring all-reduce)."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc import _arguments, ops
from tfgc.compressors import _sparse, base
from tfgc.core.compressor import NoState, Spec
from tfgc.core.wire import ALL_REDUCE, BROADCAST, num_elements
from tfgc.ops.top_k_sample import slice_start_reference


class IndexPayload(NamedTuple):
    root: tf.Tensor  # int32 scalar: the sender (not sent)
    indices: tf.Tensor  # [k] int32: the positions, used from the root


class ValuePayload(NamedTuple):
    values: tf.Tensor  # [k] this worker's entries at the root's positions


class _Context(NamedTuple):
    shape: tf.TensorShape
    dtype: tf.DType
    flat: tf.Tensor  # this worker's input, flattened
    indices: tf.Tensor | None  # the root's positions, once known
    state: NoState


# One trace for every length (the inputs are flat), not one per tensor.
@tf.function(jit_compile=True, reduce_retracing=True)
def _ratio(acc, weights, floor):
    """acc / (|w| + floor) in float32, one fused pass (XLA): the sign is
    acc's, |.| of it is the importance (`top_k_abs` takes |.| itself)."""
    return tf.cast(acc, tf.float32) / (
        tf.abs(tf.cast(weights, tf.float32)) + floor
    )


def root_worker(step: tf.Tensor, num_peers: int) -> tf.Tensor:
    """The root of a step, the same on every worker: uniform in [0, p).

    SplitMix64 of the step (the hash MSTopK's band slice uses), so a
    numpy reference can draw the same root.
    """
    return tf.cast(
        slice_start_reference(tf.cast(step, tf.int64), num_peers - 1),
        tf.int32,
    )


@base.register
class ImportancePruning(base.DensityCompressor):
    """Sends the entries that one worker finds most important, from all.

    Cheng and Xu, "Bandwidth Reduction using Importance Weighted Pruning on
    Ring AllReduce" (arXiv 1901.01544); docs/algorithms.md, section
    "Importance-weighted pruning", says what is reconstructed. With error
    feedback (the optimizer's default) each worker keeps acc = residual +
    g. Every step a root worker is drawn from the step (the same on every
    worker, no message); the root ranks its entries by importance

        |acc| / (|w| + relative_epsilon * rms(w) + epsilon),

    w the variable's value and rms(w) = ||w|| / sqrt(n) over the tensor,
    and broadcasts its k = ceil(density * n) most important positions
    (measured cheaper than an all-reduce in which the others send zeros,
    or an all-gather: docs/algorithms.md). All workers then all-reduce
    their acc at those positions; what was sent leaves the residual. One
    index set per step: ring all-reduce compatible.

    The paper's importance is the ratio of gradient to weight. Where a
    weight is small next to the tensor's typical weight, the floor
    relative_epsilon * rms(w) (reconstructed) ranks it by its gradient
    instead of by how close the weight is to zero: with relative_epsilon
    = 0 weights that cross zero, and biases at their zero initialisation,
    take the whole budget, the residual of the large weights grows
    unchecked and training diverged (docs/algorithms.md).

    Bytes on the wire per worker: k * 4 (positions, broadcast; on a ring
    every worker but one forwards them) + k * itemsize (values,
    all-reduced), in two dependent collectives.

    Args:
        density: fraction of entries sent (the paper's 1 / ratio), in (0, 1].
        epsilon: added to the denominator so that a tensor of zeros does
            not divide by zero; > 0.
        relative_epsilon: the denominator's floor in units of the tensor's
            rms(w); >= 0. 0 ranks by |acc| / (|w| + epsilon) alone, the
            ranking before this argument existed.
    """

    spec = Spec(collectives=(BROADCAST, ALL_REDUCE), reads_step_info=True)

    def __init__(
        self,
        density: float = 0.01,
        epsilon: float = 1e-8,
        relative_epsilon: float = 1.0,
    ):
        super().__init__(density)
        eps = _arguments.check_number("epsilon", epsilon, "a number > 0")
        if not eps > 0:
            raise ValueError(
                f"`epsilon` must be a number > 0. Received: epsilon={epsilon!r}"
            )
        self.epsilon = eps
        requirement = (
            "a number >= 0, the denominator's floor in units of the "
            "tensor's root-mean-square weight (0: none)"
        )
        rel = _arguments.check_number(
            "relative_epsilon", relative_epsilon, requirement
        )
        if not rel >= 0:
            raise ValueError(
                f"`relative_epsilon` must be {requirement}. Received: "
                f"relative_epsilon={relative_epsilon!r}"
            )
        self.relative_epsilon = rel

    def _floor(self, weights: tf.Tensor) -> tf.Tensor:
        """relative_epsilon * rms(w) + epsilon, a float32 scalar."""
        eps = tf.constant(self.epsilon, tf.float32)
        if not self.relative_epsilon:
            return eps
        w = tf.cast(weights, tf.float32)
        if ops.compiling_with_xla():  # XLA has no EuclideanNorm kernel
            norm = tf.sqrt(tf.reduce_sum(tf.square(w)))
        else:  # one read, where the sum of squares writes w * w first
            norm = tf.math.reduce_euclidean_norm(w)
        n = tf.cast(tf.size(w), tf.float32)
        rms = norm / tf.sqrt(tf.maximum(n, 1.0))
        return self.relative_epsilon * rms + eps

    def compress(self, x, state, key, info=None):
        if info is None:
            raise ValueError(
                "ImportancePruning reads the variable's value (importance is "
                "|acc| / (|w| + floor)); use it through "
                "tfgc.CompressedOptimizer, which passes it."
            )
        flat = tf.reshape(x, [-1])
        w = tf.reshape(info.variable, [-1])
        floor = self._floor(w)
        # Inside a step XLA compiles, the same ops join its cluster.
        ratio = _ratio.python_function if ops.compiling_with_xla() else _ratio
        score = ratio(flat, w, floor)
        _, indices = ops.top_k_abs(score, self.num_selected(x.shape))
        indices = tf.sort(indices)
        root = root_worker(key[1], info.num_peers)
        return IndexPayload(root, indices), _Context(
            x.shape, x.dtype, flat, None, state
        )

    def next_round(self, reduced, ctx):
        indices = reduced.indices  # the root's
        values = tf.gather(ctx.flat, indices)
        return ValuePayload(values), ctx._replace(indices=indices)

    def decompress(self, reduced, ctx):
        n = num_elements(ctx.shape)
        total = _sparse.scatter_sum(reduced.values, ctx.indices, n, ctx.dtype)
        return tf.reshape(total, ctx.shape), ctx.state

    def local_estimate(self, payload, ctx):
        n = num_elements(ctx.shape)
        mine = _sparse.scatter_sum(payload.values, ctx.indices, n, ctx.dtype)
        return tf.reshape(mine, ctx.shape)

    def payload_bytes(self, shape, dtype):
        return self.num_selected(shape) * (4 + tf.as_dtype(dtype).size)

    def get_config(self):
        return {
            "density": self.density,
            "epsilon": self.epsilon,
            "relative_epsilon": self.relative_epsilon,
        }
