"""The compressor contract.

A compressor is pure tensor math: it holds no variables and calls no
collective. For one tensor per step the optimizer drives it through

    payload, ctx = compress(x, state, key)          # round 0
    reduced = <collective>(payload)                 # by a communicator
    payload, ctx = next_round(reduced, ctx)         # rounds 1 .. rounds-1
    reduced = <collective>(payload)
    total, new_state = decompress(reduced, ctx)     # sum over all workers

* `payload` is a NamedTuple of tensors: the only thing that goes on the wire.
* `ctx` is local context (anything); it is never sent.
* `state` is a NamedTuple of tensors that persists between steps. The
  optimizer keeps it in variables created from `init_state`, one set per
  worker (never averaged behind the compressor's back).
* `key` is a stateless-RNG seed of shape (2,), identical on every worker for
  the same tensor and step, so random choices agree without a message.
* `collective` says what `reduced` is: for `ALL_REDUCE` the element-wise sum
  of every worker's payload (the payload must be linear); for `ALL_GATHER`
  every field stacked along a new leading axis of size `num_workers`; for
  `ALL_GATHER_RAGGED` (1-D fields whose length is data-dependent and may
  differ between workers) every field as a `tf.RaggedTensor` of shape
  [num_workers, None], row i being worker i's field.
* `decompress` returns the *sum* over workers of what they sent, in the
  original shape and dtype. (Keras divides the loss by the number of
  replicas, so the sum of gradients is their mean.) The one exception is
  signSGD with majority vote (`SignSGD(scaled=False)`), which returns
  sign(sum of the workers' signs): +-1 or 0 whatever the number of
  workers.
* `local_estimate(payload, ctx)` is the dense tensor that this worker's own
  final-round payload stands for; error feedback subtracts it.

Optional fused error feedback (single-round compressors only):

    fused = compress_with_residual(x, residual, state, key)
    payload, ctx, new_residual = fused              # unless fused is None

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

A compressor that sets `reads_step_info` is called as
`compress(x, state, key, info)`, `info` a `StepInfo`: the variable's current
value (read-only) and this worker's rank among the workers that exchange the
payload. The others are called without it.

Planning, once per tensor when the optimizer is built (identical on every
worker, so every worker makes the same choices):

* `should_compress(shape, dtype, network)`: False sends the tensor with
  `dense_compressor()` instead. `network` tells how many workers exchange
  the payload and, if the compressor asked for it (`wants_cost_probe`), the
  measured costs of the network and of selection.
* `has_error_feedback`: the compressor keeps its own residual (RedSync's
  accumulated gradient), so the optimizer does not wrap it in
  `ErrorFeedback`.
* `local_momentum`: momentum the compressor applies itself (RedSync's
  momentum correction); the optimizer then refuses an inner optimizer that
  would apply momentum again.
* `warmup_steps`, `warmup_compressor()`: the first `warmup_steps` steps send
  every compressed tensor dense, through `warmup_compressor()`, which takes
  and returns this compressor's state (`DenseWarmup` unless the compressor
  needs more).
* `phases()`: compressors used in turn, one per step (ACP-SGD alternates a
  P step and a Q step); each takes and returns the same state. Default:
  this compressor alone.
* `compresses_updates`, `delay`: the optimizer lets every worker take
  `delay` local steps of the inner optimizer, then compresses the weight
  update since the round started (SBC's communication delay); every worker
  ends the round with the round-start weights plus the mean update.
* `xla_unsupported()`: why XLA cannot compile the compressor's step (None
  if it can); a step traced for XLA (`jit_compile=True`) with such a
  compressor is refused while tracing, with that reason.
* `bucket_bytes`: the compressor's tensors are exchanged in buckets of about
  this many bytes of uncompressed gradient, each its own collectives, so
  one bucket can be on the wire while the next is compressed (None: all in
  one).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from tfgc import _arguments

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
ALL_GATHER_RAGGED = "all_gather_ragged"
BROADCAST = "broadcast"
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, ALL_GATHER_RAGGED, BROADCAST)
#: The payload field that names a broadcast's sender; it is not sent.
ROOT_FIELD = "root"


class NoState(NamedTuple):
    """State of a compressor that keeps none."""


class StepInfo(NamedTuple):
    """What a compressor with `reads_step_info` gets besides the gradient.

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
        cost: a `tfgc.compressors.CostModel` measured by the optimizer's
            start-up probe when the compressor asked for one
            (`wants_cost_probe`), else None.
    """

    num_peers: int = 1
    cost: Any = None


def num_elements(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def wire_fields(payload) -> list[int]:
    """Positions of the payload's fields that go on the wire: all but a
    broadcast's `root` (a payload without field names sends them all)."""
    names = getattr(payload, "_fields", ())
    return [
        j
        for j in range(len(payload))
        if j >= len(names) or names[j] != ROOT_FIELD
    ]


def payload_nbytes(payload) -> tf.Tensor:
    """Bytes of a payload as it goes on the wire (int64 scalar tensor)."""
    total = tf.constant(0, tf.int64)
    for j in wire_fields(payload):
        field = payload[j]
        total += tf.size(field, out_type=tf.int64) * field.dtype.size
    return total


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """Validates an integer argument >= `minimum` and returns it."""
    return _arguments.check_int(name, value, minimum)


