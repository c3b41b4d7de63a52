"""A variable whose codec can change between steps: every candidate's
state kept side by side with one shared residual (`SwitchState`), and a
`Slot` per candidate that drives it with error feedback over that state.

The planner's re-planning (`Auto(replan_every=...)`) gives each variable
one `Slot` per candidate and picks one per bucket and step; whichever
runs, the residual is the same tensor, so what one codec left unsent the
next one sends (no gradient mass is lost when the choice changes). A
candidate that did not run in the step before starts from a fresh
state, drawn from the step's key, which every worker shares.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tfgc.compressors.error_feedback import ErrorFeedback, ErrorFeedbackState
from tfgc.core.compressor import Compressor, Spec


class SwitchState(NamedTuple):
    residual: tf.Tensor  # what this worker has not sent yet, any codec
    inners: tuple  # each candidate's own state, in candidate order
    last: tf.Tensor  # int32: the candidate that ran last


class _Context(NamedTuple):
    inner: Any  # the ErrorFeedback context
    state: SwitchState  # the state the step started from


class Slot(Compressor):
    """Candidate `index` of `codecs` (each phase of each candidate, or
    the dense codec for a tensor it declines), with error feedback over
    the shared residual of a `SwitchState`.

    Args:
        index: which candidate this slot drives.
        codec: the candidate's compressor for this tensor and phase (not
            wrapped in error feedback; the slot adds it).
        inits: per candidate, a callable (shape, dtype, key) -> its
            initial state, for `init_state`.
    """

    def __init__(self, index: int, codec: Compressor, inits: tuple):
        self.index = index
        self.codec = ErrorFeedback(codec)
        self.inits = inits

    @property
    def spec(self) -> Spec:
        return self.codec.spec

    def xla_unsupported(self):
        return self.codec.xla_unsupported()

    def init_state(self, shape, dtype, key):
        # Every candidate's state starts as its own would; this slot's
        # candidate, the plan's first choice, goes on from it as the codec
        # alone would.
        return SwitchState(
            tf.zeros(shape, dtype),
            tuple(init(shape, dtype, key) for init in self.inits),
            tf.constant(self.index, tf.int32),
        )

    def worker_sums(self, state):
        # The residual is gradient not yet applied; a candidate's state
        # restarts with the same value on every worker.
        return SwitchState(
            True, tf.nest.map_structure(lambda _: False, state.inners), False
        )

    def _own(self, x, state: SwitchState, key) -> ErrorFeedbackState:
        """This candidate's state, fresh if another one ran last."""
        kept = state.inners[self.index]
        if not tf.nest.flatten(kept):
            return ErrorFeedbackState(state.residual, kept)

        def fresh():
            return self.inits[self.index](x.shape, x.dtype, key)

        inner = tf.cond(tf.equal(state.last, self.index), lambda: kept, fresh)
        return ErrorFeedbackState(state.residual, inner)

    def compress(self, x, state, key):
        payload, ctx = self.codec.compress(x, self._own(x, state, key), key)
        return payload, _Context(ctx, state)

    def next_round(self, reduced, ctx):
        payload, inner = self.codec.next_round(reduced, ctx.inner)
        return payload, ctx._replace(inner=inner)

    def decompress(self, reduced, ctx):
        total, own = self.codec.decompress(reduced, ctx.inner)
        inners = list(ctx.state.inners)
        inners[self.index] = own.inner
        residual = tf.cast(own.residual, ctx.state.residual.dtype)
        last = tf.constant(self.index, tf.int32)
        return total, SwitchState(residual, tuple(inners), last)

    def local_estimate(self, payload, ctx):
        return self.codec.local_estimate(payload, ctx.inner)

    def payload_bytes(self, shape, dtype):
        return self.codec.payload_bytes(shape, dtype)

    def __repr__(self):
        return f"Slot({self.index}, {self.codec.compressor!r})"

    def __eq__(self, other):
        return (
            type(other) is Slot
            and self.index == other.index
            and self.codec == other.codec
        )

    def __hash__(self):
        return hash((Slot, self.index, self.codec))
