"""ACP-SGD: PowerSGD's two factors, all-reduced on alternate steps."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc.compressors import base
from tfgc.compressors.powersgd import (
    FactorPayload,
    compute_dtype,
    effective_rank,
    matrix_shape,
    warm_start,
)
from tfgc.core.compressor import Compressor, Spec
from tfgc.core.wire import ALL_REDUCE

FACTORS = ("p", "q")
#: Bytes of the factors (and dense tensors) each step sends per bucket:
#: the authors' tensor-fusion threshold of 5 MB.
DEFAULT_BUCKET_BYTES = 5 * 1024 * 1024


class ACPState(NamedTuple):
    p: tf.Tensor  # [rows, r], the last all-reduced P (sum over workers)
    q: tf.Tensor  # [cols, r], the last all-reduced Q
    p_steps: tf.Tensor  # int64: P steps taken so far
    q_steps: tf.Tensor  # int64: Q steps taken so far


class _Context(NamedTuple):
    shape: tf.TensorShape
    dtype: tf.DType
    fixed: tf.Tensor  # the orthogonalised factor this step multiplies by
    state: ACPState
    key: tf.Tensor  # seeds a fresh factor where the reduced one is unusable


def _orthonormal(factor: tf.Tensor) -> tf.Tensor:
    q, _ = tf.linalg.qr(factor)  # reduced QR
    return q


@base.register
class ACPSGD(Compressor):
    """Alternate compressed PowerSGD: one all-reduce per step.

    Zhang, Zhang, Shi, Chu and Li, "Evaluation and Optimization of Gradient
    Compression for Distributed Deep Learning" (ICDCS 2023, arXiv
    2306.08881); docs/algorithms.md, section "ACP-SGD". A tensor is viewed
    as the matrix M of PowerSGD (prod(shape[:-1]), shape[-1]), rank r =
    min(rank, rows, cols). Steps alternate:

    * P step: Q = orth(last all-reduced Q); P = M Q is all-reduced;
      the update is P_sum Q^T.
    * Q step: P = orth(last all-reduced P); Q = M^T P is all-reduced;
      the update is P Q_sum^T.

    Only the fresh factor travels, in one all-reduce per bucket and step
    (PowerSGD needs two dependent ones); with error feedback (the
    optimizer's default) M includes the residual and what the local factor
    missed stays in it. Both factors start from the same seeded normal draw
    on every worker; an all-reduced factor that is not finite or is zero
    is replaced by a fresh draw from the step's key, as PowerSGD's Q
    (`powersgd.warm_start`). Every tensor of two or more dimensions is
    compressed (as the authors do; the optimizer's `min_compress_size`
    still sends small ones dense); 1-D tensors go dense in the same
    buckets. As the authors fuse tensors, a bucket holds about
    `bucket_bytes` of what its tensors send in the step: P factors on P
    steps, Q factors on Q steps, dense tensors whole, so the P and Q steps
    have buckets of their own, each its own all-reduce.

    Bytes on the wire per worker: rows * r * itemsize on P steps, cols * r
    * itemsize on Q steps (fp32 for 16-bit gradients).

    Args:
        rank: the rank r of the approximation.
        warmup_steps: steps at the start that send every tensor dense.
        bucket_bytes: bytes sent per exchange bucket (factors and dense
            tensors; 5 MiB, the authors' threshold); None puts everything
            in one.
        factor: the factor of the first compressed step, "p" or "q"
            (`phases()` gives both, in turn).
    """

    def __init__(
        self,
        rank: int = 4,
        warmup_steps: int = 0,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        factor: str = "p",
    ):
        self.rank = base.check_positive_int("rank", rank)
        self.warmup_steps = base.check_positive_int(
            "warmup_steps", warmup_steps, minimum=0
        )
        self.bucket_bytes = (
            None
            if bucket_bytes is None
            else base.check_positive_int("bucket_bytes", bucket_bytes)
        )
        if factor not in FACTORS:
            raise ValueError(
                "`factor` (the factor this step computes and sends) must be "
                f"'p' or 'q'. Received: factor={factor!r}"
            )
        self.factor = factor

    @property
    def spec(self) -> Spec:
        return Spec(
            collectives=(ALL_REDUCE,),
            warmup_steps=self.warmup_steps,
            bucket_bytes=self.bucket_bytes,
            buckets_by_payload=True,
        )

    def _rank(self, shape):
        return effective_rank(shape, self.rank)

    def should_compress(self, shape, dtype="float32", network=None):
        # Every matrix, as the authors: r = min(rank, rows, cols).
        del dtype, network
        return len(shape) >= 2

    def phases(self):
        config = self.get_config()
        return tuple(
            ACPSGD(**{**config, "factor": factor}) for factor in FACTORS
        )

    def init_state(self, shape, dtype, key):
        rows, cols = matrix_shape(shape)
        r = self._rank(shape)
        wire = compute_dtype(dtype)
        seeds = tf.random.experimental.stateless_split(key, 2)
        zero = tf.constant(0, tf.int64)
        return ACPState(
            tf.random.stateless_normal([rows, r], seed=seeds[0], dtype=wire),
            tf.random.stateless_normal([cols, r], seed=seeds[1], dtype=wire),
            zero,
            zero,
        )

    def _matrix(self, x):
        rows, cols = matrix_shape(x.shape)
        return tf.reshape(tf.cast(x, compute_dtype(x.dtype)), [rows, cols])

    def compress(self, x, state, key):
        m = self._matrix(x)
        if self.factor == "p":
            fixed = _orthonormal(state.q)
            fresh = tf.matmul(m, fixed)
        else:
            fixed = _orthonormal(state.p)
            fresh = tf.matmul(m, fixed, transpose_a=True)
        ctx = _Context(x.shape, x.dtype, fixed, state, key)
        return FactorPayload(fresh), ctx

    def _expand(self, fresh, ctx):
        if self.factor == "p":
            approx = tf.matmul(fresh, ctx.fixed, transpose_b=True)
        else:
            approx = tf.matmul(ctx.fixed, fresh, transpose_b=True)
        return tf.reshape(tf.cast(approx, ctx.dtype), ctx.shape)

    def decompress(self, reduced, ctx):
        state = ctx.state
        kept = warm_start(reduced.factor, ctx.key)
        if self.factor == "p":
            state = state._replace(p=kept, p_steps=state.p_steps + 1)
        else:
            state = state._replace(q=kept, q_steps=state.q_steps + 1)
        return self._expand(reduced.factor, ctx), state

    def local_estimate(self, payload, ctx):
        return self._expand(payload.factor, ctx)

    def payload_bytes(self, shape, dtype):
        rows, cols = matrix_shape(shape)
        side = rows if self.factor == "p" else cols
        return side * self._rank(shape) * compute_dtype(dtype).size

    def get_config(self):
        return {
            "rank": self.rank,
            "warmup_steps": self.warmup_steps,
            "bucket_bytes": self.bucket_bytes,
            "factor": self.factor,
        }
