"""The compressor contract.

A compressor is pure tensor math: it holds no variables and calls no
collective. For one tensor per step the optimizer drives it through

    payload, ctx = compress(x, state, key)          # round 0
    reduced = <collective>(payload)                 # by a communicator
    payload, ctx = next_round(reduced, ctx)         # rounds 1 .. rounds-1
    reduced = <collective>(payload)
    total, new_state = decompress(reduced, ctx)     # sum over all workers

* `payload` is a NamedTuple of tensors: the only thing that goes on the
  wire, through the collective that `spec.collectives` names for the
  round (`tfgc.core.wire`).
* `ctx` is local context, a NamedTuple of the compressor's own; it is
  never sent.
* `state` is a NamedTuple of tensors that persists between steps. The
  optimizer keeps it in variables created from `init_state`, one set per
  worker (never averaged behind the compressor's back).
* `key` is a stateless-RNG seed of shape (2,), identical on every worker for
  the same tensor and step, so random choices agree without a message.
* `decompress` returns the *sum* over workers of what they sent, in the
  original shape and dtype. (Keras divides the loss by the number of
  replicas, so the sum of gradients is their mean.) The one exception is
  signSGD with majority vote (`SignSGD(scaled=False)`), which returns
  sign(sum of the workers' signs): +-1 or 0 whatever the number of
  workers.
* `local_estimate(payload, ctx)` is the dense tensor that this worker's own
  final-round payload stands for; error feedback subtracts it.

Optional fused error feedback:

    fused = compress_with_residual(x, residual, state, key[, info])
    payload, ctx, new_residual = fused              # unless fused is None
    ... the rounds, as above ...
    new_residual = residual_after_rounds(ctx, new_residual)  # final ctx

* `residual` has x's shape and dtype. `payload` and `ctx` are what
  `compress(x + residual, state, key)` returns, and `new_residual` is
  x + residual - local_estimate(payload, ctx), and 0 where the local
  estimate is not finite (a NaN or infinite entry that was sent stays out
  of the residual), computed in one pass where the generic path needs an
  add, a compression, a local estimate and a subtraction. (A sparsifier
  zeroes the entries it sent, which is the same.)
* It returns None (the default) where the compressor has no faster path
  for these inputs, e.g. without the compiled ops; `ErrorFeedback` then
  takes the generic path. The choice is made in Python while tracing, so
  it adds nothing to the graph.
* A compressor whose spec `reads_step_info` gets `info` as a fifth
  argument, as `compress` does; the others get four.
* With several rounds the payload that leaves the residual may be known
  only after a collective (`ImportancePruning` sends the root worker's
  positions). There `new_residual` is the residual as if this worker's own
  round-0 choice were final, and `residual_after_rounds(ctx, new_residual)`,
  given the last round's ctx, returns x + residual - local_estimate of the
  last payload as above (the default returns `new_residual`: right for one
  round).

Optional batched compression (single-round compressors that do not read
step info):

    out = compress_batch(xs, states, keys, residuals=None)

* `xs` are several tensors of one dtype that this compressor (or one equal
  to it: same type and config) compresses in the same bucket and step.
  `out` is, per tensor, what `compress` returns, or with `residuals` what
  `compress_with_residual` returns; the results must be those of the
  per-tensor calls.
* It returns None (the default) where batching gains nothing; the tensors
  then go one by one. `TopK` and `MSTopK` batch where the compiled ops run
  on a GPU: one segmented selection launch for all of a model's tensors.

A compressor whose spec `reads_step_info` is called as
`compress(x, state, key, info)`, `info` a `StepInfo`: the variable's current
value (read-only) and this worker's rank among the workers that exchange the
payload. The others are called without it.

Planning, once per tensor when the optimizer is built (identical on every
worker, so every worker makes the same choices):

* `spec`: what the compressor declares (`Spec`): the collective of each
  round and how the optimizer must drive it. A wrapper derives its spec
  from the wrapped compressor's.
* `should_compress(shape, dtype, network)`: False sends the tensor with
  `dense_compressor()` instead. `network` tells how many workers exchange
  the payload and, if the spec asks for it (`wants_cost_probe`), the
  measured costs of the network and of selection.
* `dense_compressor()`, `warmup_compressor()`: what sends the tensors this
  compressor declines, and what sends every compressed tensor dense in the
  first `spec.warmup_steps` steps, taking and returning this compressor's
  state. None (the defaults): the optimizer's dense codecs
  (`tfgc.compressors.Identity`, `DenseWarmup`).
* `phases()`: compressors used in turn, one per step (ACP-SGD alternates a
  P step and a Q step); each takes and returns the same state. Default:
  this compressor alone.
* `xla_unsupported()`: why XLA cannot compile the compressor's step (None
  if it can); a step traced for XLA (`jit_compile=True`) with such a
  compressor is refused while tracing, with that reason.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tfgc import _arguments
from tfgc.core.wire import ALL_GATHER, ALL_GATHER_RAGGED


class Spec(NamedTuple):
    """What a compressor declares to the optimizer and the communicators.

    Fixed when the compressor is made, identical on every worker.

    Attributes:
        collectives: the collective of each communication round
            (`tfgc.core.wire`); their number is the number of rounds.
        has_error_feedback: the compressor keeps its own residual
            (RedSync's accumulated gradient), so the optimizer does not
            wrap it in `ErrorFeedback`.
        local_momentum: momentum the compressor applies itself, per tensor
            (RedSync's momentum correction); the optimizer then refuses an
            inner optimizer that would apply momentum again.
        local_clipnorm: the threshold of the gradient clipping the
            compressor applies itself, on each worker before it accumulates
            (RedSync's `clipnorm`; None: none); the optimizer then warns
            when the inner optimizer clips the summed gradient as well.
        warmup_steps: steps at the start that send every compressed tensor
            dense, through `Compressor.warmup_compressor()`.
        wants_cost_probe: the optimizer measures the network's costs at
            build, for `should_compress` (`Network.cost`).
        reads_step_info: `compress` takes a fourth argument, a `StepInfo`.
        compresses_updates: the optimizer lets every worker take `delay`
            local steps of the inner optimizer, then compresses the weight
            update since the round started (SBC's communication delay);
            every worker ends the round with the round-start weights plus
            the mean update.
        delay: local steps per communication round, with
            `compresses_updates`.
        bucket_bytes: the compressor's tensors are exchanged in buckets of
            about this many bytes of uncompressed gradient, each with its
            own collectives, so one bucket can be on the wire while the
            next is compressed (None: all in one).
        buckets_by_payload: `bucket_bytes` counts what each tensor sends
            in its step (`payload_bytes` of the step's phase), not its
            gradient's bytes, so each phase has buckets of its own (ACP-SGD's
            P and Q factors, as its authors fuse them).
    """

    collectives: tuple[str, ...] = (ALL_GATHER,)
    has_error_feedback: bool = False
    local_momentum: float = 0.0
    local_clipnorm: float | None = None
    warmup_steps: int = 0
    wants_cost_probe: bool = False
    reads_step_info: bool = False
    compresses_updates: bool = False
    delay: int = 1
    bucket_bytes: int | None = None
    buckets_by_payload: bool = False

    @property
    def rounds(self) -> int:
        """Dependent communication rounds per step."""
        return len(self.collectives)


class NoState(NamedTuple):
    """State of a compressor that keeps none."""


class TensorContext(NamedTuple):
    """The context of a compressor that needs only the tensor's static
    shape and dtype to decompress, and passes its state through."""

    shape: tf.TensorShape
    dtype: tf.DType
    state: Any


class StepInfo(NamedTuple):
    """What a compressor with `spec.reads_step_info` gets besides the
    gradient.

    Attributes:
        variable: the variable's current value, in the shape the compressor
            compresses (a shard of it under the hierarchical communicator);
            read-only.
        rank: this worker's index among the workers that exchange the
            payload (a Python int).
        num_peers: how many workers exchange the payload.
    """

    variable: tf.Tensor
    rank: int
    num_peers: int


class Network(NamedTuple):
    """What a compressor may know, when planning, of how its payloads travel.

    Identical on every worker.

    Attributes:
        num_peers: how many workers exchange each payload (p).
        cost: a `tfgc.core.cost_model.CostModel` measured by the
            optimizer's start-up probe when the spec asked for one
            (`wants_cost_probe`), else None.
    """

    num_peers: int = 1
    cost: Any = None


class Compressor:
    """Base class; subclasses implement the methods documented above."""

    #: What the compressor declares; a property where it depends on the
    #: compressor's arguments.
    spec: Spec = Spec()

    def __new__(cls, *args, **kwargs):
        # Python's own error for a misspelled keyword names no fix; this
        # one names the closest valid keyword (also through `get`).
        del args
        _arguments.check_keywords(cls.__name__, cls.__init__, kwargs)
        return super().__new__(cls)

    def xla_unsupported(self) -> str | None:
        """Why XLA cannot compile this compressor's step, or None if it can.

        A clause naming the compressor; by default payloads whose size
        depends on the data (`ALL_GATHER_RAGGED`) cannot be compiled.
        """
        if ALL_GATHER_RAGGED in self.spec.collectives:
            return (
                f"{type(self).__name__} sends payloads whose size depends "
                "on the data"
            )
        return None

    def should_compress(
        self,
        shape: tuple[int, ...],
        dtype="float32",
        network: Network | None = None,
    ) -> bool:
        """False where the compressor would rather send this tensor dense."""
        del shape, dtype, network
        return True

    def dense_compressor(self) -> Compressor | None:
        """What sends the tensors this compressor declines (None: the
        optimizer's `Identity`)."""
        return None

    def warmup_compressor(self) -> Compressor | None:
        """What stands in for this compressor in the warm-up steps (None:
        the optimizer's `DenseWarmup` of it)."""
        return None

    def phases(self) -> tuple[Compressor, ...]:
        """The compressors used in turn, one per step (default: this one)."""
        return (self,)

    def init_state(self, shape, dtype, key) -> NamedTuple:
        """Initial state for a tensor; must be identical on every worker."""
        del shape, dtype, key
        return NoState()

    def worker_sums(self, state) -> Any:
        """Which leaves of `state` (structured as `init_state`'s) hold this
        worker's share of a sum over workers: gradient not yet applied,
        such as a residual or an accumulated momentum. Restored with
        another number of workers, those are divided evenly among the new
        workers, so their sum is kept; every other leaf restarts from
        `init_state`, the same on every worker. The same structure, of
        bools; none by default."""
        return tf.nest.map_structure(lambda _: False, state)

    def compress(self, x: tf.Tensor, state, key) -> tuple[Any, Any]:
        raise NotImplementedError

    def next_round(self, reduced, ctx) -> tuple[Any, Any]:
        raise NotImplementedError(
            f"{type(self).__name__} communicates in one round only."
        )

    def decompress(self, reduced, ctx) -> tuple[tf.Tensor, Any]:
        raise NotImplementedError

    def local_estimate(self, payload, ctx) -> tf.Tensor:
        raise NotImplementedError

    def compress_with_residual(
        self, x: tf.Tensor, residual: tf.Tensor, state, key, info=None
    ) -> tuple[Any, Any, tf.Tensor] | None:
        """Fused `compress(x + residual)` plus the new residual, or None.

        See the module docstring; None (this default) means "use the
        generic path". `info` is given only where `spec.reads_step_info`.
        """
        del x, residual, state, key, info
        return None

    def residual_after_rounds(self, ctx, residual: tf.Tensor) -> tf.Tensor:
        """On the fused path, the new residual once the last round's `ctx`
        is known, from the `residual` that `compress_with_residual`
        returned (this default: unchanged). See the module docstring."""
        del ctx
        return residual

    def compress_batch(
        self, xs: list, states: list, keys: list, residuals: list | None = None
    ) -> list | None:
        """`compress` (with `residuals`, `compress_with_residual`) of many
        tensors of one dtype at once, or None for one by one (this
        default). See the module docstring. Only called with one round and
        without step info."""
        del xs, states, keys, residuals
        return None

    def payload_bytes(self, shape, dtype) -> int:
        """Bytes this worker puts on the wire per step, over all rounds.

        For payloads of data-dependent size, the most they carry when the
        selection behaves as documented (RedSync's threshold: below 2k).
        """
        raise NotImplementedError

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and (
            self.get_config() == other.get_config()
        )

    def __hash__(self):
        return hash((type(self), repr(self)))
