"""The numpy oracle of tfgc's kernels: one per kernel, here only.

A third implementation of each op's specification (beside the compiled
op and the pure-TF reference in `tfgc/ops/`), in numpy alone: no
TensorFlow import, so that the CUDA harness (run_harness.py) runs it on a
GPU machine without TensorFlow. The op tests, the harness and the
compressors' numpy references (tests/numpy_reference.py) all use it:

* selection (`np_select`, `np_selector`; tfgc/ops/top_k_sample_reference.py;
  `np_select_ratio`, `np_ratio_scores`, `np_select_two_sided`,
  `np_side_keys`, `np_flip_sign`: tfgc/ops/top_k_sample.py),
* Golomb-Rice coding (`np_golomb_encode`, `np_golomb_decode`,
  `optimal_b`; tfgc/ops/golomb_reference.py),
* ScatterAddSum (`np_scatter_add_sum`; tfgc/ops/scatter.py),
* FusedUpdate (`np_fused_update`; fused_update_common.h),
* the 16-bit float conversions the kernels use (`to_bfloat16`,
  `round_to_bfloat16`, `to_dtype`, `as_float32`, `flush_subnormals`).
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


def np_ratio_scores(acc, weights, floor) -> np.ndarray:
    """RatioScore (top_k_sample_common.h): acc / (|weights| + floor) in
    float32, every operand and result flushed (`flush_subnormals`)."""
    f = flush_subnormals
    acc = f(np.asarray(acc, np.float32).reshape(-1))
    w = f(np.abs(np.asarray(weights, np.float32).reshape(-1)))
    floor = f(np.float32(floor))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return f(acc / f(w + floor))


def np_select_ratio(acc, weights, floor, k) -> np.ndarray:
    """Indices TopKRatioWithResidual selects from acc (float32 values),
    increasing: the exact top-k of key(np_ratio_scores), lower index
    first among equal keys (trimmed top-k of the scores)."""
    return np_select(np_ratio_scores(acc, weights, floor), k, "trimmed")


def np_side_keys(x) -> tuple[np.ndarray, np.ndarray]:
    """SideKey (top_k_two_sided_common.h) of float32 values on the positive
    and on the negative side, uint32: |x|'s bits (+inf's for NaN) where the
    value is on the side, else 0. A normal or infinite value is on the side
    of its sign, NaN on both, zeros and subnormals on neither."""
    bits = np.ascontiguousarray(x, np.float32).reshape(-1).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    nan = magnitude > INF_KEY
    normal = magnitude >= MIN_NORMAL_KEY
    negative = (bits >> 31).astype(bool)
    zero = np.uint32(0)
    inf = np.uint32(INF_KEY)
    return (
        np.where(nan, inf, np.where(normal & ~negative, magnitude, zero)),
        np.where(nan, inf, np.where(normal & negative, magnitude, zero)),
    )


def np_select_two_sided(x, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices TopKTwoSided selects from float32 values on the positive
    and on the negative side, each increasing: the min(k, entries on the
    side) largest keys (`np_side_keys`), the lower index first among
    equal keys."""
    out = []
    for keys in np_side_keys(x):
        on = np.flatnonzero(keys)
        r = min(k, on.size)
        if r == on.size or r == 0:
            out.append(on[:r])
            continue
        side = keys[on]
        kth = np.partition(side, on.size - r)[on.size - r]
        above = on[side > kth]
        ties = on[side == kth][: r - above.size]
        out.append(np.sort(np.concatenate([above, ties])))
    return out[0], out[1]


def np_flip_sign(a: np.ndarray) -> np.ndarray:
    """a (float32, float16, or bfloat16 as uint16 bits) with every sign bit
    flipped, NaN payloads kept: TopKTwoSided's negative side's values."""
    a = np.ascontiguousarray(a)
    ints = {2: np.uint16, 4: np.uint32}[a.itemsize]
    sign = ints(1 << (8 * a.itemsize - 1))
    return (a.view(ints) ^ sign).view(a.dtype)


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), nearest even; NaN 0x7fff."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), rounded)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in the device's representation of `dtype`."""
    if dtype == "bfloat16":
        return to_bfloat16(x)
    with np.errstate(over="ignore"):  # to inf, as on the device
        return x.astype(dtype)


