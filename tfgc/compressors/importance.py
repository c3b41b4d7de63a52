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


class _Fused(NamedTuple):
    """This worker's own choice on the fused path (`top_k_ratio`)."""

    is_root: bool | tf.Tensor  # whether its choice is the root's
    indices: tf.Tensor  # [k] int32, increasing
    values: tf.Tensor  # [k] acc there
    residual: tf.Tensor  # acc with them zeroed, flattened


class _Context(NamedTuple):
    shape: tf.TensorShape
    dtype: tf.DType
    flat: tf.Tensor | None  # this worker's input, flattened (None: fused)
    indices: tf.Tensor | None  # the root's positions, once known
    state: NoState
    fused: _Fused | None = None
    # The new residual on the fused path, once the root's positions are
    # known, flattened.
    residual: tf.Tensor | None = None


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


def _take_root_choice(own: _Fused, root_indices: tf.Tensor):
    """acc at the root's positions and acc with them zeroed, from this
    worker's own choice: acc is own.residual with own.values put back at
    own.indices. Both index sets are increasing; O(k log k) besides the
    scatter (for which TensorFlow copies the residual unless it can reuse
    its buffer: one pass, on the workers but the root), and on the root
    itself nothing."""
    if own.is_root is True:
        return own.values, own.residual

    def other():
        k = tf.shape(own.indices)[0]
        # Where each position of one set would go in the other, and whether
        # it is there.
        at = tf.minimum(tf.searchsorted(own.indices, root_indices), k - 1)
        mine = tf.gather(own.indices, at) == root_indices
        values = tf.where(
            mine,
            tf.gather(own.values, at),
            tf.gather(own.residual, root_indices),
        )
        back = tf.minimum(tf.searchsorted(root_indices, own.indices), k - 1)
        sent = tf.gather(root_indices, back) == own.indices
        # Own positions the root did not choose get their value back, the
        # root's get 0 (a position in both is written 0 twice).
        updates = tf.concat(
            [
                tf.where(sent, tf.zeros_like(own.values), own.values),
                tf.zeros_like(values),
            ],
            0,
        )
        positions = tf.concat([own.indices, root_indices], 0)[:, None]
        residual = tf.tensor_scatter_nd_update(own.residual, positions, updates)
        return values, residual

    if own.indices.shape[0] == 0:  # k = 0: nothing chosen anywhere
        return own.values, own.residual
    return tf.cond(own.is_root, lambda: (own.values, own.residual), other)


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

    Under `ErrorFeedback` the ranking, the selection and the residual
    update are one op (`tfgc.ops.top_k_ratio`: compiled, or its pure-TF
    twin), the same selection as `compress` of acc.

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

    def _check_info(self, info):
        if info is None:
            raise ValueError(
                "ImportancePruning reads the variable's value (importance is "
                "|acc| / (|w| + floor)); use it through "
                "tfgc.CompressedOptimizer, which passes it."
            )

    def compress(self, x, state, key, info=None):
        self._check_info(info)
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

    def compress_with_residual(self, x, residual, state, key, info=None):
        # One op (`tfgc.ops.top_k_ratio`) adds the residual, ranks, and
        # zeroes what it selects, where the generic path adds, ranks,
        # scatters the local estimate and subtracts, each a pass over the
        # tensor. The root's choice is this worker's own on the root; the
        # others correct their residual in `next_round` (_take_root_choice).
        self._check_info(info)
        if info.variable.dtype != x.dtype:
            return None  # the op takes w in x's dtype; ranking would change
        w = tf.reshape(info.variable, [-1])
        values, indices, new_residual = ops.top_k_ratio(
            tf.reshape(x, [-1]),
            self.num_selected(x.shape),
            w,
            self._floor(w),
            tf.reshape(residual, [-1]),
        )
        root = root_worker(key[1], info.num_peers)
        # One worker: the root, known while tracing.
        is_root = info.num_peers == 1 or tf.equal(root, info.rank)
        fused = _Fused(is_root, indices, values, new_residual)
        ctx = _Context(x.shape, x.dtype, None, None, state, fused)
        return (
            IndexPayload(root, indices),
            ctx,
            tf.reshape(new_residual, x.shape),
        )

    def next_round(self, reduced, ctx):
        indices = reduced.indices  # the root's
        if ctx.fused is not None:
            values, residual = _take_root_choice(ctx.fused, indices)
            ctx = ctx._replace(residual=residual)
        else:
            values = tf.gather(ctx.flat, indices)
        return ValuePayload(values), ctx._replace(indices=indices)

    def residual_after_rounds(self, ctx, residual):
        del residual  # this worker's own choice zeroed, not the root's
        return tf.reshape(ctx.residual, ctx.shape)

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
