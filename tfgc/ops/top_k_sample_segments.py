"""TopKSample of many tensors fused in one buffer, in one op.

`top_k_sample_segments` selects in every segment of a fused 1-D buffer (the
tensors of a model, concatenated) what `top_k_sample` would select in that
segment alone with its own k and seed, bit for bit; mode and rounds are
shared. It runs the compiled `Tfgc>TopKSampleSegments` op when the library
is loaded and `top_k_sample_segments_reference` (a loop of
`top_k_sample_reference` over the segments, pure TensorFlow) otherwise or
while XLA compiles the graph.

On a GPU the compiled op selects in every segment with one set of launches
(about a dozen, instead of about a dozen per tensor: ResNet-50 has ~160
tensors); on the CPU it runs the single-tensor selection on each segment in
turn. `TopK` and `MSTopK` select with it for every tensor of a bucket
where the compiled ops run on a GPU (`batch_selection`). The GPU path has
only run under the CUDA emulation of `custom_ops/cuda_harness` so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgc.ops import _checks, _library
from tfgc.ops.top_k_sample_reference import (
    _as_index,
    _check_args,
    top_k_sample_reference,
)

_MAX_SEGMENT = 2**31 - 1  # int32 indices


class SegmentSelection(NamedTuple):
    """The selections of `top_k_sample_segments`, in segment order.

    Attributes:
        values: [sum(sizes)] in x's dtype; segment i's sizes[i] values
            follow segment i - 1's.
        indices: [sum(sizes)] int32, each segment's increasing and counted
            from the segment's own start.
        sizes: [S] int64, the number of elements each segment selected
            (k[i] in modes "mstopk" and "trimmed").
    """

    values: tf.Tensor
    indices: tf.Tensor
    sizes: tf.Tensor


class SegmentSelectionWithResidual(NamedTuple):
    """`SegmentSelection` plus the error-feedback residual.

    Attributes:
        values: as `SegmentSelection.values`, taken from acc = x + residual.
        indices: as `SegmentSelection.indices`.
        sizes: as `SegmentSelection.sizes`.
        new_residual: acc with every selected entry zeroed, in x's shape.
    """

    values: tf.Tensor
    indices: tf.Tensor
    sizes: tf.Tensor
    new_residual: tf.Tensor


def _check_segment_sizes(segment_sizes: Sequence[int]) -> list[int]:
    if isinstance(segment_sizes, (str, bytes, tf.Tensor)) or not isinstance(
        segment_sizes, (Sequence, np.ndarray)
    ):
        raise TypeError(
            "`segment_sizes` must be a list of Python ints (the number of "
            "elements of each fused tensor, known while tracing). "
            f"Received: segment_sizes={segment_sizes!r}"
        )
    sizes = []
    for i, n in enumerate(segment_sizes):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(
                "`segment_sizes` must be a list of Python ints. Received: "
                f"segment_sizes[{i}]={n!r}"
            )
        if not 0 <= n <= _MAX_SEGMENT:
            raise ValueError(
                "`segment_sizes` must be in [0, 2^31 - 1] (int32 indices); "
                "split a larger tensor into several segments. Received: "
                f"segment_sizes[{i}]={n}"
            )
        sizes.append(int(n))
    return sizes


def _check_inputs(x, k, seeds, sizes: list[int], residual) -> np.ndarray | None:
    """Checks what is known while tracing; returns k's value if known."""
    total = sum(sizes)
    if x.shape.is_fully_defined() and x.shape.num_elements() != total:
        raise ValueError(
            "`segment_sizes` must add up to the number of elements of `x` "
            "(one size per tensor fused into x, in order). Received: "
            f"sum(segment_sizes)={total}, x.shape={x.shape}"
        )
    if residual is not None and not x.shape.is_compatible_with(residual.shape):
        raise ValueError(
            "`residual` must have x's shape. Received: "
            f"x.shape={x.shape}, residual.shape={residual.shape}"
        )
    for name, t in (("k", k), ("seeds", seeds)):
        if t.shape.rank is not None and (
            t.shape.rank != 1
            or (t.shape[0] is not None and t.shape[0] != len(sizes))
        ):
            raise ValueError(
                f"`{name}` must be a vector with one entry per segment "
                f"(len(segment_sizes)={len(sizes)}). Received: "
                f"{name}.shape={t.shape}"
            )
    k_value = tf.get_static_value(k)
    if k_value is None:
        return None
    for i, (ki, n) in enumerate(zip(k_value.tolist(), sizes)):
        if not 0 <= ki <= n:
            raise ValueError(
                "`k[i]` must be in [0, segment_sizes[i]]. Received: "
                f"k[{i}]={ki}, segment_sizes[{i}]={n}"
            )
    return k_value


