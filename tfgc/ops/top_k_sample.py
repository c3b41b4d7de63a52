"""Sampled top-k selection by magnitude: MSTopK, RedSync, trimmed top-k.

`top_k_sample` runs the compiled `Tfgc>TopKSample` op when it is loaded and
`top_k_sample_reference` (pure TensorFlow, the test oracle;
`tfgc/ops/top_k_sample_reference.py`, which also states the modes)
otherwise; both return the same indices for the same inputs and seed.
`top_k_abs` is the exact top-k by magnitude.
"""

from __future__ import annotations

import tensorflow as tf

from tfgc.ops import _library
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
    "top_k_abs",
    "top_k_sample",
    "top_k_sample_reference",
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
        new_residual = tf.tensor_scatter_nd_update(
            acc, indices[:, None], tf.zeros_like(values)
        )
        return values, indices, tf.reshape(new_residual, tf.shape(x))
    flat = tf.reshape(x, [-1])
    if compiled:
        return top_k_sample(flat, k, mode="trimmed")
    n = tf.size(flat, out_type=tf.int64)
    with tf.control_dependencies(_k_checks(tf.cast(_as_index(k), tf.int64), n)):
        keys = tf.identity(_magnitude_keys(flat))
    _, indices = tf.math.top_k(keys, k=k, sorted=False)
    return tf.gather(flat, indices), indices
