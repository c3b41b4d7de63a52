"""Error feedback as a wrapper around any compressor."""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
import tensorflow as tf

from tfgc import ops
from tfgc.compressors import base
from tfgc.core.compressor import Compressor, Spec


class ErrorFeedbackState(NamedTuple):
    residual: tf.Tensor  # what this worker has not sent yet
    inner: Any  # the wrapped compressor's state


class _Context(NamedTuple):
    # x + residual, what was handed to the compressor (generic path only).
    corrected: tf.Tensor | None
    payload: Any  # this worker's latest payload
    inner: Any
    # The next residual, already known on the fused path; else None.
    residual: tf.Tensor | None = None


@base.register
class ErrorFeedback(Compressor):
    """Adds the residual before compressing and keeps what was not sent.

    Seide et al. (Interspeech 2014), Stich et al. (NeurIPS 2018),
    Karimireddy et al. (ICML 2019). With c = x + residual, the new residual
    is c - local_estimate(payload): the sum of everything sent plus the
    residual always equals the sum of all inputs (mass is conserved).
    Where the local estimate is not finite (a NaN or infinite gradient
    entry was sent on to the optimizer) the new residual is 0, so that it
    does not stay NaN (inf - inf) for good. The residual is local to each
    worker and never communicated.

    A compressor with a fused path (`Compressor.compress_with_residual`,
    e.g. `TopK` with the compiled ops, `ImportancePruning`) computes c, its
    payload and the new residual in one pass; otherwise the steps above
    run one by one.
    """

    def __init__(self, compressor: Compressor):
        if compressor.spec.has_error_feedback:
            raise ValueError(
                "`compressor` already has error feedback; do not wrap it "
                f"again. Received: compressor={compressor!r}"
            )
        self.compressor = compressor

    @property
    def spec(self) -> Spec:
        # The wrapped compressor decides how its payload travels and is
        # planned; this wrapper adds the residual.
        return self.compressor.spec._replace(has_error_feedback=True)

    def xla_unsupported(self):
        return self.compressor.xla_unsupported()

    def phases(self):
        inner = self.compressor.phases()
        if len(inner) == 1:
            return (self,)
        return tuple(ErrorFeedback(c) for c in inner)

    def should_compress(self, shape, dtype="float32", network=None):
        return self.compressor.should_compress(shape, dtype, network)

    def init_state(self, shape, dtype, key):
        return ErrorFeedbackState(
            residual=tf.zeros(shape, dtype),
            inner=self.compressor.init_state(shape, dtype, key),
        )

    def worker_sums(self, state):
        return ErrorFeedbackState(
            residual=True, inner=self.compressor.worker_sums(state.inner)
        )

    def compress(self, x, state, key, info=None):
        # The state may be kept in another dtype (the variable's); the
        # arithmetic is in the gradient's, as the residual returned is.
        residual = tf.cast(state.residual, x.dtype)
        extra = (info,) if self.compressor.spec.reads_step_info else ()
        fused = self.compressor.compress_with_residual(
            x, residual, state.inner, key, *extra
        )
        if fused is not None:
            payload, ctx, new_residual = fused
            return payload, _Context(None, payload, ctx, new_residual)
        corrected = x + residual
        payload, ctx = self.compressor.compress(
            corrected, state.inner, key, *extra
        )
        return payload, _Context(corrected, payload, ctx)

    def compress_batch(self, xs, states, keys, residuals=None):
        # Only the fused path batches: the generic one adds, compresses
        # and subtracts per tensor anyway. No fused path of its own, as
        # `compress_with_residual`: its residuals are in `states`.
        if residuals is not None:
            return None
        fused = self.compressor.compress_batch(
            xs,
            [s.inner for s in states],
            keys,
            residuals=[
                tf.cast(s.residual, x.dtype) for x, s in zip(xs, states)
            ],
        )
        if fused is None:
            return None
        return [
            (payload, _Context(None, payload, ctx, new_residual))
            for payload, ctx, new_residual in fused
        ]

    def next_round(self, reduced, ctx):
        payload, inner_ctx = self.compressor.next_round(reduced, ctx.inner)
        return payload, ctx._replace(payload=payload, inner=inner_ctx)

    def decompress(self, reduced, ctx):
        total, inner_state = self.compressor.decompress(reduced, ctx.inner)
        residual = ctx.residual
        if residual is not None:
            residual = self.compressor.residual_after_rounds(
                ctx.inner, residual
            )
        else:
            sent = self.compressor.local_estimate(ctx.payload, ctx.inner)
            residual = ops.new_residual(ctx.corrected, sent)
        return total, ErrorFeedbackState(residual, inner_state)

    def local_estimate(self, payload, ctx):
        return self.compressor.local_estimate(payload, ctx.inner)

    def payload_bytes(self, shape, dtype):
        return self.compressor.payload_bytes(shape, dtype)

    def get_config(self):
        return {
            "compressor": keras.saving.serialize_keras_object(self.compressor)
        }

    @classmethod
    def from_config(cls, config):
        inner = keras.saving.deserialize_keras_object(config["compressor"])
        return cls(inner)
