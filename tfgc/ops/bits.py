"""Bit packing: a boolean mask to 1 bit per element in int32 words.

Element 32 * j + i of the flattened mask is bit i (least significant first)
of word j; the last word is padded with zero bits. Each public function runs
the compiled `Tfgc>...` op when the custom-op library is loaded and its
`*_reference` twin (pure TensorFlow, the test oracle) otherwise.
"""

import tensorflow as tf

from tfgc.ops import _library

BITS_PER_WORD = 32


def num_words(n: int) -> int:
    """Number of int32 words holding n bits: ceil(n / 32)."""
    return -(-n // BITS_PER_WORD)


def _check_mask(mask: tf.Tensor) -> tf.Tensor:
    mask = tf.convert_to_tensor(mask)
    if mask.shape.rank != 1:  # an eager reshape costs as much as a 1M pack
        mask = tf.reshape(mask, [-1])
    if mask.dtype != tf.bool:
        raise TypeError(
            f"`mask` must be a boolean tensor. Received: dtype={mask.dtype}"
        )
    return mask


def _check_words(words: tf.Tensor, n: int) -> tf.Tensor:
    words = tf.convert_to_tensor(words)
    if words.dtype != tf.int32:
        raise TypeError(f"`words` must be int32. Received: dtype={words.dtype}")
    if words.shape[-1] != num_words(n):
        raise ValueError(
            f"`words` must have ceil(n / 32) = {num_words(n)} entries in its "
            f"last axis for n={n}. Received: shape={words.shape}"
        )
    return words


_SCALE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _check_scale_dtype(name: str, dtype: tf.DType) -> None:
    if tf.as_dtype(dtype) not in _SCALE_DTYPES:
        raise TypeError(
            f"`{name}` must be float32, float16 or bfloat16. "
            f"Received: {name}={tf.as_dtype(dtype).name}. Cast to float32 "
            "(the sums are accumulated in float32 anyway)."
        )


def _check_rows(words: tf.Tensor, n: int) -> tf.Tensor:
    words = _check_words(words, n)
    if words.shape.rank is not None and words.shape.rank != 2:
        raise ValueError(
            "`words` must be a matrix [p, ceil(n / 32)] of p packed rows. "
            f"Received: shape={words.shape}"
        )
    return words


def pack_bits(mask: tf.Tensor) -> tf.Tensor:
    """Packs a boolean tensor into int32 words, 32 elements per word.

    Element 32 * j + i of the flattened mask is bit i (least significant
    first) of word j; the last word is padded with zero bits.

    Args:
        mask: boolean tensor of any shape with a static number of elements.

    Returns:
        int32 tensor of shape [ceil(n / 32)].
    """
    mask = _check_mask(mask)
    lib = _library.custom_ops()
    if lib is None:
        return pack_bits_reference(mask)
    return lib.tfgc_pack_bits(mask)


def pack_bits_reference(mask: tf.Tensor) -> tf.Tensor:
    """Pure-TF `pack_bits` (GRACE-style shift-and-sum arithmetic)."""
    mask = _check_mask(mask)
    n = mask.shape[0]
    bits = tf.cast(mask, tf.int64)
    bits = tf.pad(bits, [[0, num_words(n) * BITS_PER_WORD - n]])
    bits = tf.reshape(bits, [-1, BITS_PER_WORD])
    shifts = tf.range(BITS_PER_WORD, dtype=tf.int64)
    words = tf.reduce_sum(tf.bitwise.left_shift(bits, shifts), axis=1)
    return tf.bitcast(tf.cast(words, tf.uint32), tf.int32)


def unpack_bits(words: tf.Tensor, n: int) -> tf.Tensor:
    """Inverse of `pack_bits` over the last axis.

    Args:
        words: int32 tensor of shape [..., ceil(n / 32)].
        n: number of elements that were packed.

    Returns:
        boolean tensor of shape [..., n].
    """
    words = _check_words(words, n)
    lib = _library.custom_ops()
    if lib is None:
        return unpack_bits_reference(words, n)
    return lib.tfgc_unpack_bits(words, n=n)


def unpack_bits_reference(words: tf.Tensor, n: int) -> tf.Tensor:
    """Pure-TF `unpack_bits`."""
    words = _check_words(words, n)
    shifts = tf.range(BITS_PER_WORD, dtype=tf.int32)
    bits = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(words[..., None], shifts), 1
    )
    lead = tf.shape(words)[:-1]
    bits = tf.reshape(bits, tf.concat([lead, [-1]], axis=0))[..., :n]
    return tf.cast(bits, tf.bool)


def unpack_bits_sum(words: tf.Tensor, scales: tf.Tensor, n: int) -> tf.Tensor:
    """Sums p packed sign vectors, each with its scale, in one pass.

    out[e] = sum_i scales[i] * (+1 if bit e of row i is set else -1),
    accumulated in float32 (the decompression of scaled SignSGD payloads
    gathered from p workers).

    Args:
        words: int32 tensor [p, ceil(n / 32)], one `pack_bits` row per worker.
        scales: float32, float16 or bfloat16 tensor [p].
        n: number of elements per row.

    Returns:
        tensor [n] of the dtype of `scales`.
    """
    words = _check_rows(words, n)
    scales = tf.convert_to_tensor(scales)
    _check_scale_dtype("scales", scales.dtype)
    lib = _library.custom_ops()
    if lib is None:
        return unpack_bits_sum_reference(words, scales, n)
    return lib.tfgc_unpack_bits_sum(words, scales, n=n)


def unpack_bits_sum_reference(
    words: tf.Tensor, scales: tf.Tensor, n: int
) -> tf.Tensor:
    """Pure-TF `unpack_bits_sum`."""
    words = _check_rows(words, n)
    scales = tf.convert_to_tensor(scales)
    _check_scale_dtype("scales", scales.dtype)
    signs = tf.where(unpack_bits_reference(words, n), 1.0, -1.0)
    total = tf.reduce_sum(tf.cast(scales, tf.float32)[:, None] * signs, 0)
    return tf.cast(total, scales.dtype)


def unpack_bits_vote(
    words: tf.Tensor, n: int, dtype: tf.DType = tf.float32
) -> tf.Tensor:
    """Majority vote of p packed sign vectors (signSGD with majority vote).

    out[e] = +1 where at least half of the rows have bit e set (ties give
    +1, matching `pack_bits(x >= 0)`), -1 elsewhere.

    Args:
        words: int32 tensor [p, ceil(n / 32)].
        n: number of elements per row.
        dtype: float32, float16 or bfloat16 result dtype.

    Returns:
        tensor [n] of +-1 in `dtype`.
    """
    words = _check_rows(words, n)
    _check_scale_dtype("dtype", dtype)
    lib = _library.custom_ops()
    if lib is None:
        return unpack_bits_vote_reference(words, n, dtype)
    return lib.tfgc_unpack_bits_vote(words, n=n, T=dtype)


def unpack_bits_vote_reference(
    words: tf.Tensor, n: int, dtype: tf.DType = tf.float32
) -> tf.Tensor:
    """Pure-TF `unpack_bits_vote`."""
    words = _check_rows(words, n)
    _check_scale_dtype("dtype", dtype)
    votes = tf.reduce_sum(tf.cast(unpack_bits_reference(words, n), tf.int32), 0)
    p = tf.shape(words)[0]
    return tf.cast(tf.where(2 * votes >= p, 1.0, -1.0), dtype)