def top_k_sample_segments(
    x: tf.Tensor,
    k: Sequence[int] | tf.Tensor,
    seeds: Sequence[int] | tf.Tensor,
    segment_sizes: Sequence[int],
    mode: str = "mstopk",
    rounds: int = 20,
    residual: tf.Tensor | None = None,
) -> SegmentSelection | SegmentSelectionWithResidual:
    """`top_k_sample` of every segment of the flattened `x`, in one op.

    Segment i is the next `segment_sizes[i]` elements of the flattened `x`;
    its selection is exactly `top_k_sample(segment, k[i], mode, rounds,
    seeds[i])`: the same values and indices (counted from the segment's
    start), in either build.

    Args:
        x: float32, float16 or bfloat16 tensor (flattened), the fused
            tensors one after another.
        k: [S] int32 or int64: the number of elements of each segment, k[i]
            in [0, segment_sizes[i]].
        seeds: [S] int64: each segment's seed (MSTopK's band slice).
        segment_sizes: S Python ints in [0, 2^31 - 1], adding up to x's
            size (known while tracing: they are an attribute of the op).
        mode: "mstopk", "threshold" or "trimmed", as in `top_k_sample`.
        rounds: bisection rounds, in [1, 64].
        residual: optional error-feedback residual of x's shape; the
            selection is then made from acc = x + residual.

    Returns:
        `SegmentSelection(values, indices, sizes)`, or with `residual`
        `SegmentSelectionWithResidual(..., new_residual)`: acc with the
        selected entries zeroed. Segment i's entries are
        values[o:o + sizes[i]], o = sum(sizes[:i]).

    Raises:
        TypeError: `segment_sizes` is not a list of ints, or x's dtype is
            not float32, float16 or bfloat16.
        ValueError: bad mode, rounds or segment sizes; sizes that do not
            add up to x's size, k or seeds not of length S, or a k[i]
            outside [0, segment_sizes[i]], when known while tracing; while
            XLA compiles the graph, mode "threshold" or a k known only at
            run time.
        tf.errors.InvalidArgumentError: the same, found at run time.
    """
    x = tf.convert_to_tensor(x)
    _check_args(x, mode, rounds)
    sizes = _check_segment_sizes(segment_sizes)
    k = _as_index(k)
    seeds = tf.cast(seeds, tf.int64)
    if residual is not None:
        residual = tf.convert_to_tensor(residual, dtype=x.dtype)
    _check_inputs(x, k, seeds, sizes, residual)
    lib = _library.custom_ops()
    if lib is None:
        return top_k_sample_segments_reference(
            x, k, seeds, sizes, mode, rounds, residual
        )
    attrs = dict(segment_sizes=sizes, mode=mode, rounds=rounds)
    if residual is None:
        return SegmentSelection(
            *lib.tfgc_top_k_sample_segments(x, k, seeds, **attrs)
        )
    return SegmentSelectionWithResidual(
        *lib.tfgc_top_k_sample_segments_with_residual(
            x, residual, k, seeds, **attrs
        )
    )


def top_k_sample_segments_reference(
    x: tf.Tensor,
    k: Sequence[int] | tf.Tensor,
    seeds: Sequence[int] | tf.Tensor,
    segment_sizes: Sequence[int],
    mode: str = "mstopk",
    rounds: int = 20,
    residual: tf.Tensor | None = None,
) -> SegmentSelection | SegmentSelectionWithResidual:
    """Pure-TensorFlow `top_k_sample_segments`: same arguments, same results.

    `top_k_sample_reference` on each segment in turn.
    """
    x = tf.convert_to_tensor(x)
    _check_args(x, mode, rounds)
    sizes = _check_segment_sizes(segment_sizes)
    k = _as_index(k)
    seeds = tf.cast(seeds, tf.int64)
    if residual is not None:
        residual = tf.convert_to_tensor(residual, dtype=x.dtype)
    k_value = _check_inputs(x, k, seeds, sizes, residual)
    if mode == "threshold":
        _library.refuse_xla(
            "tfgc.ops.top_k_sample_segments(mode='threshold') selects a "
            "number of elements that depends on the data"
        )
    elif k_value is None:
        _library.refuse_xla(
            "tfgc.ops.top_k_sample_segments with k known only at run time "
            "returns that many elements"
        )
    acc = x if residual is None else x + residual
    flat = tf.reshape(acc, [-1])
    bounds = tf.constant(sizes, tf.int64)
    k64 = tf.cast(k, tf.int64)
    checks = _checks.independent(
        lambda: [
            tf.debugging.assert_equal(
                tf.size(flat, out_type=tf.int64),
                tf.constant(sum(sizes), tf.int64),
                message="`segment_sizes` must add up to the number of elements "
                "of `x`",
            ),
            tf.debugging.assert_equal(
                tf.shape(k)[0],
                len(sizes),
                message="`k` must be a vector with one entry per segment",
            ),
            tf.debugging.assert_equal(
                tf.shape(seeds)[0],
                len(sizes),
                message="`seeds` must be a vector with one entry per segment",
            ),
        ]
    )
    with tf.control_dependencies(checks):
        k64 = tf.identity(k64)
    checks = _checks.independent(
        lambda: [
            tf.debugging.assert_non_negative(
                k64, message="`k[i]` must be in [0, segment_sizes[i]]"
            ),
            tf.debugging.assert_less_equal(
                k64, bounds, message="`k[i]` must be in [0, segment_sizes[i]]"
            ),
        ]
    )
    with tf.control_dependencies(checks):
        flat = tf.identity(flat)
    values, indices, counts, starts = [], [], [], []
    offset = 0
    for i, n in enumerate(sizes):
        ki = int(k_value[i]) if k_value is not None else k64[i]
        v, idx = top_k_sample_reference(
            flat[offset : offset + n], ki, mode, rounds, seeds[i]
        )
        values.append(v)
        indices.append(idx)
        counts.append(tf.size(idx, out_type=tf.int64))
        starts.append(tf.cast(idx, tf.int64) + offset)
        offset += n
    if not sizes:
        values, indices = [tf.zeros([0], x.dtype)], [tf.zeros([0], tf.int32)]
        counts, starts = [], [tf.zeros([0], tf.int64)]
    selection = SegmentSelection(
        tf.concat(values, 0),
        tf.concat(indices, 0),
        tf.stack(counts) if counts else tf.zeros([0], tf.int64),
    )
    if residual is None:
        return selection
    where = tf.concat(starts, 0)[:, None]
    new_residual = tf.tensor_scatter_nd_update(
        flat, where, tf.zeros_like(selection.values)
    )
    return SegmentSelectionWithResidual(
        *selection, tf.reshape(new_residual, tf.shape(x))
    )
