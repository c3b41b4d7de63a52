"""Golomb-Rice position coding (SBC; docs/algorithms.md).

`golomb_encode` / `golomb_decode` run the compiled `Tfgc>GolombEncode` /
`Tfgc>GolombDecode` ops when the custom-op library is loaded and their
`*_reference` twins (pure TensorFlow, the test oracle) otherwise; both write
the same bytes.

The format is in `tfgc/ops/golomb_reference.py`.

b* = 1 + floor(log2(ln(phi - 1) / ln(1 - q))), q = k / n, phi the golden
ratio, clamped to [0, 31] (Sattler et al., SBC, arXiv 1805.08768), and
expected bits per position b* + 1 / (1 - (1 - q)^(2^b*)) for independent
positions: 8.11 bits at q = 0.01 (b* = 6), 11.5 at q = 0.001 (b* = 9).
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfgc.ops import _library
from tfgc.ops.golomb_reference import (
    _INT_TYPES,
    MAX_B,
    _decode_reference,
    _encode_reference,
    _static_int,
)

_PHI = (1.0 + math.sqrt(5.0)) / 2.0
_LN_PHI_MINUS_1 = math.log(_PHI - 1.0)


def _custom_op(name: str):
    """The compiled op, or None (no library, or one built without it)."""
    lib = _library.custom_ops()
    return None if lib is None else getattr(lib, name, None)


def _check_kn(k: int, n: int) -> None:
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, _INT_TYPES):
            raise TypeError(f"`{name}` must be an int. Received: {name}={v!r}")
    if not 0 <= k <= n:
        raise ValueError(
            f"`k` and `n` must satisfy 0 <= k <= n. Received: k={k}, n={n}"
        )


def golomb_optimal_b(k: int, n: int) -> int:
    """SBC's Golomb-Rice parameter b* for k positions out of n.

    b* = 1 + floor(log2(ln(phi - 1) / ln(1 - q))) with q = k / n, clamped
    to [0, 31]; 0 when k = 0 (nothing is coded) or k = n.

    Args:
        k: number of positions, 0 <= k <= n.
        n: number of elements they are taken from.

    Returns:
        b* as a Python int.

    Raises:
        TypeError: k or n is not an int.
        ValueError: not 0 <= k <= n.
    """
    _check_kn(k, n)
    if k == 0 or k == n:
        return 0
    ratio = _LN_PHI_MINUS_1 / math.log1p(-k / n)
    # 1 + floor(log2(ratio)) = the number of t >= 0 with 2^t <= ratio;
    # counted exactly (no log2 rounding), as `golomb_optimal_b_tensor` does.
    return sum(1 for t in range(MAX_B) if 2.0**t <= ratio)


def golomb_expected_bits_per_position(k: int, n: int) -> float:
    """Expected bits per position with b = b*: b* + 1 / (1 - (1 - q)^2^b*).

    Exact for positions that are independent with probability q = k / n
    each (geometric gaps); 0.0 when k = 0.

    Args:
        k: number of positions, 0 <= k <= n.
        n: number of elements they are taken from.

    Returns:
        Expected bits per coded position, a Python float.
    """
    _check_kn(k, n)
    if k == 0:
        return 0.0
    b = golomb_optimal_b(k, n)
    q = k / n
    return b + 1.0 / (1.0 - (1.0 - q) ** (2**b))


def max_encoded_bytes(k: int, n: int, b: int) -> int:
    """Upper bound on the bytes `golomb_encode` writes for k positions in n.

    The gaps sum to at most n - k, so the quotients sum to at most
    (n - k) >> b: bits <= k * (b + 1) + ((n - k) >> b). Use it to size a
    static buffer; `golomb_decode` ignores trailing bytes.

    Args:
        k: number of positions, 0 <= k <= n.
        n: number of elements they are taken from.
        b: Golomb-Rice parameter in [0, 31].

    Returns:
        ceil(bound / 8) as a Python int.
    """
    _check_kn(k, n)
    _check_static_b(b)
    if k == 0:
        return 0
    bits = k * (b + 1) + ((n - k) >> b)
    return -(-bits // 8)


def _check_static_b(b: int) -> None:
    if isinstance(b, bool) or not isinstance(b, _INT_TYPES):
        raise TypeError(f"`b` must be an int. Received: b={b!r}")
    if not 0 <= b <= MAX_B:
        raise ValueError(f"`b` must be in [0, {MAX_B}]. Received: b={b}")


def _check_indices(indices: tf.Tensor) -> tf.Tensor:
    indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
        raise TypeError(
            "`indices` must be int32 or int64. "
            f"Received: dtype={indices.dtype.name}"
        )
    if indices.shape.rank is not None and indices.shape.rank != 1:
        raise ValueError(
            f"`indices` must be a vector. Received: shape={indices.shape}"
        )
    return indices


def golomb_optimal_b_tensor(
    k: int | tf.Tensor, n: int | tf.Tensor
) -> tf.Tensor:
    """`golomb_optimal_b` in the graph, for k or n known only at run time.

    Same float64 arithmetic and exact power-of-two comparisons as the
    Python version, so both give the same b* for the same k and n.

    Args:
        k: number of positions (int or integer scalar tensor).
        n: number of elements (int or integer scalar tensor).

    Returns:
        int32 scalar tensor b* in [0, 31] (0 when k = 0 or k >= n).
    """
    k = tf.convert_to_tensor(k)
    n = tf.convert_to_tensor(n)
    kf = tf.cast(k, tf.float64)
    nf = tf.cast(n, tf.float64)
    q = kf / tf.maximum(nf, 1.0)
    ratio = _LN_PHI_MINUS_1 / tf.math.log1p(-q)
    powers = tf.constant([2.0**t for t in range(MAX_B)], tf.float64)
    b = tf.reduce_sum(tf.cast(powers <= ratio, tf.int32))
    valid = (k > 0) & (kf < nf)
    return tf.where(valid, b, 0)


def _encode_args(
    indices: tf.Tensor, n: int | tf.Tensor, b: int | tf.Tensor | None
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    indices = _check_indices(indices)
    n_t = tf.cast(n, tf.int64)
    if b is None:
        k_static, n_static = indices.shape[0], _static_int(n)
        if k_static is not None and n_static is not None:
            if 0 <= k_static <= n_static:
                b = golomb_optimal_b(k_static, n_static)
            else:  # invalid; the op reports it with the values
                b = 0
        else:
            b = golomb_optimal_b_tensor(
                tf.size(indices, out_type=tf.int64), n_t
            )
    b_t = tf.cast(b, tf.int32)
    return indices, n_t, b_t


def golomb_encode(
    indices: tf.Tensor, n: int | tf.Tensor, b: int | tf.Tensor | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Golomb-Rice codes sorted, unique positions (format: module docstring).

    Args:
        indices: int32 or int64 vector of k strictly increasing positions in
            [0, n).
        n: number of elements the positions index (int or int64 scalar).
        b: Golomb-Rice parameter in [0, 31]; None for b* =
            `golomb_optimal_b(k, n)` (computed in the graph when k or n is
            known only at run time). The decoder needs the same b.

    Returns:
        (encoded, num_bits): uint8 vector of exactly ceil(num_bits / 8)
        bytes (its length is dynamic), and the int64 scalar bit count.

    Raises:
        tf.errors.InvalidArgumentError: indices unsorted, duplicated or
            outside [0, n), n < 0 or b outside [0, 31] (eager and in
            tf.function).
        TypeError: indices not int32/int64.
        ValueError: indices not a vector, or XLA compiles the graph
            (`jit_compile=True`): the stream's length depends on the data.
    """
    indices, n_t, b_t = _encode_args(indices, n, b)
    op = _custom_op("tfgc_golomb_encode")
    if op is None:
        return _encode_reference(indices, n_t, b_t)
    encoded, num_bits = op(indices, n_t, b_t)
    return encoded, num_bits


