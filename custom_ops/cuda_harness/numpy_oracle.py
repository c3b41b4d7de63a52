"""numpy oracle of tfgc/ops/top_k_sample_reference.py's specification.

A third implementation of the selection (beside the custom op and the
pure-TF reference), in numpy only: no TensorFlow import, so that
run_harness.py can use it on a machine without TensorFlow. The op tests
(tests/ops/test_ops_top_k_sample.py) use it too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

INF_KEY = 0x7F800000  # the key of +inf and of NaN; finite keys are below
MIN_NORMAL_KEY = 0x00800000  # the key of 2^-126; subnormal keys are below


def np_keys(x: np.ndarray) -> np.ndarray:
    """key(x): the bit pattern of |x| in float32 as an integer (int64), NaN
    as +inf's (non-finite values go first). Compared as integers, so that
    subnormals rank above zero in any float mode."""
    return _keys32(x).astype(np.int64)


def _keys32(x: np.ndarray) -> np.ndarray:
    """np_keys as uint32, which sorts faster than int64."""
    bits = np.ascontiguousarray(x, np.float32).reshape(-1).view(np.uint32)
    return np.minimum(bits & np.uint32(0x7FFFFFFF), np.uint32(INF_KEY))


def np_flush(value: float) -> np.float32:
    """A non-negative float rounded to float32, 0 below 2^-126."""
    return np.float32(0) if value < 2.0**-126 else np.float32(value)


def np_key_of(value: np.float32) -> int:
    """The key of a non-negative float32 (a threshold)."""
    return int(np.array(value, np.float32).view(np.uint32))


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


def np_selector(x, rounds=20) -> Callable[[int, str, int], np.ndarray]:
    """np_select on one input for many (k, mode, seed): returns
    `select(k, mode, seed=0)`. The keys are sorted once, so that each
    count of the bisection is a binary search and each selection a few
    passes over the keys, with no argsort: the harness checks inputs of
    100 M elements in every mode, dtype and k."""
    keys = _keys32(x)
    ascending = np.sort(keys)
    n = keys.size
    # Statistics over the finite keys, subnormal ones as 0.
    finite = keys < INF_KEY
    normal = finite & (keys >= MIN_NORMAL_KEY)
    mags = np.where(normal, keys, np.uint32(0)).view(np.float32)
    if finite.any():
        mean = np_flush(np.sum(mags, dtype=np.float64) / finite.sum())
        mx = mags.max()
    else:
        mean = mx = np.float32(0)
    diff = np_flush(float(mx) - float(mean))
    del finite, normal, mags

    def count(thr: int, strict: bool) -> int:
        """The number of keys > thr (strict) or >= thr."""
        side = "right" if strict else "left"
        return n - int(np.searchsorted(ascending, thr, side=side))

    def largest(k: int) -> np.ndarray:
        """The first k of a stable sort by decreasing key, increasing: the
        keys above the k-th largest, then its ties in index order."""
        if k >= n:
            return np.arange(n, dtype=np.int64)
        kth = int(ascending[n - k])
        above = np.flatnonzero(keys > kth)
        ties = np.flatnonzero(keys == kth)[: k - above.size]
        return np.sort(np.concatenate([above, ties]))

    def select(k: int, mode: str, seed: int = 0) -> np.ndarray:
        if k == 0:
            return np.zeros([0], np.int64)
        if mode == "trimmed":
            return largest(k)
        lo, hi = np.float32(0), np.float32(1)
        strict = mode == "threshold"
        hi_state = lo_state = None
        for _ in range(rounds):
            ratio = np.float32((lo + hi) * np.float32(0.5))
            step = np_flush(float(ratio) * float(diff))  # exact product
            thr = np_key_of(np.float32(mean + step))
            above = count(thr, strict)
            if strict:
                if above <= k:
                    hi = ratio
                elif above >= 2 * k:
                    lo = ratio
                    if lo_state is None or above < lo_state[1]:
                        lo_state = (thr, above)
                else:
                    lo_state = (thr, above)
                    break
            elif above <= k:
                hi = ratio
                if hi_state is None or above > hi_state[1]:
                    hi_state = (thr, above)
            else:
                lo = ratio
                if lo_state is None or above < lo_state[1]:
                    lo_state = (thr, above)
        if strict:
            if lo_state is None:
                return largest(k)
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

    return select


def np_select(x, k, mode, rounds=20, seed=0) -> np.ndarray:
    """Indices the specification selects, increasing."""
    return np_selector(x, rounds)(k, mode, seed)


def np_select_segments(x, segments, mode, rounds=20) -> list[np.ndarray]:
    """The segmented selection: for each (offset, n, k, seed) row of
    `segments`, np_select on x[offset:offset + n] alone (indices counted
    from the segment's start)."""
    x = np.asarray(x).reshape(-1)
    rows = [tuple(int(v) for v in row) for row in segments]
    return [
        np_select(x[off : off + n], k, mode, rounds=rounds, seed=seed)
        for off, n, k, seed in rows
    ]