def as_float32(a: np.ndarray, dtype: str) -> np.ndarray:
    return from_bfloat16(a) if dtype == "bfloat16" else a.astype(np.float32)


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """float32 subnormals as zeros of their sign (FTZ and DAZ)."""
    tiny = np.abs(x) < np.finfo(np.float32).tiny
    return np.where(tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


def round_to_bfloat16(x) -> np.ndarray:
    """float32 rounded to the nearest bfloat16 (ties to even; past the
    largest, inf), as float32 values."""
    x = np.asarray(x, np.float32)
    return from_bfloat16(to_bfloat16(x)).reshape(x.shape)


def np_golomb_encode(indices: np.ndarray, b: int) -> tuple[np.ndarray, int]:
    """The format of golomb_common.h in numpy: (bytes, num_bits)."""
    idx = np.asarray(indices, np.int64)
    gaps = (np.diff(idx, prepend=-1) - 1).astype(np.uint64)
    q = (gaps >> np.uint64(b)).astype(np.int64)
    lens = q + 1 + b
    starts = np.cumsum(lens) - lens
    total = int(lens.sum())
    bits = np.zeros(total, np.uint8)
    # q one bits from each code's start.
    run = np.arange(int(q.sum())) - np.repeat(np.cumsum(q) - q, q)
    bits[np.repeat(starts, q) + run] = 1
    for t in range(b):  # the remainder, most significant bit first
        bits[starts + q + 1 + t] = (gaps >> np.uint64(b - 1 - t)) & 1
    return np.packbits(bits), total


def np_golomb_decode(data: np.ndarray, k: int, b: int, limit: int):
    """The CPU kernel's decoding: (positions, (error kind, code, value))
    with the kinds of gpu::GolombDecodeError (0 none, 1 truncated, 2 unary
    part above limit >> b, 3 position >= limit)."""
    bits = np.unpackbits(np.asarray(data, np.uint8))
    zeros = np.flatnonzero(bits == 0)
    num_bits, max_q = bits.size, limit >> b
    out, pos, prev = [], 0, -1
    for j in range(k):
        z = np.searchsorted(zeros, pos)
        end = int(zeros[z]) if z < zeros.size else num_bits
        q = end - pos
        if end + 1 + b > num_bits:
            return np.array(out, np.int32), (1, j, 0)
        r = 0
        for t in range(b):
            r = (r << 1) | int(bits[end + 1 + t])
        pos = end + 1 + b
        if q > max_q:  # the CPU kernel names a lower bound
            low = prev + 1 + (min(q, max_q + 1) << b)
            return np.array(out, np.int32), (2, j, low)
        p = prev + 1 + ((q << b) | r)
        if p >= limit:
            return np.array(out, np.int32), (3, j, p)
        out.append(p)
        prev = p
    return np.array(out, np.int32), (0, 0, 0)


def optimal_b(k: int, n: int) -> int:
    """SBC's b* (tfgc.ops.golomb.golomb_optimal_b, without TensorFlow)."""
    if k == 0 or k >= n:
        return 0
    phi = (1 + 5**0.5) / 2
    ratio = np.log(phi - 1) / np.log1p(-k / n)
    return int(min(31, max(0, 1 + np.floor(np.log2(ratio)))))


def np_scatter_add_sum(values, indices, n: int, dtype: str) -> np.ndarray:
    """The numpy oracle of ScatterAddSum, in `dtype`'s representation.

    Each element is the float32 sum of its values in input order, from +0
    and left to right, with every addend and partial sum flushed to zero
    when subnormal (TensorFlow's CPU threads run with FTZ and DAZ, and the
    CUDA kernel flushes to give the CPU kernel's bits), rounded once to
    `dtype`. The runs of a stable sort by index are added up one rank at a
    time, all elements at once.
    """
    out = np.zeros(n, np.float32)
    if indices.size == 0:
        return to_dtype(out, dtype)
    x = flush_subnormals(as_float32(values, dtype))
    order = np.argsort(indices, kind="stable")
    idx, x = indices[order], x[order]
    heads = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    lengths = np.diff(np.r_[heads, idx.size])
    sums = np.zeros(heads.size, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # inf, inf - inf
        for rank in range(int(lengths.max(initial=0))):
            live = lengths > rank
            sums[live] = flush_subnormals(sums[live] + x[heads[live] + rank])
    out[idx[heads]] = sums
    return to_dtype(out, dtype)


FUSED_UPDATE_RULES = ("sgd", "momentum", "nesterov", "adam")  # Rule's codes
# The scalars of each rule before the weight decay's two (RuleScalars).
FUSED_UPDATE_SCALARS = {"sgd": 1, "momentum": 2, "nesterov": 2, "adam": 4}
# x86 decides that a result is tiny (and FTZ makes it zero) after rounding
# it to float32's precision with an unbounded exponent: an exact value
# below this rounds below 2^-126 there, although rounding into the
# subnormal range, as numpy and the device do, gives 2^-126.
_X86_TINY_BELOW = 2.0**-126 - 2.0**-151


def _ftz(r: np.ndarray, exact: np.ndarray | None = None) -> np.ndarray:
    """An operation's float32 result `r` as a thread with FTZ gives it: a
    zero of its sign when tiny; `exact` (float64) is the exact value of a
    product or quotient, whose float32 result may round up to 2^-126 from
    below (sums of float32 values never do)."""
    r = np.asarray(r, np.float32)
    mag = np.abs(r)
    tiny = mag < np.finfo(np.float32).tiny
    if exact is not None:
        tiny |= (mag == np.finfo(np.float32).tiny) & (
            np.abs(exact) < _X86_TINY_BELOW
        )
    return np.where(tiny, np.copysign(np.float32(0), r), r).astype(np.float32)


class FtzFloat:
    """UpdateElement's float policy as TensorFlow's CPU threads (x86 with
    FTZ and DAZ) compute: subnormal operands read as zeros of their sign,
    one float32 operation rounded to nearest, a tiny result (after rounding,
    as x86 decides it) a zero of its sign."""

    @staticmethod
    def add(a, b):
        return _ftz(flush_subnormals(a) + flush_subnormals(b))

    @staticmethod
    def sub(a, b):
        return _ftz(flush_subnormals(a) - flush_subnormals(b))

    @staticmethod
    def mul(a, b):
        a, b = flush_subnormals(a), flush_subnormals(b)
        return _ftz(a * b, a.astype(np.float64) * b.astype(np.float64))

    @staticmethod
    def div(a, b):
        # The float64 quotient lies on the same side of _X86_TINY_BELOW as
        # the exact one, which differs from it by more than 2^-49 of it.
        a, b = flush_subnormals(a), flush_subnormals(b)
        return _ftz(a / b, a.astype(np.float64) / b.astype(np.float64))

    @staticmethod
    def sqrt(a):
        return _ftz(np.sqrt(flush_subnormals(a)))


def np_fused_update(rule: str, weight_decay: bool, scalars, w, m, v, g):
    """The numpy oracle of FusedUpdate: (variable, momentum, velocity)
    after one update of float32 arrays by `rule` (FUSED_UPDATE_RULES), with
    the scalars in fused_update_common.h's layout (the rule's, then
    weight_decay and decay_learning_rate when `weight_decay`). The float32
    operations of UpdateElement, in its order, one at a time, each as
    FtzFloat computes it; m and v may be None for the slots the rule does
    not have, and come back as given then."""
    f = FtzFloat
    c = [np.float32(x) for x in scalars]
    d = FUSED_UPDATE_SCALARS[rule]
    with np.errstate(all="ignore"):  # inf - inf, 0 / 0, overflow
        w = np.asarray(w, np.float32)
        if weight_decay:
            w = f.sub(w, f.mul(f.mul(w, c[d]), c[d + 1]))
        if rule == "sgd":
            w = f.sub(w, f.mul(g, c[0]))
        elif rule == "adam":
            m = f.add(m, f.mul(f.sub(g, m), c[1]))
            v = f.add(v, f.mul(f.sub(f.mul(g, g), v), c[2]))
            w = f.sub(w, f.div(f.mul(m, c[0]), f.add(f.sqrt(v), c[3])))
        else:
            m = f.sub(f.mul(m, c[1]), f.mul(g, c[0]))
            if rule == "nesterov":
                w = f.add(w, f.sub(f.mul(m, c[1]), f.mul(g, c[0])))
            else:
                w = f.add(w, m)
    return w, m, v