def golomb_encode_reference(
    indices: tf.Tensor, n: int | tf.Tensor, b: int | tf.Tensor | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Pure-TF `golomb_encode`: same arguments, same bytes."""
    return _encode_reference(*_encode_args(indices, n, b))


def _decode_args(
    encoded: tf.Tensor, k: int | tf.Tensor, b: int | tf.Tensor, n
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    encoded = tf.convert_to_tensor(encoded)
    if encoded.dtype != tf.uint8:
        raise TypeError(
            f"`encoded` must be uint8. Received: dtype={encoded.dtype.name}"
        )
    if encoded.shape.rank is not None and encoded.shape.rank != 1:
        raise ValueError(
            f"`encoded` must be a vector. Received: shape={encoded.shape}"
        )
    k_t = tf.convert_to_tensor(k)
    if k_t.dtype not in (tf.int32, tf.int64):
        k_t = tf.cast(k_t, tf.int64)
    b_t = tf.cast(b, tf.int32)
    n_t = tf.cast(-1 if n is None else n, tf.int64)
    return encoded, k_t, b_t, n_t


def golomb_decode(
    encoded: tf.Tensor,
    k: int | tf.Tensor,
    b: int | tf.Tensor,
    n: int | tf.Tensor | None = None,
) -> tf.Tensor:
    """Decodes the first k positions of a `golomb_encode` stream.

    Args:
        encoded: uint8 vector; bytes after the k-th code are ignored (so a
            buffer of `max_encoded_bytes` works).
        k: number of positions to decode (int or int32/int64 scalar).
        b: the Golomb-Rice parameter the stream was encoded with.
        n: optional bound: decoded positions must be < n. Positions must
            fit in int32 in any case.

    Returns:
        int32 vector [k] of strictly increasing positions.

    Raises:
        tf.errors.InvalidArgumentError: the stream ends inside one of the
            first k codes, a position leaves [0, n) or int32, k < 0 or b
            outside [0, 31] (eager and in tf.function).
        ValueError: while XLA compiles the graph (`jit_compile=True`).
    """
    encoded, k_t, b_t, n_t = _decode_args(encoded, k, b, n)
    op = _custom_op("tfgc_golomb_decode")
    if op is None:
        return _decode_reference(encoded, k_t, b_t, n_t)
    return op(encoded, k_t, b_t, n_t)


def golomb_decode_reference(
    encoded: tf.Tensor,
    k: int | tf.Tensor,
    b: int | tf.Tensor,
    n: int | tf.Tensor | None = None,
) -> tf.Tensor:
    """Pure-TF `golomb_decode`: same arguments, same results."""
    return _decode_reference(*_decode_args(encoded, k, b, n))
