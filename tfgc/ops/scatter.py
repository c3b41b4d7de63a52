"""Dense sum of sparse (index, value) pairs.

The decompression of sparse payloads all-gathered from p workers: out[j] is
the sum of every value whose index is j, zero where none is. `scatter_add_sum`
runs the compiled `Tfgc>ScatterAddSum` when the custom-op library has it and
`scatter_add_sum_reference` (pure TensorFlow, the test oracle) otherwise.

Half and bfloat16 values are summed in float32 and rounded once, so the
result is the exact sum rounded to the output type up to float32's error.
TensorFlow's own scatter ops (`tf.math.unsorted_segment_sum`,
`tf.tensor_scatter_nd_add`, `tf.scatter_nd`) round after every addition in
those types: 1.0 plus a thousand times 2^-12 sums to 1.0 in float16 there,
to 1.244 here.

Outside XLA every path adds each element's values in input order (worker
order for all-gathered payloads), left to right in a float32 sum starting
at +0, so every worker gets the same bits on every run. The CPU kernel does
so whatever the thread count (its result equals a serial loop's, bit for
bit) and zeroes and fills the output tile by tile from cache: on 25 M
elements, 3x to 15x faster than the fastest TF op and within 1.1x to 2.2x
of zero-filling the output (2 cores, `benchmarks/results/scatter_cpu.md`).
TensorFlow runs CPU kernels with float32 subnormals flushed to zero; the
CUDA kernel flushes them too and gives the CPU kernel's bits: it sorts the
values by index (a stable radix sort) and adds each element's run on one
thread, no atomics; it waits for the device to check the indices. The
reference uses `tf.math.unsorted_segment_sum` without a GPU (TF's CPU
kernel adds in input order) and `ordered_segment_sum` where TensorFlow sees
a GPU, whose `unsorted_segment_sum` adds with atomics in any order; under
XLA it is XLA's scatter, whose order on a GPU is XLA's.
"""

from __future__ import annotations

import warnings

import tensorflow as tf

from tfgc.ops import _checks, _library

FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)
_OP_NAME = "tfgc_scatter_add_sum"
_warned_missing = False


def _custom_op():
    """The compiled op, or None (no library, or one built without it)."""
    global _warned_missing
    lib = _library.custom_ops()
    if lib is None:
        return None
    op = getattr(lib, _OP_NAME, None)
    if op is None and not _warned_missing:
        _warned_missing = True
        warnings.warn(
            f"tfgc: the custom-op library {_library.LIBRARY_PATH} was built "
            "without Tfgc>ScatterAddSum; using the pure-TensorFlow "
            "reference. Rebuild it with `python -m custom_ops.build`.",
            RuntimeWarning,
            stacklevel=3,
        )
    return op


def _check_args(values, indices, n) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    values = tf.convert_to_tensor(values)
    indices = tf.convert_to_tensor(indices)
    if values.dtype not in FLOAT_DTYPES:
        raise TypeError(
            "`values` must be float32, float16 or bfloat16 (cast other "
            f"types first). Received: dtype={values.dtype.name}"
        )
    if indices.dtype != tf.int32:
        raise TypeError(
            f"`indices` must be int32. Received: dtype={indices.dtype.name}"
        )
    n = tf.convert_to_tensor(n)
    if n.dtype not in (tf.int32, tf.int64):
        raise TypeError(
            f"`n` must be an int32 or int64 scalar. Received: dtype="
            f"{n.dtype.name}"
        )
    _check_static_shapes(values, indices, n)
    return values, indices, n


def _gpu_visible() -> bool:
    return bool(tf.config.list_logical_devices("GPU"))


def _invalid(message: str) -> tf.errors.InvalidArgumentError:
    return tf.errors.InvalidArgumentError(None, None, message)


def _check_static_shapes(values, indices, n) -> None:
    """Raises what the kernels raise, for what is known before running."""
    for name, t in (("values", values), ("indices", indices)):
        if t.shape.rank is not None and t.shape.rank != 1:
            raise _invalid(
                f"`values` and `indices` must be vectors [m]. Received: "
                f"{name}.shape={t.shape}"
            )
    lengths = (values.shape[0], indices.shape[0])
    if None not in lengths and lengths[0] != lengths[1]:
        raise _invalid(
            "`values` and `indices` must have the same length. Received: "
            f"values.shape={values.shape}, indices.shape={indices.shape}"
        )
    if n.shape.rank is not None and n.shape.rank != 0:
        raise _invalid(f"`n` must be a scalar. Received: n.shape={n.shape}")
    n_static = tf.get_static_value(n)
    if n_static is not None and n_static < 0:
        raise _invalid(f"`n` must be non-negative. Received: n={n_static}")


def scatter_add_sum(
    values: tf.Tensor, indices: tf.Tensor, n: int | tf.Tensor
) -> tf.Tensor:
    """Dense vector of length n with every value added at its index.

    out[j] = sum of values[i] over every i with indices[i] == j (zero where
    no index points): duplicate indices, such as the same position sent by
    several workers, add up.

    Args:
        values: float32, float16 or bfloat16 vector [m].
        indices: int32 vector [m] of positions in [0, n).
        n: length of the output, a non-negative int or int32/int64 scalar.

    Returns:
        A vector [n] of `values`' dtype. float16 and bfloat16 are summed in
        float32 and rounded once.

    Raises:
        tf.errors.InvalidArgumentError: `values` or `indices` not a vector,
            their lengths differ, `n` not a scalar or negative, or an index
            outside [0, n) (the message names the first one and n); in
            eager mode and in tf.function alike (a tf.function traced with
            static shapes reports bad ranks and lengths when tracing, as
            ValueError from shape inference, with the compiled op). Under
            XLA (`jit_compile=True`) an index outside [0, n) is dropped.
        TypeError: a dtype other than those above.
    """
    values, indices, n = _check_args(values, indices, n)
    op = _custom_op()
    if op is None:
        return _reference(values, indices, n)
    return op(values, indices, n)


