"""Golomb-Rice position coding in pure TensorFlow: the format, and the
encoder and decoder that are the test oracle of the compiled
`Tfgc>GolombEncode` / `Tfgc>GolombDecode` ops (`tfgc.ops.golomb`).

Format:

* Gaps: gap_0 = idx_0, gap_j = idx_j - idx_{j-1} - 1 (the first gap is
  taken from position -1, so every gap is >= 0 for sorted unique indices).
* Each gap is coded with parameter M = 2^b as q = gap >> b one bits, a
  terminating zero bit, then the remainder r = gap & (M - 1) in b bits,
  most significant bit first. A code takes q + 1 + b bits.
* Bit i of the stream is bit 7 - (i % 8) of byte i // 8 (MSB first within
  bytes); the last byte is zero-padded. `encoded` has exactly
  ceil(num_bits / 8) bytes.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfgc.ops import _checks, _library

MAX_B = 31
# Largest stream the encoders write (4 GiB), as in golomb_kernels.cc.
MAX_ENCODED_BITS = 2**35
_INT_TYPES = (int, np.integer)


def _static_int(x: int | tf.Tensor) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, _INT_TYPES):
        return int(x)
    value = tf.get_static_value(x)
    if value is None or np.ndim(value) != 0:
        return None
    return int(value)


def _b_range_checks(b: tf.Tensor) -> list:
    """The run-time checks of the pure-TF references that b is in range."""
    message = f"`b` must be in [0, {MAX_B}]"
    return [
        tf.debugging.assert_greater_equal(b, 0, message=message),
        tf.debugging.assert_less_equal(b, MAX_B, message=message),
    ]


def _encode_reference(
    indices: tf.Tensor, n: tf.Tensor, b: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    _library.refuse_xla(
        "tfgc.ops.golomb_encode writes a stream whose length depends on "
        "the data"
    )
    idx = tf.cast(indices, tf.int64)
    checks = _checks.independent(
        lambda: [
            tf.debugging.assert_rank(n, 0, message="`n` must be a scalar"),
            tf.debugging.assert_rank(b, 0, message="`b` must be a scalar"),
            tf.debugging.assert_non_negative(n, message="`n` must be >= 0"),
            *_b_range_checks(b),
        ]
    )
    with tf.control_dependencies(checks):
        prev = tf.concat([tf.constant([-1], tf.int64), idx], 0)[:-1]
        gaps = idx - prev - 1
    checks = _checks.independent(
        lambda: [
            tf.debugging.assert_non_negative(
                gaps,
                message="`indices` must be strictly increasing (sorted, no "
                "duplicates) and >= 0",
            ),
            tf.debugging.assert_less(
                idx, n, message="`indices` must be in [0, n)"
            ),
        ]
    )
    with tf.control_dependencies(checks):
        b64 = tf.cast(b, tf.int64)
        q = tf.bitwise.right_shift(gaps, b64)
        r = tf.bitwise.bitwise_and(
            gaps, tf.bitwise.left_shift(tf.constant(1, tf.int64), b64) - 1
        )
    lengths = q + 1 + b64
    starts = tf.cumsum(lengths, exclusive=True)
    num_bits = tf.reduce_sum(lengths)
    with tf.control_dependencies(
        _checks.independent(
            lambda: [
                tf.debugging.assert_less_equal(
                    num_bits,
                    tf.constant(MAX_ENCODED_BITS, tf.int64),
                    message="The Golomb stream would exceed "
                    f"{MAX_ENCODED_BITS} bits; use a larger `b` "
                    "(golomb_optimal_b(k, n))",
                )
            ]
        )
    ):
        num_bits = tf.identity(num_bits)
    # Unary parts: +1 at each code's start, -1 where its ones end.
    marks = tf.scatter_nd(
        tf.concat([starts, starts + q], 0)[:, None],
        tf.concat([tf.ones_like(q), -tf.ones_like(q)], 0),
        num_bits[None] + 1,
    )
    ones = tf.cumsum(marks)[:-1] > 0
    # Remainders: bit t (MSB first) of r at starts + q + 1 + t.
    t = tf.range(b64, dtype=tf.int64)
    rem_bits = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(r[:, None], b64 - 1 - t[None, :]), 1
    )
    rem_pos = (starts + q + 1)[:, None] + t[None, :]
    rem = tf.scatter_nd(
        tf.reshape(rem_pos, [-1, 1]),
        tf.reshape(rem_bits, [-1]),
        num_bits[None],
    )
    bits = tf.cast(ones, tf.int64) + rem
    num_bytes = (num_bits + 7) // 8
    bits = tf.pad(bits, [[0, num_bytes * 8 - num_bits]])
    weights = tf.constant([128, 64, 32, 16, 8, 4, 2, 1], tf.int64)
    encoded = tf.reduce_sum(tf.reshape(bits, [-1, 8]) * weights, axis=1)
    return tf.cast(encoded, tf.uint8), num_bits


def _decode_reference(
    encoded: tf.Tensor, k: tf.Tensor, b: tf.Tensor, n: tf.Tensor
) -> tf.Tensor:
    _library.refuse_xla(
        "tfgc.ops.golomb_decode reads codes whose lengths depend on the data"
    )
    k_value = _static_int(k)
    k = tf.cast(k, tf.int64)

    def build():
        checks = [
            tf.debugging.assert_rank(k, 0, message="`k` must be a scalar"),
            tf.debugging.assert_rank(b, 0, message="`b` must be a scalar"),
            tf.debugging.assert_rank(n, 0, message="`n` must be a scalar"),
            tf.debugging.assert_non_negative(k, message="`k` must be >= 0"),
            *_b_range_checks(b),
        ]
        with tf.control_dependencies(checks):
            num_bits = 8 * tf.size(encoded, out_type=tf.int64)
            # Every code takes at least 1 + b bits.
            return [
                tf.debugging.assert_less_equal(
                    k,
                    num_bits // (1 + tf.cast(b, tf.int64)),
                    message="`encoded` is too short for k codes: the stream "
                    "is truncated or was encoded with another k or b",
                )
            ]

    with tf.control_dependencies(_checks.independent(build)):
        k = tf.identity(k)
    # The branch checks the stream: `_checks.cond` keeps it unchained.
    positions = _checks.cond(
        k > 0,
        lambda: _decode_positions(encoded, k, tf.cast(b, tf.int64), n),
        lambda: tf.zeros([0], tf.int32),
    )
    if k_value is not None and k_value >= 0:
        positions = tf.ensure_shape(positions, [k_value])
    return positions


def _decode_positions(
    encoded: tf.Tensor, k: tf.Tensor, b: tf.Tensor, n: tf.Tensor
) -> tf.Tensor:
    """The k positions; k > 0. Vectorized over the bits of the stream.

    next(i) = (first zero bit at or after i) + 1 + b is where the next code
    starts if one starts at bit i (L + 1, "invalid", when that code does
    not fit in the L bits). The code starts are 0, next(0), next(next(0)),
    ...; they are computed by pointer doubling in ceil(log2(k + 1)) rounds.
    """
    shifts = tf.constant([7, 6, 5, 4, 3, 2, 1, 0], tf.int64)
    bits = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(tf.cast(encoded, tf.int64)[:, None], shifts), 1
    )
    bits = tf.reshape(bits, [-1])
    num_bits = tf.size(bits, out_type=tf.int64)
    invalid = num_bits + 1
    zeros = tf.reshape(tf.where(tf.equal(bits, 0)), [-1])
    sites = tf.range(num_bits + 2, dtype=tf.int64)
    found = tf.searchsorted(zeros, sites, side="left", out_type=tf.int64)
    next_zero = tf.gather(tf.concat([zeros, [invalid]], 0), found)
    nxt = next_zero + 1 + b
    nxt = tf.where((next_zero >= num_bits) | (nxt > num_bits), invalid, nxt)
    # Invalid stays invalid.
    nxt = tf.tensor_scatter_nd_update(nxt, [[num_bits + 1]], [invalid])

    def cond(starts, jump):
        del jump
        return tf.size(starts, out_type=tf.int64) < k + 1

    def body(starts, jump):
        return tf.concat([starts, tf.gather(jump, starts)], 0), tf.gather(
            jump, jump
        )

    starts, _ = tf.while_loop(
        cond,
        body,
        (tf.zeros([1], tf.int64), nxt),
        shape_invariants=(tf.TensorShape([None]), nxt.shape),
    )
    starts = starts[: k + 1]
    truncated = _checks.independent(
        lambda: [
            tf.debugging.assert_less_equal(
                starts[-1],
                num_bits,
                message="`encoded` ends inside one of the first k codes: the "
                "stream is truncated or was encoded with another k or b",
            )
        ]
    )
    with tf.control_dependencies(truncated):
        starts = tf.identity(starts[:-1])
    stops = tf.gather(next_zero, starts)
    q = stops - starts
    limit = tf.constant(2**31, tf.int64)
    limit = tf.where(n >= 0, tf.minimum(n, limit), limit)
    message = (
        "decoded positions leave [0, n) or int32: wrong b or corrupt stream"
    )
    in_range = _checks.independent(
        lambda: [
            tf.debugging.assert_less_equal(
                q, tf.bitwise.right_shift(limit, b), message=message
            )
        ]
    )
    with tf.control_dependencies(in_range):
        q = tf.identity(q)
    t = tf.range(b, dtype=tf.int64)
    rem_bits = tf.gather(bits, (stops + 1)[:, None] + t[None, :])
    r = tf.reduce_sum(
        tf.bitwise.left_shift(rem_bits, b - 1 - t[None, :]), axis=1
    )
    gaps = tf.bitwise.left_shift(q, b) + r
    positions = tf.cumsum(gaps + 1) - 1
    in_range = _checks.independent(
        lambda: [
            tf.debugging.assert_less(positions[-1], limit, message=message)
        ]
    )
    with tf.control_dependencies(in_range):
        return tf.cast(positions, tf.int32)
