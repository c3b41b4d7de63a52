"""MSTopK: exactly k elements by band-sampling bisection, no sort."""

from __future__ import annotations

from tfgc import ops
from tfgc.compressors import _sparse, base
from tfgc.compressors.topk import TopK


@base.register
class MSTopK(TopK):
    """Sends exactly k = ceil(density * n) entries chosen by MSTopK.

    Shi et al., "Towards Scalable Distributed Training of Deep Learning on
    Public Cloud Clusters" (MLSys 2021); docs/algorithms.md, section
    "MSTopK". With a = |x| the threshold mean(a) + ratio (max(a) -
    mean(a)) is bisected on ratio for `rounds` rounds, keeping the largest
    count k1 <= k (threshold thr1) and the smallest count k2 > k (thr2).
    Every entry with a >= thr1 is sent, plus k - k1 entries of the band
    thr2 <= a < thr1: a contiguous run (in index order) whose start is
    drawn from the per-tensor, per-step key that all workers share. The
    result approximates the top-k without sorting (recall of the true top-k
    is reported in docs/algorithms.md).

    Selection runs in `tfgc.ops.top_k_sample(mode="mstopk")`; with error
    feedback the residual is added and the sent entries zeroed in the same
    op. Indices differ between workers, so values and int32 indices are
    all-gathered. Bytes on the wire per worker: k * (itemsize + 4).

    Args:
        density: fraction of entries to send, in (0, 1].
        rounds: bisection rounds, in [1, 64].
        batch_selection: as `TopK`'s: one segmented selection for every
            tensor of a bucket (None: where the compiled ops run on a GPU).
    """

    _fused_without_custom_ops = True
    _selection_mode = "mstopk"

    def __init__(
        self, density: float = 0.01, rounds: int = 20, batch_selection=None
    ):
        super().__init__(density, batch_selection)
        self.bisection_rounds = base.check_positive_int("rounds", rounds)
        if self.bisection_rounds > 64:
            raise ValueError(
                f"`rounds` must be in [1, 64]. Received: rounds={rounds}"
            )

    def init_state(self, shape, dtype, key):
        base.check_selection_dtype("MSTopK", dtype)
        return super().init_state(shape, dtype, key)

    def select(self, x, k, key, residual=None):
        base.check_selection_dtype("MSTopK", x.dtype)
        return ops.top_k_sample(
            x,
            k,
            mode="mstopk",
            rounds=self.bisection_rounds,
            seed=self._selection_seed(key),
            residual=residual,
        )

    def _selection_seed(self, key):
        return _sparse.selection_seed(key)

    def get_config(self):
        return dict(super().get_config(), rounds=self.bisection_rounds)