def check_density(density) -> float:
    """Validates a `density` argument and returns it as a float.

    Only a number is accepted (a string is refused, as for every numeric
    argument of tfgc).
    """
    requirement = (
        "a number in (0, 1], the fraction of elements to send (0.01 sends 1 %)"
    )
    value = _arguments.check_number("density", density, requirement)
    if not 0.0 < value <= 1.0:
        raise ValueError(
            f"`density` must be {requirement}. Received: density={density!r}"
        )
    return value


#: The gradient dtypes that `tfgc.ops.top_k_sample` selects from.
SELECTION_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def check_selection_dtype(owner: str, dtype) -> None:
    """Refuses a gradient dtype that `tfgc.ops.top_k_sample` cannot select
    from, naming what to use instead."""
    dtype = tf.as_dtype(dtype)
    if dtype not in SELECTION_DTYPES:
        raise ValueError(
            "`dtype` must be float32, float16 or bfloat16: "
            f"{owner} selects with tfgc.ops.top_k_sample. Received: "
            f"dtype={dtype.name}. Keep the variable in float32, or use "
            "TopK, which takes float64 too."
        )


def num_selected(n: int, density: float) -> int:
    """k = ceil(density * n), at least 1 for a non-empty tensor."""
    if n == 0:
        return 0
    return max(1, min(n, math.ceil(density * n)))


class Compressor:
    """Base class; subclasses implement the methods documented above."""

    def __new__(cls, *args, **kwargs):
        # Python's own error for a misspelled keyword names no fix; this
        # one names the closest valid keyword (also through `get`).
        del args
        _arguments.check_keywords(cls.__name__, cls.__init__, kwargs)
        return super().__new__(cls)

    #: What the payload needs: `ALL_REDUCE` (linear), `ALL_GATHER`,
    #: `ALL_GATHER_RAGGED` or `BROADCAST` (see `collectives()`).
    collective: str = ALL_GATHER
    #: Number of dependent communication rounds per step.
    rounds: int = 1
    #: The compressor keeps its own residual (no `ErrorFeedback` wrapper).
    has_error_feedback: bool = False
    #: Momentum the compressor applies itself, per tensor.
    local_momentum: float = 0.0
    #: Steps at the start that send every compressed tensor dense.
    warmup_steps: int = 0
    #: The compressor wants the optimizer to measure `Network.cost`.
    wants_cost_probe: bool = False
    #: `compress` takes a fourth argument, a `StepInfo`.
    reads_step_info: bool = False
    #: The compressor compresses each worker's weight update over `delay`
    #: local steps of the inner optimizer (SBC), not its gradient.
    compresses_updates: bool = False
    #: Local steps per communication round, with `compresses_updates`.
    delay: int = 1
    #: Uncompressed bytes of gradient per exchange bucket (None: one).
    bucket_bytes: int | None = None

    def collectives(self) -> tuple[str, ...]:
        """The collective of each round (default: `collective` for all)."""
        return (self.collective,) * self.rounds

    def xla_unsupported(self) -> str | None:
        """Why XLA cannot compile this compressor's step, or None if it can.

        A clause naming the compressor; by default payloads whose size
        depends on the data (`ALL_GATHER_RAGGED`) cannot be compiled.
        """
        if ALL_GATHER_RAGGED in self.collectives():
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

    def dense_compressor(self) -> Compressor:
        """What sends the tensors this compressor declines (Identity)."""
        from tfgc.compressors.identity import Identity

        return Identity()

    def warmup_compressor(self) -> Compressor:
        """What stands in for this compressor in the warm-up steps."""
        from tfgc.compressors.identity import DenseWarmup

        return DenseWarmup(self)

    def phases(self) -> tuple[Compressor, ...]:
        """The compressors used in turn, one per step (default: this one)."""
        return (self,)

    def init_state(self, shape, dtype, key) -> NamedTuple:
        """Initial state for a tensor; must be identical on every worker."""
        del shape, dtype, key
        return NoState()

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
        self, x: tf.Tensor, residual: tf.Tensor, state, key
    ) -> tuple[Any, Any, tf.Tensor] | None:
        """Fused `compress(x + residual)` plus the new residual, or None.

        See the module docstring; None (this default) means "use the
        generic path". Only called when `rounds` is 1.
        """
        del x, residual, state, key
        return None

    def compress_batch(
        self, xs: list, states: list, keys: list, residuals: list | None = None
    ) -> list | None:
        """`compress` (with `residuals`, `compress_with_residual`) of many
        tensors of one dtype at once, or None for one by one (this
        default). See the module docstring. Only called when `rounds` is 1
        and `reads_step_info` is False."""
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


class DensityCompressor(Compressor):
    """Base for compressors that send k = ceil(density * n) entries.

    Args:
        density: fraction of entries to send, in (0, 1].
    """

    def __init__(self, density: float = 0.01):
        self.density = check_density(density)

    def num_selected(self, shape) -> int:
        return num_selected(num_elements(shape), self.density)

    def get_config(self):
        return {"density": self.density}


def register(cls):
    """Registers a compressor for Keras serialization under `tfgc>`."""
    return keras.saving.register_keras_serializable(package="tfgc")(cls)