def scatter_add_sum_reference(
    values: tf.Tensor, indices: tf.Tensor, n: int | tf.Tensor
) -> tf.Tensor:
    """Pure-TF `scatter_add_sum`: same arguments, checks and result."""
    return _reference(*_check_args(values, indices, n))


def _reference(values: tf.Tensor, indices: tf.Tensor, n: tf.Tensor):
    n64 = tf.cast(n, tf.int64)
    if _library.compiling_with_xla():
        # XLA compiles no run-time check (nor the message's string ops);
        # there an index outside [0, n) is dropped.
        return _segment_sum(values, indices, n64)

    def build():
        shapes = [
            tf.debugging.assert_equal(
                tf.rank(values), 1, message="`values` must be a vector [m]"
            ),
            tf.debugging.assert_equal(
                tf.rank(indices), 1, message="`indices` must be a vector [m]"
            ),
            tf.debugging.assert_equal(
                tf.rank(n), 0, message="`n` must be a scalar"
            ),
        ]
        with tf.control_dependencies(shapes):
            sizes = [
                tf.debugging.assert_equal(
                    tf.size(values),
                    tf.size(indices),
                    message="`values` and `indices` must have the same length",
                ),
                tf.debugging.assert_non_negative(
                    n64, message="`n` must be non-negative"
                ),
            ]
        with tf.control_dependencies(sizes):
            positions = tf.cast(indices, tf.int64)
            bad = tf.logical_or(positions < 0, positions >= n64)
            ok = tf.logical_not(tf.reduce_any(bad))

        def describe():  # only run when an index is bad (so m > 0)
            first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
            return tf.strings.format(
                "`indices` must be in [0, n). "
                "Received: indices[{}]={} with n={}",
                (first, tf.gather(indices, first), n64),
            )

        message = tf.cond(ok, lambda: tf.constant(""), describe)
        return [tf.debugging.Assert(ok, [message])]

    with tf.control_dependencies(_checks.independent(build)):
        return _segment_sum(values, indices, n64)


def _segment_sum(values: tf.Tensor, indices: tf.Tensor, n: tf.Tensor):
    # Summing in float32 rounds half and bfloat16 once.
    dense = ordered_segment_sum(tf.cast(values, tf.float32), indices, n)
    return tf.cast(dense, values.dtype)


def ordered_segment_sum(
    values: tf.Tensor, segment_ids: tf.Tensor, num_segments: int | tf.Tensor
) -> tf.Tensor:
    """`tf.math.unsorted_segment_sum` of a vector, in input order everywhere.

    TensorFlow's CPU kernel adds each segment's values in input order, left
    to right from zero; its GPU kernel adds floats with atomics in an order
    the scheduler picks, so the last bits of a sum may change from run to
    run, and differ between the workers of a multi-worker job. Without a
    visible GPU, for integer values and under XLA (whose shapes cannot
    depend on the data; the order on a GPU is then XLA's), this is that
    op. Otherwise a stable sort by segment gives each value its rank in its
    segment, and round r adds every segment's value of rank r (a gather, no
    atomics): the CPU kernel's order on every device, in as many rounds as
    the most values one segment has (the number of workers for top-k
    payloads).

    Args:
        values: vector [m], summed in its own dtype.
        segment_ids: int32 or int64 vector [m] of segments in
            [0, num_segments).
        num_segments: length of the output.

    Returns:
        A vector [num_segments] of `values`' dtype.
    """
    values = tf.convert_to_tensor(values)
    segment_ids = tf.convert_to_tensor(segment_ids)
    if (
        not values.dtype.is_floating
        or _library.compiling_with_xla()
        or not _gpu_visible()
    ):
        return tf.math.unsorted_segment_sum(values, segment_ids, num_segments)
    order = tf.argsort(segment_ids, stable=True)
    ids = tf.gather(segment_ids, order)
    sorted_values = tf.gather(values, order)
    size = tf.size(ids)
    positions = tf.range(size)
    previous = tf.gather(ids, tf.maximum(positions - 1, 0))
    heads = tf.logical_or(tf.equal(positions, 0), tf.not_equal(ids, previous))
    starts = tf.boolean_mask(positions, heads)
    lengths = tf.concat([starts, [size]], 0)[1:] - starts
    rounds = tf.reduce_max(tf.concat([lengths, [0]], 0))
    last = tf.maximum(size - 1, 0)

    def more(rank, sums):
        del sums
        return rank < rounds

    def add_rank(rank, sums):
        value = tf.gather(sorted_values, tf.minimum(starts + rank, last))
        return rank + 1, tf.where(rank < lengths, sums + value, sums)

    _, sums = tf.while_loop(
        more,
        add_rank,
        (tf.constant(0), tf.zeros(tf.shape(starts), values.dtype)),
    )
    segments = tf.cast(num_segments, ids.dtype)
    return tf.tensor_scatter_nd_update(
        tf.zeros(tf.reshape(segments, [1]), values.dtype),
        tf.gather(ids, starts)[:, None],
        sums,
    )
