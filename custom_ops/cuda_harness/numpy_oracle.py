"""numpy oracle of tfgc/ops/top_k_sample.py's specification.

A third implementation of the selection (beside the custom op and the
pure-TF reference), in numpy only: no TensorFlow import, so that
run_harness.py can use it on a machine without TensorFlow. The op tests
(tests/ops/test_ops_top_k_sample.py) use it too.
"""

from __future__ import annotations

import numpy as np


def np_keys(x: np.ndarray) -> np.ndarray:
    """|x| in float32, NaN as +inf (non-finite values go first)."""
    a = np.abs(np.asarray(x, np.float32).reshape(-1))
    return np.where(np.isnan(a), np.float32(np.inf), a).astype(np.float32)


def np_slice_start(seed: int, max_start: int) -> int:
    if max_start <= 0:
        return 0
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    u = float(z >> 11) * 2.0**-53
    return min(int(u * float(max_start + 1)), max_start)


def np_select(x, k, mode, rounds=20, seed=0) -> np.ndarray:
    """Indices the specification selects, increasing."""
    keys = np_keys(x)
    n = keys.size
    if k == 0:
        return np.zeros([0], np.int64)
    order = np.argsort(-keys, kind="stable")
    if mode == "trimmed":
        return np.sort(order[:k])
    finite = np.isfinite(keys)
    if finite.any():
        mean = np.float32(np.sum(keys[finite], dtype=np.float64) / finite.sum())
        mx = keys[finite].max()
    else:
        mean = mx = np.float32(0)
    diff = np.float32(mx - mean)
    lo, hi = np.float32(0), np.float32(1)
    strict = mode == "threshold"
    hi_state = lo_state = None
    for _ in range(rounds):
        ratio = np.float32((lo + hi) * np.float32(0.5))
        thr = np.float32(mean + np.float32(ratio * diff))
        count = int(np.sum(keys > thr if strict else keys >= thr))
        if strict:
            if count <= k:
                hi = ratio
            elif count >= 2 * k:
                lo = ratio
                if lo_state is None or count < lo_state[1]:
                    lo_state = (thr, count)
            else:
                lo_state = (thr, count)
                break
        elif count <= k:
            hi = ratio
            if hi_state is None or count > hi_state[1]:
                hi_state = (thr, count)
        else:
            lo = ratio
            if lo_state is None or count < lo_state[1]:
                lo_state = (thr, count)
    if strict:
        if lo_state is None:
            return np.sort(order[:k])
        return np.flatnonzero(keys > lo_state[0])
    above = keys >= hi_state[0] if hi_state else np.zeros(n, bool)
    k1 = hi_state[1] if hi_state else 0
    band = ~above & ((keys >= lo_state[0]) if lo_state else True)
    band_idx = np.flatnonzero(band)
    need = k - k1
    size = (lo_state[1] if lo_state else n) - k1
    assert size == band_idx.size
    start = np_slice_start(seed, size - need)
    chosen = band_idx[start : start + need]
    return np.sort(np.concatenate([np.flatnonzero(above), chosen]))
