"""PowerSGD: rank-r power iteration with warm start."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgc.compressors import base
from tfgc.core.compressor import Compressor, Spec
from tfgc.core.wire import ALL_REDUCE, num_elements


class FactorPayload(NamedTuple):
    factor: tf.Tensor  # P [rows, r] in round 0, Q [cols, r] in round 1


class PowerSGDState(NamedTuple):
    q: tf.Tensor  # [cols, r], the last all-reduced Q (warm start)


class _Context(NamedTuple):
    shape: tf.TensorShape
    dtype: tf.DType
    m: tf.Tensor  # the matrix view of x, in the compute dtype
    p_orth: tf.Tensor | None  # orth(all-reduced P), from round 1 on
    key: tf.Tensor  # seeds a fresh Q where the all-reduced one is unusable


def matrix_shape(shape) -> tuple[int, int]:
    """(prod(shape[:-1]), shape[-1]): the matrix a low-rank method factors.

    Keras keeps the output axis last (Dense (in, out), Conv2D (kh, kw, in,
    out)); the papers' PyTorch code views (out, in*kh*kw). The transpose
    has the same low-rank factors. A scalar is the 1 x 1 matrix.
    """
    if not len(shape):
        return 1, 1
    cols = int(shape[-1])
    return num_elements(shape) // max(cols, 1), cols


def compute_dtype(dtype) -> tf.DType:
    """QR has no 16-bit kernels: half-precision gradients factor in fp32."""
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype.size < 4 else dtype


def effective_rank(shape, rank: int) -> int:
    """min(rank, rows, cols) of the matrix view."""
    rows, cols = matrix_shape(shape)
    return min(rank, rows, cols)


def low_rank_worthwhile(shape, rank: int) -> bool:
    """A matrix (2+ dimensions) whose rank-r factors are smaller than it."""
    if len(shape) < 2:
        return False
    rows, cols = matrix_shape(shape)
    return (rows + cols) * effective_rank(shape, rank) < rows * cols


def warm_start(q: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """The factor the next step starts from: the all-reduced `q`, or a
    normal draw seeded by `key` where `q` cannot serve.

    A Q with a non-finite entry would make every later factor NaN. A zero
    Q (every entry below the smallest normal number, which the matmul
    kernels flush to zero) would make the next P = M Q zero, whose QR is
    the first unit vectors, so the next update would keep only the first
    rows of the gradient. The choice depends only on the all-reduced Q,
    identical on every worker, as is `key`.
    """
    tiny = np.finfo(q.dtype.as_numpy_dtype).tiny
    usable = tf.reduce_all(tf.math.is_finite(q)) & tf.reduce_any(
        tf.abs(q) >= tiny
    )
    fresh = tf.random.stateless_normal(tf.shape(q), seed=key, dtype=q.dtype)
    return tf.where(usable, q, fresh)


@base.register
class PowerSGD(Compressor):
    """Low-rank compression by one step of power iteration per step.

    Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
    Compression for Distributed Optimization" (NeurIPS 2019). A tensor is
    viewed as a matrix M of shape (prod(shape[:-1]), shape[-1]) (Keras puts
    the output axis last; the paper's PyTorch view is the transpose, with
    the same factors) with rank r = min(rank, rows, cols). Each step:
    P = M Q; all-reduce P; P = orth(P) (reduced QR); Q = M^T P; all-reduce
    Q; the update is P Q^T.
    Two dependent all-reduces per step, as in the paper. Q persists as warm
    start and starts from the same seeded normal draw on every worker.
    A warm start that cannot recover is drawn afresh: when the all-reduced
    Q has a NaN or infinite entry (a non-finite gradient on some worker;
    the update P Q^T carries it to the optimizer) or all its entries are
    below the smallest normal number (an all-zero gradient), the next
    step starts from a normal draw seeded by this step's key instead. The
    all-reduced Q and the key are the same on every worker, so every worker
    makes the same choice and draws the same Q.
    Tensors with fewer than 2 dimensions, or where the factors would not be
    smaller than the matrix, are sent dense by the optimizer.

    Bytes on the wire per worker: (rows + cols) * r * itemsize (fp32 for
    16-bit gradients).

    Args:
        rank: the rank r of the approximation.
        warmup_steps: steps at the start that send every tensor dense (the
            paper's start step; error feedback and factors wait).
    """

    def __init__(self, rank: int = 4, warmup_steps: int = 0):
        self.rank = base.check_positive_int("rank", rank)
        self.warmup_steps = base.check_positive_int(
            "warmup_steps", warmup_steps, minimum=0
        )

    @property
    def spec(self) -> Spec:
        return Spec(
            collectives=(ALL_REDUCE, ALL_REDUCE),
            warmup_steps=self.warmup_steps,
        )

    def _rank(self, shape):
        return effective_rank(shape, self.rank)

    def should_compress(self, shape, dtype="float32", network=None):
        del dtype, network
        return low_rank_worthwhile(shape, self.rank)

    def init_state(self, shape, dtype, key):
        _, cols = matrix_shape(shape)
        q = tf.random.stateless_normal(
            [cols, self._rank(shape)], seed=key, dtype=compute_dtype(dtype)
        )
        return PowerSGDState(q)

    def compress(self, x, state, key):
        rows, cols = matrix_shape(x.shape)
        m = tf.reshape(tf.cast(x, compute_dtype(x.dtype)), [rows, cols])
        p = tf.matmul(m, state.q)
        return FactorPayload(p), _Context(x.shape, x.dtype, m, None, key)

    def next_round(self, reduced, ctx):
        p_orth, _ = tf.linalg.qr(reduced.factor)
        q = tf.matmul(ctx.m, p_orth, transpose_a=True)
        return FactorPayload(q), ctx._replace(p_orth=p_orth)

    def _expand(self, q, ctx):
        approx = tf.matmul(ctx.p_orth, q, transpose_b=True)
        return tf.reshape(tf.cast(approx, ctx.dtype), ctx.shape)

    def decompress(self, reduced, ctx):
        q = warm_start(reduced.factor, ctx.key)
        return self._expand(reduced.factor, ctx), PowerSGDState(q)

    def local_estimate(self, payload, ctx):
        return self._expand(payload.factor, ctx)

    def payload_bytes(self, shape, dtype):
        rows, cols = matrix_shape(shape)
        itemsize = compute_dtype(dtype).size
        return (rows + cols) * self._rank(shape) * itemsize

    def get_config(self):
        return {"rank": self.rank, "warmup_steps": self.warmup_steps}
