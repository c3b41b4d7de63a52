"""The specification of sampled top-k selection, in pure TensorFlow.

`top_k_sample_reference` is the test oracle of the compiled
`Tfgc>TopKSample` op (`tfgc.ops.top_k_sample`), and what runs without it;
both return the same indices for the same inputs and seed.

Shared definitions (docs/algorithms.md, "Selection and position-coding ops"):

* key(x) = |x| in float32, compared as its bit pattern (an integer); NaN
  has the key of +inf, as +-Inf: non-finite values count as the largest
  magnitude and are selected first. Comparing integers, a subnormal ranks
  above zero and by value although TensorFlow's threads flush denormals
  (FTZ/DAZ), under which float comparisons would take it for zero.
* The statistics count subnormal keys as 0 and flush float32 results below
  2^-126 to 0, so no float mode changes them: mean = sum of finite keys
  (float64) / their count, rounded to float32; max = largest finite key;
  both 0 when no key is finite; diff = max - mean.
* thr(ratio) = mean + flush(ratio * diff) in float32, ratio bisected in
  [0, 1] starting from 0.5 for `rounds` rounds; compared through its key.

Modes:

* "mstopk" (Shi et al., MLSys 2021): counts of key >= thr; tracks the
  largest count k1 <= k (thr1) and the smallest count k2 > k (thr2); takes
  every key >= thr1 plus k - k1 elements of the band thr2 <= key < thr1, a
  contiguous slice (in index order) whose start is uniform in
  [0, |band| - (k - k1)] given `seed`. Exactly k. With no count <= k the band
  has no upper bound; with no count > k it has no lower bound.
* "threshold" (RedSync, Fang et al. 2019): counts of key > thr; a count
  <= k lowers thr, a count >= 2k raises it, k < count < 2k is accepted.
  Output: the keys > the accepted threshold (k < size < 2k); if none was
  accepted, the threshold with the smallest count above k (size may reach
  2k or more with ties); if no count ever exceeded k, the exact top-k.
* "trimmed" (RedSync's trimmed top-k): the candidates are the keys above
  the highest of thr(0.8), thr(0.6), ..., thr(0) that at least k keys
  exceed (all keys if none); the exact top-k among them, which equals the
  exact top-k of x.
  Ties go to the lower index. Exactly k.

Indices are int32 and increasing; values are x[indices] in x's dtype.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfgc.ops import _checks, _library

MODES = ("mstopk", "threshold", "trimmed")
_FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)
_MIN_NORMAL = 2.0**-126  # float32's smallest normal
_MIN_NORMAL_KEY = 0x00800000  # its key; subnormal keys are below
_INF_KEY = 0x7F800000  # the key of +inf and of NaN; finite keys are below
_SPLITMIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _check_args(x: tf.Tensor, mode: str, rounds: int) -> None:
    if mode not in MODES:
        raise ValueError(
            f"`mode` must be one of {', '.join(MODES)}. Received: mode={mode}"
        )
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)):
        raise TypeError(f"`rounds` must be an int. Received: rounds={rounds!r}")
    if not 1 <= rounds <= 64:
        raise ValueError(
            f"`rounds` must be in [1, 64]. Received: rounds={rounds}"
        )
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            "`x` must be float32, float16 or bfloat16. "
            f"Received: dtype={x.dtype.name}. Cast it first "
            "(tf.cast(x, tf.float32)), or use `top_k_abs`, which takes "
            "float64 too."
        )


def _k_checks(k: tf.Tensor, n: tf.Tensor) -> list[tf.Operation]:
    """Run-time checks that the int64 k is a scalar in [0, n], each naming
    `k` and its value (the compiled ops' checks say the same)."""
    return [
        tf.debugging.assert_equal(
            tf.rank(k), 0, message="`k` must be a scalar"
        ),
        tf.debugging.assert_greater_equal(
            k, tf.constant(0, tf.int64), message="`k` must be in [0, n]"
        ),
        tf.debugging.assert_less_equal(k, n, message="`k` must be in [0, n]"),
    ]


def _as_index(k: int | tf.Tensor) -> tf.Tensor:
    k = tf.convert_to_tensor(k)
    if k.dtype not in (tf.int32, tf.int64):
        k = tf.cast(k, tf.int64)
    return k


def _static_k(k: int | tf.Tensor, x: tf.Tensor) -> int | None:
    """k as a Python int when it and x's size are known while tracing."""
    value = tf.get_static_value(k)
    if value is None or np.ndim(value) != 0 or not x.shape.is_fully_defined():
        return None
    return int(value)


def _positions(mask: tf.Tensor, k: int) -> tf.Tensor:
    """The increasing int32 positions of a mask with exactly k set, [k].

    Each set element goes to slot (number of set elements before it); a
    static shape, unlike `tf.where`, so XLA compiles it.
    """
    n = mask.shape[0]
    slot = tf.cumsum(tf.cast(mask, tf.int32), exclusive=True)
    slot = tf.where(mask & (slot < k), slot, k)  # slot k: dropped
    iota = tf.where(mask, tf.range(n, dtype=tf.int32), 0)
    return tf.math.unsorted_segment_sum(iota, slot, k + 1)[:k]


def _keys(x: tf.Tensor) -> tf.Tensor:
    """key(x) of the flattened x: int32, in float32 for every dtype."""
    return _magnitude_keys(tf.cast(tf.reshape(x, [-1]), tf.float32))


def _magnitude_keys(x: tf.Tensor) -> tf.Tensor:
    """Integers in the order of |x|: its bit pattern without the sign, NaN
    as +inf (the largest magnitude, as +-inf). int32 for float32, int64
    for float64; no float comparison, so subnormals rank above zero."""
    if x.dtype == tf.float64:
        ints, magnitude, inf = tf.int64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000
    else:
        x = tf.cast(x, tf.float32)  # exact for float16 and bfloat16
        ints, magnitude, inf = tf.int32, 0x7FFFFFFF, _INF_KEY
    bits = tf.bitwise.bitwise_and(
        tf.bitcast(x, ints), tf.constant(magnitude, ints)
    )
    return tf.minimum(bits, tf.constant(inf, ints))


def _key_of(value: tf.Tensor) -> tf.Tensor:
    """The key of a non-negative float32 scalar (a threshold)."""
    return tf.bitcast(value, tf.int32)


def _flush(value: tf.Tensor) -> tf.Tensor:
    """A non-negative float64 rounded to float32, 0 below 2^-126."""
    rounded = tf.cast(value, tf.float32)
    return tf.where(value < _MIN_NORMAL, tf.constant(0.0), rounded)


def slice_start_reference(seed: tf.Tensor, max_start: tf.Tensor) -> tf.Tensor:
    """MSTopK's band slice start, uniform in [0, max_start] given `seed`.

    SplitMix64 of the seed, top 53 bits as a float64 u in [0, 1), then
    floor(u * (max_start + 1)); 0 when max_start <= 0.
    """
    c = [tf.constant(v, tf.uint64) for v in _SPLITMIX]
    z = tf.bitcast(tf.cast(seed, tf.int64), tf.uint64) + c[0]
    sh = tf.bitwise.right_shift
    z = tf.bitwise.bitwise_xor(z, sh(z, tf.constant(30, tf.uint64))) * c[1]
    z = tf.bitwise.bitwise_xor(z, sh(z, tf.constant(27, tf.uint64))) * c[2]
    z = tf.bitwise.bitwise_xor(z, sh(z, tf.constant(31, tf.uint64)))
    u = tf.cast(sh(z, tf.constant(11, tf.uint64)), tf.float64) * (2.0**-53)
    max_start = tf.cast(max_start, tf.int64)
    s = tf.cast(u * tf.cast(max_start + 1, tf.float64), tf.int64)
    return tf.where(max_start <= 0, tf.constant(0, tf.int64), s)


def _stats(keys: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """mean and diff over the finite keys, subnormal ones as 0."""
    finite = keys < _INF_KEY
    count = tf.reduce_sum(tf.cast(finite, tf.int64))
    normal = finite & (keys >= _MIN_NORMAL_KEY)
    magnitudes = tf.bitcast(tf.where(normal, keys, 0), tf.float32)
    total = tf.reduce_sum(tf.cast(magnitudes, tf.float64))
    mean = _flush(total / tf.cast(tf.maximum(count, 1), tf.float64))
    mx = tf.reduce_max(tf.concat([magnitudes, tf.zeros([1])], 0))
    mean = tf.where(count > 0, mean, 0.0)
    mx = tf.where(count > 0, mx, 0.0)
    return mean, _flush(tf.cast(mx, tf.float64) - tf.cast(mean, tf.float64))


def _count(keys: tf.Tensor, thr: tf.Tensor, strict: bool) -> tf.Tensor:
    above = keys > thr if strict else keys >= thr
    return tf.reduce_sum(tf.cast(above, tf.int64))


def _bisect(keys, k, mean, diff, rounds: int, strict: bool):
    """The bisection of the module docstring; returns its final state, the
    thresholds as keys."""
    f32, i64 = tf.float32, tf.int64
    lo, hi = tf.constant(0.0, f32), tf.constant(1.0, f32)
    has_hi, has_lo, accepted = (tf.constant(False),) * 3
    hi_thr, lo_thr = tf.constant(0), tf.constant(0)
    hi_count, lo_count = tf.constant(0, i64), tf.constant(0, i64)
    diff64 = tf.cast(diff, tf.float64)
    for _ in range(rounds):
        ratio = (lo + hi) * 0.5
        step = _flush(tf.cast(ratio, tf.float64) * diff64)  # exact product
        thr = _key_of(mean + step)
        count = _count(keys, thr, strict)
        small = count <= k
        if strict:  # RedSync threshold search
            big = ~small & (count >= 2 * k)
            accept = ~small & ~big & ~accepted
            active = ~accepted
            new_lo = active & (big | accept)
            set_lo = new_lo & (accept | ~has_lo | (count < lo_count))
            hi = tf.where(active & small, ratio, hi)
            lo = tf.where(new_lo, ratio, lo)
            accepted = accepted | accept
        else:  # MSTopK
            set_hi = small & (~has_hi | (count > hi_count))
            set_lo = ~small & (~has_lo | (count < lo_count))
            hi = tf.where(small, ratio, hi)
            lo = tf.where(small, lo, ratio)
            hi_thr = tf.where(set_hi, thr, hi_thr)
            hi_count = tf.where(set_hi, count, hi_count)
            has_hi = has_hi | set_hi
        lo_thr = tf.where(set_lo, thr, lo_thr)
        lo_count = tf.where(set_lo, count, lo_count)
        has_lo = has_lo | set_lo
    return has_hi, hi_thr, hi_count, has_lo, lo_thr, lo_count


def _exact_mask(keys: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    n = tf.size(keys, out_type=tf.int64)
    idx = tf.math.top_k(keys, tf.cast(k, tf.int32)).indices
    return tf.scatter_nd(
        tf.cast(idx, tf.int64)[:, None],
        tf.ones(tf.shape(idx), tf.bool),
        n[None],
    )


def _mask_reference(keys, k, mode: str, rounds: int, seed) -> tf.Tensor:
    n = tf.size(keys, out_type=tf.int64)
    if mode == "trimmed":
        # The trimming only bounds the candidates; among keys above a
        # threshold that at least k keys exceed, the top-k is the global one.
        return _exact_mask(keys, k)
    mean, diff = _stats(keys)
    strict = mode == "threshold"
    has_hi, hi_thr, hi_count, has_lo, lo_thr, lo_count = _bisect(
        keys, k, mean, diff, rounds, strict
    )
    if strict:
        return tf.cond(
            has_lo,
            lambda: keys > lo_thr,
            lambda: _exact_mask(keys, k),
        )
    above = has_hi & (keys >= hi_thr)
    band = ~above & (~has_lo | (keys >= lo_thr))
    above_count = tf.where(has_hi, hi_count, 0)
    need = k - above_count
    band_size = tf.where(has_lo, lo_count, n) - above_count
    start = slice_start_reference(seed, band_size - need)
    rank = tf.cumsum(tf.cast(band, tf.int64), exclusive=True)
    return above | (band & (rank >= start) & (rank < start + need))


def top_k_sample_reference(
    x: tf.Tensor,
    k: int | tf.Tensor,
    mode: str = "mstopk",
    rounds: int = 20,
    seed: int | tf.Tensor = 0,
    residual: tf.Tensor | None = None,
) -> tuple[tf.Tensor, ...]:
    """Pure-TensorFlow `top_k_sample`: same arguments, same results."""
    x = tf.convert_to_tensor(x)
    _check_args(x, mode, rounds)
    k_static = _static_k(k, x)
    if mode == "threshold":
        _library.refuse_xla(
            "tfgc.ops.top_k_sample(mode='threshold') selects a number of "
            "elements that depends on the data"
        )
    elif k_static is None:
        _library.refuse_xla(
            "tfgc.ops.top_k_sample with a k known only at run time returns "
            "that many elements"
        )
    if residual is not None:
        residual = tf.convert_to_tensor(residual, dtype=x.dtype)
        x = x + residual
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    k = tf.cast(_as_index(k), tf.int64)
    seed = tf.convert_to_tensor(seed)
    checks = _checks.independent(
        lambda: (
            _k_checks(k, n)
            + [
                tf.debugging.assert_equal(
                    tf.rank(seed), 0, message="`seed` must be a scalar"
                ),
            ]
        )
    )
    with tf.control_dependencies(checks):
        keys = tf.identity(_keys(flat))
        k = tf.identity(tf.reshape(k, []))
        seed = tf.cast(tf.reshape(seed, []), tf.int64)
    if k_static is not None and mode != "threshold":
        # Exactly k: decided while tracing, and of static shape [k].
        mask = (
            _mask_reference(keys, k_static, mode, rounds, seed)
            if k_static > 0
            else tf.zeros(tf.shape(keys), tf.bool)
        )
        indices = _positions(mask, k_static)
    else:
        mask = tf.cond(
            k > 0,
            lambda: _mask_reference(keys, k, mode, rounds, seed),
            lambda: tf.zeros(tf.shape(keys), tf.bool),
        )
        indices = tf.cast(tf.reshape(tf.where(mask), [-1]), tf.int32)
    values = tf.gather(flat, indices)
    if residual is None:
        return values, indices
    new_residual = tf.tensor_scatter_nd_update(
        flat, indices[:, None], tf.zeros_like(values)
    )
    return values, indices, tf.reshape(new_residual, tf.shape(x))
