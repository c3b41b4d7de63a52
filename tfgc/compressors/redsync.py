"""RedSync: residual gradient compression with momentum correction, and
the training fixes of Deep Gradient Compression it builds on (local
gradient clipping, warm-up with an exponentially decreasing density)."""

from __future__ import annotations

import math
from typing import NamedTuple

import tensorflow as tf

from tfgc import _arguments, ops
from tfgc.compressors import _sparse, base
from tfgc.compressors.dense import DenseContext, DensePayload, Identity
from tfgc.compressors.topk import SparsePayload
from tfgc.core.compressor import Network, Spec, StepInfo, TensorContext
from tfgc.core.cost_model import CostModel
from tfgc.core.wire import (
    ALL_GATHER,
    ALL_GATHER_RAGGED,
    ALL_REDUCE,
    num_elements,
)

SELECTIONS = ("threshold", "trimmed")
PROBE = "probe"
#: Each stage of the density warm-up sends this many times fewer entries
#: than the one before (DGC: 25 %, 6.25 %, 1.5625 %, 0.4 %, then 0.1 %).
RAMP_FACTOR = 4
#: The most steps `warmup_steps` and `density_warmup_steps` may count:
#: the step arithmetic runs in int64.
MAX_STEPS = 2**62


class RedSyncState(NamedTuple):
    momentum: tf.Tensor  # U, this worker's momentum
    accumulation: tf.Tensor  # V, accumulated momentum not sent yet


class MomentumState(NamedTuple):
    momentum: tf.Tensor  # U


