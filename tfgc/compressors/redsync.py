"""RedSync: residual gradient compression with momentum correction."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc import _arguments, ops
from tfgc.compressors import _sparse, base
from tfgc.compressors.dense import DenseContext, DensePayload, Identity
from tfgc.compressors.topk import SparsePayload
from tfgc.core.compressor import Network, Spec, TensorContext
from tfgc.core.cost_model import CostModel
from tfgc.core.wire import ALL_GATHER, ALL_GATHER_RAGGED, num_elements

SELECTIONS = ("threshold", "trimmed")
PROBE = "probe"


class RedSyncState(NamedTuple):
    momentum: tf.Tensor  # U, this worker's momentum
    accumulation: tf.Tensor  # V, accumulated momentum not sent yet


class MomentumState(NamedTuple):
    momentum: tf.Tensor  # U


def _momentum_step(momentum: float, u: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """U = m U + g, in the gradient's dtype."""
    return momentum * tf.cast(u, g.dtype) + g


@base.register
class RedSync(base.DensityCompressor):
    """Sparse exchange of an accumulated, momentum-corrected gradient.

    Fang et al., "RedSync: Reducing Synchronization Bandwidth for
    Distributed Deep Learning Training System" (JPDC 2019, arXiv
    1808.04357); docs/algorithms.md, section "RedSync", says what is
    reconstructed. Per tensor and worker, with momentum m:

        U = m U + g;  V = V + U;  select from V;
        send V at the selected entries;  zero V and U there.

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

    Bytes on the wire per worker: below 2k (itemsize + 4) with threshold
    selection when a threshold is accepted (a lone huge outlier can make
    the bisection too coarse for that, and the payload several times k;
    docs/algorithms.md), k (itemsize + 4) with trimmed.

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
    """

    def __init__(
        self,
        density: float = 0.001,
        momentum: float = 0.9,
        selection: str = "threshold",
        rounds: int = 20,
        warmup_steps: int = 0,
        cost_model: str | CostModel | dict | None = PROBE,
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
        self.warmup_steps = base.check_positive_int(
            "warmup_steps", warmup_steps, minimum=0
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
        threshold = self.selection == "threshold"
        return Spec(
            collectives=(ALL_GATHER_RAGGED if threshold else ALL_GATHER,),
            has_error_feedback=True,
            local_momentum=self.momentum,
            warmup_steps=self.warmup_steps,
            wants_cost_probe=self.cost_model == PROBE,
        )

    def xla_unsupported(self):
        if self.selection == "threshold":
            return (
                "RedSync(selection='threshold') sends a number of entries "
                "that depends on the data (selection='trimmed' compiles)"
            )
        return None

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
        if self.momentum == 0.0:
            return Identity()
        return MomentumDense(self.momentum)

    def warmup_compressor(self):
        return RedSyncWarmup(self.momentum)

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

    def compress(self, x, state, key):
        base.check_selection_dtype("RedSync", x.dtype)
        u = _momentum_step(self.momentum, state.momentum, x)
        values, indices, accumulation = ops.top_k_sample(
            u,
            self.num_selected(x.shape),
            mode=self.selection,
            rounds=self.bisection_rounds,
            seed=_sparse.selection_seed(key),
            residual=tf.cast(state.accumulation, x.dtype),
        )
        flat_u = tf.reshape(u, [-1])
        u = tf.tensor_scatter_nd_update(
            flat_u, indices[:, None], tf.zeros(tf.shape(indices), flat_u.dtype)
        )
        new_state = RedSyncState(tf.reshape(u, x.shape), accumulation)
        payload = SparsePayload(values, indices)
        return payload, TensorContext(x.shape, x.dtype, new_state)

    def decompress(self, reduced, ctx):
        # The sum of every worker's (index, value) pairs.
        total = _sparse.dense_total(reduced, ctx.shape, ctx.dtype)
        return total, ctx.state

    def local_estimate(self, payload, ctx):
        return _sparse.dense_total(payload, ctx.shape, ctx.dtype)

    def payload_bytes(self, shape, dtype):
        # With threshold selection: the bound when a threshold is accepted.
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
        }


class MomentumDense(Identity):
    """RedSync's dense path for a tensor: U = m U + g, all-reduced."""

    def __init__(self, momentum: float):
        self.momentum = momentum

    def init_state(self, shape, dtype, key):
        del key
        return MomentumState(tf.zeros(shape, dtype))

    def worker_sums(self, state):
        return MomentumState(True)

    def compress(self, x, state, key):
        del key
        u = _momentum_step(self.momentum, state.momentum, x)
        return DensePayload(u), DenseContext(x.dtype, MomentumState(u))

    def get_config(self):
        return {"momentum": self.momentum}


class RedSyncWarmup(MomentumDense):
    """RedSync's warm-up for a sparse tensor: U = m U + g; U + V is
    all-reduced and V emptied, keeping `RedSyncState`."""

    def init_state(self, shape, dtype, key):
        del key
        base.check_selection_dtype("RedSync", dtype)
        zeros = tf.zeros(shape, dtype)
        return RedSyncState(zeros, zeros)

    def compress(self, x, state, key):
        del key
        u = _momentum_step(self.momentum, state.momentum, x)
        sent = u + tf.cast(state.accumulation, x.dtype)
        new_state = RedSyncState(u, tf.zeros_like(u))
        return DensePayload(sent), DenseContext(x.dtype, new_state)
