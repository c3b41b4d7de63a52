"""Sampled top-k selection by magnitude: MSTopK, RedSync, trimmed top-k.

`top_k_sample` runs the compiled `Tfgc>TopKSample` op when it is loaded and
`top_k_sample_reference` (pure TensorFlow, the test oracle;
`tfgc/ops/top_k_sample_reference.py`, which also states the modes)
otherwise; both return the same indices for the same inputs and seed.
`top_k_abs` is the exact top-k by magnitude; `top_k_ratio` the exact top-k
of |acc| / (|w| + floor) fused with error feedback (importance pruning);
`top_k_two_sided` the k largest positive and k most negative entries in
one pass (SBC's binarization).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc.ops import _checks, _library
from tfgc.ops.sparse_write import zero_at
from tfgc.ops.top_k_sample_reference import (
    _FLOAT_DTYPES,
    MODES,
    _as_index,
    _check_args,
    _k_checks,
    _magnitude_keys,
    slice_start_reference,
    top_k_sample_reference,
)

__all__ = [
    "MODES",
    "slice_start_reference",
    "ratio_scores",
    "top_k_abs",
    "top_k_ratio",
    "top_k_sample",
    "top_k_sample_reference",
    "top_k_two_sided",
    "top_k_two_sided_reference",
    "TwoSidedSelection",
]


def top_k_sample(
    x: tf.Tensor,
    k: int | tf.Tensor,
    mode: str = "mstopk",
    rounds: int = 20,
    seed: int | tf.Tensor = 0,
    residual: tf.Tensor | None = None,
) -> tuple[tf.Tensor, ...]:
    """Selects about k elements of the flattened `x` by magnitude.

    Args:
        x: float32, float16 or bfloat16 tensor of any shape (flattened).
        k: number of elements, in [0, x.size]; int or int32/int64 scalar.
        mode: "mstopk" (exactly k, sampled band fill), "threshold" (RedSync
            threshold search, k < size < 2k) or "trimmed" (exact top-k).
        rounds: bisection rounds (mstopk and threshold), in [1, 64].
        seed: int64 scalar choosing MSTopK's band slice; same seed, same
            selection.
        residual: optional error-feedback residual of x's shape and dtype.
            When given, the selection is made from acc = x + residual.

    Returns:
        (values, indices), values = x[indices] (acc[indices] with a
        residual), indices int32 increasing; with `residual`, also the new
        residual: acc with the selected entries zeroed, in x's shape.

    Raises:
        tf.errors.InvalidArgumentError: k is not a scalar in [0, x.size].
        ValueError: unknown mode or rounds out of range; or, while XLA
            compiles the graph (`jit_compile=True`), mode "threshold" or
            a k not known while tracing (output sizes XLA cannot know).
    """
    x = tf.convert_to_tensor(x)
    _check_args(x, mode, rounds)
    lib = _library.custom_ops()
    if lib is None:
        return top_k_sample_reference(x, k, mode, rounds, seed, residual)
    k = _as_index(k)
    seed = tf.cast(seed, tf.int64)
    if residual is None:
        return tuple(
            lib.tfgc_top_k_sample(x, k, seed, mode=mode, rounds=rounds)
        )
    residual = tf.convert_to_tensor(residual, dtype=x.dtype)
    return tuple(
        lib.tfgc_top_k_sample_with_residual(
            x, residual, k, seed, mode=mode, rounds=rounds
        )
    )


def top_k_abs(
    x: tf.Tensor, k: int, residual: tf.Tensor | None = None
) -> tuple[tf.Tensor, ...]:
    """Exact top-k of the flattened `x` by magnitude: (values, indices).

    Runs the compiled `TopKSample` in "trimmed" mode when the library is
    loaded (several times faster than `tf.math.top_k` on CPU; see
    benchmarks/results/ops_cpu.md), and `tf.math.top_k` over |x| otherwise
    (faster than the pure-TF trimmed reference). Both select the same set:
    NaN and +-Inf count as the largest magnitude, and ties go to the lower
    index. The order of the result may differ.

    Args:
        x: floating tensor of any shape.
        k: number of elements, in [0, x.size].
        residual: optional error-feedback residual of x's shape (cast to
            x's dtype). When given, the top-k of acc = x + residual is
            taken and the new residual returned too, fused into one op
            (`TopKSampleWithResidual`) when the library is loaded.

    Returns:
        values (x's dtype) and int32 indices into the flattened `x`, [k] each;
        with `residual`, also acc with the selected entries zeroed, in x's
        shape.
    """
    x = tf.convert_to_tensor(x)
    compiled = _library.custom_ops() is not None and x.dtype in _FLOAT_DTYPES
    if residual is not None:
        residual = tf.cast(residual, x.dtype)
        if compiled:
            return top_k_sample(x, k, mode="trimmed", residual=residual)
        acc = tf.reshape(x + residual, [-1])
        values, indices = top_k_abs(acc, k)
        new_residual = zero_at(acc, indices)
        return values, indices, tf.reshape(new_residual, tf.shape(x))
    flat = tf.reshape(x, [-1])
    if compiled:
        return top_k_sample(flat, k, mode="trimmed")
    n = tf.size(flat, out_type=tf.int64)
    k64 = tf.cast(_as_index(k), tf.int64)
    with tf.control_dependencies(
        _checks.independent(lambda: _k_checks(k64, n))
    ):
        keys = tf.identity(_magnitude_keys(flat))
    _, indices = tf.math.top_k(keys, k=k, sorted=False)
    return tf.gather(flat, indices), indices


def _flush_subnormal(x: tf.Tensor) -> tf.Tensor:
    """float32 x with subnormals as zeros of their sign (FTZ and DAZ)."""
    bits = tf.bitcast(x, tf.int32)
    tiny = tf.equal(tf.bitwise.bitwise_and(bits, 0x7F800000), 0)
    sign = tf.bitwise.bitwise_and(bits, tf.constant(-(2**31), tf.int32))
    return tf.bitcast(tf.where(tiny, sign, bits), tf.float32)


def ratio_scores(
    acc: tf.Tensor, weights: tf.Tensor, floor: float | tf.Tensor
) -> tf.Tensor:
    """acc / (|weights| + floor) in float32, as `top_k_ratio` ranks it.

    IEEE addition and division, every operand and result subnormal in
    float32 flushed to a zero of its sign (as a CPU thread with FTZ and DAZ
    set computes it, and as the compiled op does on every device:
    `RatioScore` in custom_ops/cc/kernels/top_k_sample_common.h). The sign
    is acc's; the ranking is by |score|.
    """
    f32 = tf.float32
    flush = _flush_subnormal
    floor = flush(tf.convert_to_tensor(floor, f32))
    denominator = flush(flush(tf.abs(tf.cast(weights, f32))) + floor)
    return flush(flush(tf.cast(acc, f32)) / denominator)


def top_k_ratio(
    x: tf.Tensor,
    k: int,
    weights: tf.Tensor,
    floor: float | tf.Tensor,
    residual: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Exact top-k of acc = x + residual by importance, with error feedback.

    Ranks the entries of acc by |ratio_scores(acc, weights, floor)| (NaN
    and +-Inf scores first, ties to the lower index, as `top_k_abs`) and
    returns acc's values there, not the scores. One compiled op
    (`Tfgc>TopKRatioWithResidual`) reads x, the residual and the weights
    once when the library is loaded; otherwise `ratio_scores`, `top_k_abs`,
    a gather and a scatter select the same set.

    Args:
        x: float32, float16 or bfloat16 tensor of any shape (flattened).
        k: number of elements, in [0, x.size].
        weights: tensor of x's shape and dtype (the variable's value).
        floor: float32 scalar added to |weights|.
        residual: the error-feedback residual, x's shape (cast to x's
            dtype).

    Returns:
        values (acc[indices], x's dtype), int32 indices into the flattened
        x in increasing order, [k] each, and the new residual: acc with
        those entries zeroed, in x's shape.

    Raises:
        tf.errors.InvalidArgumentError: k is not a scalar in [0, x.size],
            or weights or residual has another shape than x.
    """
    x = tf.convert_to_tensor(x)
    residual = tf.cast(residual, x.dtype)
    weights = tf.convert_to_tensor(weights, dtype=x.dtype)
    floor = tf.convert_to_tensor(floor, tf.float32)
    lib = _library.custom_ops()
    if lib is not None and x.dtype in _FLOAT_DTYPES:
        return tuple(
            lib.tfgc_top_k_ratio_with_residual(
                x, residual, weights, floor, _as_index(k)
            )
        )
    acc = tf.reshape(x + residual, [-1])
    with tf.control_dependencies(
        _checks.independent(
            lambda: [tf.debugging.assert_equal(tf.shape(weights), tf.shape(x))]
        )
    ):
        scores = ratio_scores(acc, tf.reshape(weights, [-1]), floor)
    _, indices = top_k_abs(scores, k)
    indices = tf.sort(indices)
    values = tf.gather(acc, indices)
    new_residual = zero_at(acc, indices)
    return values, indices, tf.reshape(new_residual, tf.shape(x))


class TwoSidedSelection(NamedTuple):
    """What `top_k_two_sided` selects: each side's values and int32
    indices, [up to k] each, indices increasing."""

    positive_values: tf.Tensor  # x there
    positive_indices: tf.Tensor
    negative_values: tf.Tensor  # -x there: the magnitudes
    negative_indices: tf.Tensor


def _largest(flat: tf.Tensor, k: int | tf.Tensor) -> tuple[tf.Tensor, ...]:
    """The (up to) k largest strictly positive entries of flat, NaN first
    (it counts as the largest magnitude): values, increasing indices."""
    values, indices = top_k_abs(tf.nn.relu(flat), k)
    # relu(NaN) is NaN: it is kept. Spelled with is_nan, not as
    # ~(values <= 0): Grappler rewrites that to values > 0 in graphs,
    # which would drop NaN in tf.function only.
    keep = (values > 0) | tf.math.is_nan(values)
    values, indices = values[keep], indices[keep]
    order = tf.argsort(indices)
    return tf.gather(values, order), tf.gather(indices, order)


def top_k_two_sided_reference(x: tf.Tensor, k: int) -> TwoSidedSelection:
    """`top_k_two_sided` in pure TensorFlow: `top_k_abs` of relu(x) and of
    relu(-x), each kept where it is > 0 or NaN, in index order."""
    flat = tf.reshape(tf.convert_to_tensor(x), [-1])
    return TwoSidedSelection(*_largest(flat, k), *_largest(-flat, k))


def top_k_two_sided(x: tf.Tensor, k: int | tf.Tensor) -> TwoSidedSelection:
    """The k largest positive entries of the flattened x and its k most
    negative ones (SBC's two sides).

    On the positive side are the entries > 0 and NaN, on the negative side
    those < 0 and NaN, compared as TensorFlow's CPU threads compare (with
    denormals flushed: zeros and float32 subnormals are on neither side;
    float16's subnormals are normal in float32 and count). Each side keeps
    its min(k, entries) largest magnitudes, NaN and +-Inf first, the lower
    index first among equal magnitudes, in index order. With the library
    loaded and float32, float16 or bfloat16, one compiled op
    (`Tfgc>TopKTwoSided`) reads x once for both sides; otherwise (and for
    float64) `top_k_two_sided_reference`, the same bit for bit.

    Args:
        x: floating tensor of any shape (flattened).
        k: entries per side, in [0, x.size]; int or int32/int64 scalar.

    Returns:
        A `TwoSidedSelection`: the positive side's values (x there) and
        int32 indices, the negative side's values (-x there: relu(-x), a
        NaN's sign bit flipped) and indices.

    Raises:
        tf.errors.InvalidArgumentError: k is not a scalar in [0, x.size].
    """
    x = tf.convert_to_tensor(x)
    lib = _library.custom_ops()
    if lib is not None and x.dtype in _FLOAT_DTYPES:
        return TwoSidedSelection(*lib.tfgc_top_k_two_sided(x, _as_index(k)))
    return top_k_two_sided_reference(x, k)
