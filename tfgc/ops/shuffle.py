"""Stateless index shuffle: where i goes in a permutation of [0, max_index].

`index_shuffle` gives the same positions as TensorFlow's
`tf.random.experimental.index_shuffle` (op `RandomIndexShuffle`) for the
same seed, bit for bit. That op has a CPU kernel only and no XLA kernel, so
while XLA compiles the graph (`tfgc.ops.compiling_with_xla`) the
pure-TensorFlow `index_shuffle_reference` runs instead; both agree, so the
workers choose the same positions whichever path each of them takes.

The permutation (TensorFlow's): a Simon block cipher of 4 rounds on blocks
of 2W bits, 2W = max(16, ceil(log2(max_index)) rounded up to even), keyed by
three 32-bit words [498247692, seed[0], seed[1]] (each seed word taken
mod 2^32), applied repeatedly until the result is <= max_index (cycle
walking). Word operations, on W-bit words: rotl(x, r), and the round
function f(x) = (rotl(x, 1) & rotl(x, 8)) ^ rotl(x, 2). With round keys
k0..k3 (k0..k2 the key words mod 2^W, k3 = c ^ 1 ^ k0 ^ rotr(k2, 3) ^
rotr(k2, 4), c = 0xfffffffc mod 2^W), one encryption of (l, r) (high and
low halves) is l ^= f(r) ^ k0; r ^= f(l) ^ k1; l ^= f(r) ^ k2;
r ^= f(l) ^ k3. When max_index = 2^m with m even and >= 16, the block has
only m bits: the op reads index max_index as 0 (both get the same
position, and one position is never given), and so does the reference.
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfgc.ops import _library

#: The first key word, which `tf.random.experimental.index_shuffle` puts
#: before the two seed words.
KEY_PREFIX = 498247692
_ROUNDS = 4
_MIN_BLOCK_BITS = 16
_C = 0xFFFFFFFC


def block_bits(max_index: int) -> int:
    """Bits of the cipher's block for `max_index` (even, >= 16)."""
    bits = math.ceil(math.log2(max_index)) if max_index > 0 else 0
    return max(bits + bits % 2, _MIN_BLOCK_BITS)


def _check(index: tf.Tensor, max_index) -> int:
    if index.dtype not in (tf.int32, tf.int64):
        raise TypeError(
            f"`index` must be int32 or int64. Received: dtype={index.dtype}"
        )
    value = tf.get_static_value(max_index)
    if value is None or getattr(value, "ndim", 0) != 0:
        raise ValueError(
            "`max_index` must be a Python int or a constant scalar. "
            f"Received: max_index={max_index!r}"
        )
    value = int(value)
    if not 0 <= value < 2**62:
        raise ValueError(
            f"`max_index` must be in [0, 2^62). Received: max_index={value}"
        )
    return value


def index_shuffle(
    index: tf.Tensor, seed: tf.Tensor, max_index: int
) -> tf.Tensor:
    """The position of each `index` in a permutation of [0, max_index].

    For one seed and max_index the map is a bijection of [0, max_index]
    (module docstring): tf.range(k) gives k distinct positions.

    Args:
        index: int32 or int64 tensor, values in [0, max_index].
        seed: integer tensor of shape [2]; the same seed, the same
            permutation on every device and worker.
        max_index: the largest position, a Python int in [0, 2^62).

    Returns:
        tensor of `index`'s shape and dtype.
    """
    index = tf.convert_to_tensor(index)
    max_index = _check(index, max_index)
    if _library.compiling_with_xla():
        return index_shuffle_reference(index, seed, max_index)
    return tf.random.experimental.index_shuffle(
        index, seed=seed, max_index=tf.cast(max_index, index.dtype)
    )


def index_shuffle_reference(
    index: tf.Tensor, seed: tf.Tensor, max_index: int
) -> tf.Tensor:
    """Pure-TF `index_shuffle`: same arguments, same positions."""
    index = tf.convert_to_tensor(index)
    max_index = _check(index, max_index)
    out_dtype = index.dtype
    if max_index == 0:
        return tf.zeros_like(index)
    w = block_bits(max_index) // 2
    mask = (1 << w) - 1
    xor, and_ = tf.bitwise.bitwise_xor, tf.bitwise.bitwise_and

    def rotl(x, r):
        spun = tf.bitwise.bitwise_or(
            tf.bitwise.left_shift(x, r), tf.bitwise.right_shift(x, w - r)
        )
        return and_(spun, mask)

    def f(x):
        return xor(and_(rotl(x, 1), rotl(x, 8)), rotl(x, 2))

    seed = and_(tf.cast(seed, tf.int64), 0xFFFFFFFF)
    words = [tf.constant(KEY_PREFIX, tf.int64), seed[0], seed[1]]
    keys = [and_(word, mask) for word in words]
    # rotr(x, r) = rotl(x, w - r).
    rotated = xor(rotl(keys[2], w - 3), rotl(keys[2], w - 4))
    keys.append(xor(xor(keys[0], (_C & mask) ^ 1), rotated))

    def encrypt(v):
        left = and_(tf.bitwise.right_shift(v, w), mask)
        right = and_(v, mask)
        for i in range(0, _ROUNDS, 2):
            left = xor(xor(left, f(right)), keys[i])
            right = xor(xor(right, f(left)), keys[i + 1])
        return tf.bitwise.bitwise_or(tf.bitwise.left_shift(left, w), right)

    index = tf.cast(index, tf.int64)
    if w == _MIN_BLOCK_BITS // 2:
        return tf.cast(_walk_table(encrypt, w, max_index, index), out_dtype)
    # Cycle walking: encrypt again wherever the result is out of range. The
    # block holds fewer than 4 (max_index + 1) values, so a few rounds do.
    walked = tf.while_loop(
        lambda v: tf.reduce_any(v > max_index),
        lambda v: [tf.where(v > max_index, encrypt(v), v)],
        [encrypt(index)],
    )[0]
    return tf.cast(walked, out_dtype)


def _walk_table(encrypt, w: int, max_index: int, index: tf.Tensor):
    """Cycle walking for the smallest block, by pointer doubling.

    A small max_index can take thousands of encryptions to walk back into
    range, so instead every value of the block is walked at once: after
    round j, hop[v] is the first of enc(v), ..., enc^(2^j)(v) that is <=
    max_index, or enc^(2^j)(v) if none is. 2w rounds cover every cycle.
    """
    hop = encrypt(tf.range(1 << (2 * w), dtype=tf.int64))
    for _ in range(2 * w):
        hop = tf.where(hop > max_index, tf.gather(hop, hop), hop)
    # An index beyond the block is read modulo its size, as TensorFlow does.
    return tf.gather(hop, tf.bitwise.bitwise_and(index, (1 << (2 * w)) - 1))