def _momentum_step(momentum: float, u: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """U = m U + g, in the gradient's dtype."""
    return momentum * tf.cast(u, g.dtype) + g


def local_clip_threshold(clipnorm: float, num_peers: int) -> float:
    """DGC's local threshold: clipnorm / sqrt(N) for N workers whose
    gradients are summed (each worker's share of the global threshold if
    all N had identically distributed gradients)."""
    return clipnorm / math.sqrt(num_peers)


def _clipped(
    owner: str, clipnorm: float | None, g: tf.Tensor, info: StepInfo | None
) -> tf.Tensor:
    """g scaled to an L2 norm of at most clipnorm / sqrt(N) (N:
    `info.num_peers`), as `tf.clip_by_norm` does: g t / max(|g|, t). The
    norm is taken in float32 (a float16 sum of squares overflows); below
    the threshold g is returned bit for bit."""
    if clipnorm is None:
        return g
    if info is None:
        raise ValueError(
            f"{owner}(clipnorm={clipnorm!r}) clips each worker's gradient "
            "to clipnorm / sqrt(number of workers) and needs that number; "
            "use it through tfgc.CompressedOptimizer, which passes it, or "
            "pass a tfgc.core.compressor.StepInfo."
        )
    threshold = local_clip_threshold(clipnorm, info.num_peers)
    norm = tf.norm(tf.reshape(tf.cast(g, tf.float32), [-1]))
    scale = threshold / tf.maximum(norm, threshold)
    return g * tf.cast(scale, g.dtype)


def warmup_densities(density: float) -> tuple[float, ...]:
    """The densities of the density warm-up's stages for a final
    `density`: 1/4, 1/16, 1/64, ... while above `density` (DGC's
    exponential warm-up; none for a density of 1/4 or more)."""
    stages = []
    stage = 1.0 / RAMP_FACTOR
    while stage > density:
        stages.append(stage)
        stage /= RAMP_FACTOR
    return tuple(stages)


def _check_steps(name: str, value) -> int:
    steps = base.check_positive_int(name, value, minimum=0)
    if steps > MAX_STEPS:
        raise ValueError(
            f"`{name}` must be an integer in [0, 2**62]. Received: "
            f"{name}={value!r}"
        )
    return steps


def _check_clipnorm(clipnorm) -> float | None:
    if clipnorm is None:
        return None
    requirement = (
        "None (no clipping) or a number > 0, the threshold of the global "
        "gradient clipping it replaces"
    )
    value = _arguments.check_number("clipnorm", clipnorm, requirement)
    if value <= 0:
        raise ValueError(
            f"`clipnorm` must be {requirement}. Received: clipnorm={clipnorm!r}"
        )
    return value


@base.register
class RedSync(base.DensityCompressor):
    """Sparse exchange of an accumulated, momentum-corrected gradient.

    Fang et al., "RedSync: Reducing Synchronization Bandwidth for
    Distributed Deep Learning Training System" (JPDC 2019, arXiv
    1808.04357); docs/algorithms.md, section "RedSync", says what is
    reconstructed. Per tensor and worker, with momentum m:

        U = m U + g;  V = V + U;  select from V;
        send V at the selected entries;  zero V and U there.

    Zeroing U where V is sent is DGC's momentum factor masking
    (`momentum_masking`, on as in DGC).

    The optimizer sums what every worker sent and applies it with plain
    SGD: momentum is applied here, locally, so the inner optimizer must be
    `keras.optimizers.SGD(learning_rate)` without momentum (the optimizer
    refuses others when momentum > 0). V is RedSync's own residual, so it is
    never wrapped in `ErrorFeedback`.

    Selection (`tfgc.ops.top_k_sample`):
    * "threshold" (default): bisection of thr = mean|V| + ratio (max|V| -
      mean|V|), accepting k < count(|V| > thr) < 2k. Workers send different
      numbers of entries; the gather carries unequal sizes (padded to a
      common length; the padding is reported as overhead bytes).
    * "trimmed": exactly the k largest |V|.

    Tensors the optimizer would send dense (smaller than its
    `min_compress_size`), and tensors for which the cost model predicts a
    dense all-reduce to be faster than a sparse all-gather plus selection
    and decompression, are sent dense with the same momentum (U = m U + g,
    all-reduced). So are all tensors during the first `warmup_steps` steps
    (U + V all-reduced, V emptied). With every tensor dense, RedSync is
    exactly momentum SGD.

    Deep Gradient Compression's training fixes (Lin et al., ICLR 2018,
    arXiv 1712.01887), which RedSync builds on, besides the momentum
    correction and masking above:
    * Local gradient clipping (`clipnorm`): each worker scales its gradient
      to an L2 norm of at most clipnorm / sqrt(N), N the number of workers
      that exchange it, before it enters U, on every path (sparse, dense,
      warm-up). DGC clips the worker's whole gradient by its global norm;
      a compressor sees one tensor, so tfgc clips each tensor by its own
      norm, as DGC's and PaddlePaddle's code do. `clipnorm` replaces the
      inner optimizer's clipping: give the inner SGD none
      (`CompressedOptimizer` warns when it clips as well).
    * Warm-up with an exponentially decreasing density
      (`density_warmup_steps`): after the dense steps, the density falls
      by a factor of 4 per stage, 25 %, 6.25 %, 1.5625 %, 0.39 %, ... while
      above `density`, in equal stages over `density_warmup_steps` steps,
      then `density` (`density_at(step)`). The stage follows the step the
      optimizer passes in the key (`tfgc.optimizers.planning.key`: [seed,
      step]), which every worker shares, so all select the same k.

    Bytes on the wire per worker: below 2k (itemsize + 4) with threshold
    selection when a threshold is accepted (a lone huge outlier can make
    the bisection too coarse for that, and the payload several times k;
    docs/algorithms.md), k (itemsize + 4) with trimmed; during the density
    warm-up, k of the stage's density (`payload_bytes` gives the final
    one).

    Args:
        density: fraction of entries to send, in (0, 1] (k = ceil(density
            n); the paper's messages are about 0.1 %).
        momentum: m, in [0, 1).
        selection: "threshold" or "trimmed".
        rounds: bisection rounds of threshold selection, in [1, 64].
        warmup_steps: steps at the start that send every tensor dense.
        cost_model: "probe" (the optimizer measures the network and the
            selection speed once when it is built), a
            `tfgc.compressors.CostModel` with given latency and bandwidth,
            or None to send every tensor sparse that the optimizer would
            compress.
        density_warmup_steps: steps after the dense ones over which the
            density falls from 25 % to `density` (0: none). DGC's are its
            first 4 epochs, one stage each at 0.1 %: pass 4 x steps per
            epoch. At other densities the stages (as many as stay above
            `density`) share the steps equally.
        clipnorm: the threshold of the gradient clipping this replaces
            (the inner optimizer's `global_clipnorm`); each worker clips
            each gradient tensor to clipnorm / sqrt(N). None: no clipping.
        momentum_masking: zero U where V is sent (DGC's momentum factor
            masking). Off, U keeps its momentum there: a tensor sent whole
            every step is then momentum SGD, where masking leaves plain
            SGD; on short runs at high momentum it converges closer to
            dense (docs/algorithms.md, "RedSync", has the measurement).
    """

    def __init__(
        self,
        density: float = 0.001,
        momentum: float = 0.9,
        selection: str = "threshold",
        rounds: int = 20,
        warmup_steps: int = 0,
        cost_model: str | CostModel | dict | None = PROBE,
        density_warmup_steps: int = 0,
        clipnorm: float | None = None,
        momentum_masking: bool = True,
    ):
        super().__init__(density)
        m = _arguments.check_number("momentum", momentum, "a number in [0, 1)")
        if not 0.0 <= m < 1.0:
            raise ValueError(
                "`momentum` must be a number in [0, 1). Received: "
                f"momentum={momentum!r}"
            )
        if selection not in SELECTIONS:
            raise ValueError(
                f"`selection` must be one of {list(SELECTIONS)}. Received: "
                f"selection={selection!r}"
            )
        self.bisection_rounds = base.check_positive_int("rounds", rounds)
        if self.bisection_rounds > 64:
            raise ValueError(
                f"`rounds` must be in [1, 64]. Received: rounds={rounds}"
            )
        self.momentum = m
        self.selection = selection
        self.warmup_steps = _check_steps("warmup_steps", warmup_steps)
        self.density_warmup_steps = _check_steps(
            "density_warmup_steps", density_warmup_steps
        )
        self.clipnorm = _check_clipnorm(clipnorm)
        self.momentum_masking = _arguments.check_bool(
            "momentum_masking", momentum_masking
        )
        if isinstance(cost_model, dict):
            cost_model = CostModel(**cost_model)
        if not (
            cost_model in (PROBE, None) or isinstance(cost_model, CostModel)
        ):
            raise ValueError(
                "`cost_model` must be 'probe', a tfgc.compressors.CostModel("
                "latency=..., bandwidth=...) or None (always sparse). "
                f"Received: cost_model={cost_model!r}"
            )
        self.cost_model = cost_model

    @property
    def spec(self) -> Spec:
        # Threshold counts, and k during the density warm-up, vary.
        ragged = self.selection == "threshold" or self._ramps()
        return Spec(
            collectives=(ALL_GATHER_RAGGED if ragged else ALL_GATHER,),
            has_error_feedback=True,
            local_momentum=self.momentum,
            local_clipnorm=self.clipnorm,
            warmup_steps=self.warmup_steps,
            wants_cost_probe=self.cost_model == PROBE,
            reads_step_info=self.clipnorm is not None,
        )

    def xla_unsupported(self):
        if self.selection == "threshold":
            return (
                "RedSync(selection='threshold') sends a number of entries "
                "that depends on the data (selection='trimmed' compiles)"
            )
        if self._ramps():
            return (
                "RedSync(density_warmup_steps > 0) sends a number of "
                "entries that changes with the step during its density "
                "warm-up (density_warmup_steps=0 compiles)"
            )
        return None

    # --- the density warm-up ------------------------------------------------

    def _ramps(self) -> bool:
        return bool(self.density_warmup_steps and self.warmup_densities())

    def warmup_densities(self) -> tuple[float, ...]:
        """The densities of the density warm-up's stages, in order."""
        return warmup_densities(self.density)

    def density_at(self, step: int) -> float:
        """The density a tensor RedSync compresses is sent with at
        optimizer step `step`: 1.0 in the dense warm-up, a stage's density
        in the density warm-up, then `density`. The graph computes the
        same k from the step (`_k`)."""
        if step < self.warmup_steps:
            return 1.0
        stages = self.warmup_densities()
        offset = step - self.warmup_steps
        if not self._ramps() or offset >= self.density_warmup_steps:
            return self.density
        return stages[offset * len(stages) // self.density_warmup_steps]

    def _k(self, shape, key) -> int | tf.Tensor:
        """k at the key's step: a Python int outside the density warm-up,
        else an int64 scalar looked up by the step (key[1])."""
        k = self.num_selected(shape)
        if not self._ramps():
            return k
        n = num_elements(shape)
        stages = self.warmup_densities()
        ks = [base.num_selected(n, d) for d in stages] + [k]
        step = tf.cast(key[1], tf.int64)  # planning.key: [seed, step]
        offset = tf.maximum(step - self.warmup_steps, 0)
        stage = tf.minimum(
            offset * len(stages) // self.density_warmup_steps, len(stages)
        )
        return tf.gather(tf.constant(ks, tf.int64), stage)

    # --- planning ------------------------------------------------------------

    def should_compress(self, shape, dtype="float32", network=None):
        if self.cost_model is None:
            return True
        network = network or Network()
        p = network.num_peers
        if p < 2:
            return False  # nothing to communicate: dense costs nothing
        cost = self.cost_model if self.cost_model != PROBE else network.cost
        if cost is None:
            raise ValueError(
                "RedSync(cost_model='probe') needs the network costs that "
                "the optimizer measures when it is built; build the "
                "optimizer with CompressedOptimizer, or pass "
                "cost_model=tfgc.compressors.CostModel(latency=..., "
                "bandwidth=...)."
            )
        n = num_elements(shape)
        dense = cost.dense_time(n * tf.as_dtype(dtype).size, p)
        sparse = cost.sparse_time(n, self.payload_bytes(shape, dtype), p)
        return sparse < dense

    def dense_compressor(self):
        if self.momentum == 0.0 and self.clipnorm is None:
            return Identity()
        return MomentumDense(self.momentum, self.clipnorm)

    def warmup_compressor(self):
        return RedSyncWarmup(self.momentum, self.clipnorm)

    # --- one step ------------------------------------------------------------

    def init_state(self, shape, dtype, key):
        del key
        base.check_selection_dtype("RedSync", dtype)
        zeros = tf.zeros(shape, dtype)
        return RedSyncState(zeros, zeros)

    def worker_sums(self, state):
        # This worker's momentum of its own gradients and what it has not
        # sent of it: their sums over workers are the job's.
        return RedSyncState(True, True)

    def compress(self, x, state, key, info=None):
        base.check_selection_dtype("RedSync", x.dtype)
        g = _clipped("RedSync", self.clipnorm, x, info)
        u = _momentum_step(self.momentum, state.momentum, g)
        values, indices, accumulation = ops.top_k_sample(
            u,
            self._k(x.shape, key),
            mode=self.selection,
            rounds=self.bisection_rounds,
            seed=_sparse.selection_seed(key),
            residual=tf.cast(state.accumulation, x.dtype),
        )
        if self.momentum_masking:
            u = tf.reshape(ops.zero_at(tf.reshape(u, [-1]), indices), x.shape)
        new_state = RedSyncState(u, accumulation)
        payload = SparsePayload(values, indices)
        return payload, TensorContext(x.shape, x.dtype, new_state)

    def decompress(self, reduced, ctx):
        # The sum of every worker's (index, value) pairs.
        total = _sparse.dense_total(reduced, ctx.shape, ctx.dtype)
        return total, ctx.state

    def local_estimate(self, payload, ctx):
        return _sparse.dense_total(payload, ctx.shape, ctx.dtype)

    def payload_bytes(self, shape, dtype):
        # With threshold selection: the bound when a threshold is accepted;
        # after the density warm-up.
        k = self.num_selected(shape)
        if self.selection == "threshold" and k:
            k = 2 * k - 1
        return k * (tf.as_dtype(dtype).size + 4)

    def get_config(self):
        cost = self.cost_model
        return {
            "density": self.density,
            "momentum": self.momentum,
            "selection": self.selection,
            "rounds": self.bisection_rounds,
            "warmup_steps": self.warmup_steps,
            "cost_model": cost.get_config()
            if isinstance(cost, CostModel)
            else cost,
            "density_warmup_steps": self.density_warmup_steps,
            "clipnorm": self.clipnorm,
            "momentum_masking": self.momentum_masking,
        }


class MomentumDense(Identity):
    """RedSync's dense path for a tensor: U = m U + g, all-reduced; g
    clipped first with `clipnorm` (see `RedSync`)."""

    def __init__(self, momentum: float, clipnorm: float | None = None):
        self.momentum = momentum
        self.clipnorm = clipnorm

    @property
    def spec(self) -> Spec:
        return Spec(
            collectives=(ALL_REDUCE,),
            reads_step_info=self.clipnorm is not None,
        )

    def init_state(self, shape, dtype, key):
        del key
        return MomentumState(tf.zeros(shape, dtype))

    def worker_sums(self, state):
        return MomentumState(True)

    def compress(self, x, state, key, info=None):
        del key
        g = _clipped(type(self).__name__, self.clipnorm, x, info)
        u = _momentum_step(self.momentum, state.momentum, g)
        return DensePayload(u), DenseContext(x.dtype, MomentumState(u))

    def get_config(self):
        return {"momentum": self.momentum, "clipnorm": self.clipnorm}


class RedSyncWarmup(MomentumDense):
    """RedSync's warm-up for a sparse tensor: U = m U + g (g clipped with
    `clipnorm`); U + V is all-reduced and V emptied, keeping
    `RedSyncState`."""

    def init_state(self, shape, dtype, key):
        del key
        base.check_selection_dtype("RedSync", dtype)
        zeros = tf.zeros(shape, dtype)
        return RedSyncState(zeros, zeros)

    def worker_sums(self, state):
        return RedSyncState(True, True)

    def compress(self, x, state, key, info=None):
        del key
        g = _clipped(type(self).__name__, self.clipnorm, x, info)
        u = _momentum_step(self.momentum, state.momentum, g)
        sent = u + tf.cast(state.accumulation, x.dtype)
        new_state = RedSyncState(u, tf.zeros_like(u))
        return DensePayload(sent), DenseContext(x.dtype, new_state)
