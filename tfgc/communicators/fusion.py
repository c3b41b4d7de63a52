"""Fused collectives: many tensors, few collective ops.

Every collective costs milliseconds of fixed latency (measured here: 50
separate all-gathers took 25x the time of one fused all-gather of the same
bytes), so tensors are flattened into one buffer per wire type.
"""

from __future__ import annotations

import tensorflow as tf

from tfgc.communicators.collectives import Group


def _as_words(flat: tf.Tensor, wide: bool = True) -> tf.Tensor:
    """A 1-D tensor's bytes as int32 (or int64) words, for gathers.

    Gathers only move bytes, and their kernels take few dtypes (no
    bfloat16, no 8- or 16-bit integers), so every payload rides in 32-bit
    words: indices, float32 values, packed bits and 16-bit values share
    one buffer. 8-byte types ride as int64, or as pairs of int32 words
    with `wide=False`. The length may be unknown while tracing.
    """
    size = flat.dtype.size
    if size == 8:
        words = tf.bitcast(flat, tf.int64)
        return words if wide else tf.reshape(tf.bitcast(words, tf.int32), [-1])
    if size == 4:
        return tf.bitcast(flat, tf.int32)
    per_word = 4 // size
    padding = -tf.shape(flat)[0] % per_word
    flat = tf.pad(flat, [[0, padding]])
    return tf.bitcast(tf.reshape(flat, [-1, per_word]), tf.int32)


def _from_words(words: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Inverse of `_as_words` over the last axis; keeps leading axes."""
    values = tf.bitcast(words, like.dtype)
    if like.dtype.size < 4:  # bitcast added an axis of 4 // size elements
        lead = words.shape[:-1].as_list()
        values = tf.reshape(values, lead + [-1])
    return values[..., : like.shape.num_elements()]


def _num_words(count: tf.Tensor, itemsize) -> tf.Tensor:
    """int32 words that `count` elements of `itemsize` bytes take in a
    buffer."""
    return (count * itemsize + 3) // 4


def _by_dtype(tensors) -> list[list[int]]:
    """Indices of `tensors` grouped by dtype: one collective per group."""
    groups: dict[tf.DType, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return list(groups.values())


def _fuse(tensors, collective, encode, decode, lead):
    """Runs `collective` once per wire dtype over the flattened tensors.

    `encode` maps a flat tensor to its wire form, `decode(wire, original)`
    maps back (keeping leading axes); `collective` maps a 1-D buffer to a
    buffer with `lead` rows stacked ahead of it (lead=0: the same shape, as
    all-reduce; lead=p: [p, length]).
    """
    wires = [encode(tf.reshape(t, [-1])) for t in tensors]
    out = [None] * len(tensors)
    for members in _by_dtype(wires):
        sizes = [wires[i].shape[0] for i in members]
        result = collective(tf.concat([wires[i] for i in members], axis=0))
        if lead:
            result = tf.reshape(result, [lead, sum(sizes)])
        pieces = (
            tf.split(result, sizes, axis=-1) if len(sizes) > 1 else [result]
        )
        for i, piece in zip(members, pieces):
            shape = ([lead] if lead else []) + tensors[i].shape.as_list()
            out[i] = tf.reshape(decode(piece, tensors[i]), shape)
    return out


def all_reduce_sum(tensors, group: Group):
    """Sums each tensor over the group, one all-reduce per dtype."""
    return _fuse(tensors, group.all_reduce, lambda t: t, lambda t, _: t, 0)


def reduce_scatter_sum(blocks, group: Group):
    """Row `group.rank` of each [size, length] block, summed over the
    group: one reduce-scatter per dtype (GPUs with NCCL only, see
    `Group.reduce_scatter`).

    A reduce-scatter hands member r the r-th of `size` equal slices of its
    buffer, so the blocks are joined along their rows' length: slice r of
    the fused buffer is row r of every block.
    """
    out = [None] * len(blocks)
    for members in _by_dtype(blocks):
        lengths = [blocks[i].shape[1] for i in members]
        joined = tf.concat([blocks[i] for i in members], axis=1)
        shard = group.reduce_scatter(tf.reshape(joined, [-1]))
        pieces = tf.split(shard, lengths) if len(members) > 1 else [shard]
        for i, piece in zip(members, pieces):
            out[i] = piece
    return out


def all_gather(tensors, group: Group):
    """Stacks each tensor from every member on a new leading axis.

    Every member's tensor must have the same (static) shape.
    """
    return _fuse(tensors, group.all_gather, _as_words, _from_words, group.size)


def _decode_words(words: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Inverse of `_as_words(flat, wide=False)`, with any sub-word padding."""
    if dtype.size == 8:
        return tf.bitcast(tf.reshape(words, [-1, 2]), dtype)
    return tf.reshape(tf.bitcast(words, dtype), [-1])


def broadcast(tensors, group: Group, root: tf.Tensor):
    """Each tensor of member `root` (an int32 scalar, the same everywhere);
    one broadcast per wire dtype. Every member's tensors have the same
    static shapes."""

    def send(buffer):
        return group.broadcast(buffer, root)

    return _fuse(tensors, send, _as_words, _from_words, 0)


def all_gather_ragged(tensors, group: Group):
    """Gathers 1-D tensors whose lengths differ between members.

    All tensors travel in one buffer per member: a header with the element
    count of each tensor, then the tensors as 32-bit words. The buffers are
    gathered by `Group.all_gather_unequal` (lengths first, then the buffers
    padded to a common length). The rows are unpacked with a fixed number
    of ops per dtype and a few per tensor: a bucket can hold hundreds of
    tensors, and each op costs tracing and start-up time.

    Returns:
        (gathered, overhead): per tensor a `tf.RaggedTensor` [size, None]
        (int64 row splits) whose row i is member i's tensor, and the int64
        bytes this member sent beyond its tensors' own bytes (header, word
        alignment and padding to the common length, and the lengths'
        collective).
    """
    flats = [tf.reshape(t, [-1]) for t in tensors]
    counts = tf.stack([tf.size(f, out_type=tf.int32) for f in flats])
    words = [_as_words(f, wide=False) for f in flats]
    rows, _ = group.all_gather_unequal(tf.concat([counts] + words, axis=0))
    num = len(tensors)
    padded = tf.shape(rows, out_type=tf.int32)[1]
    flat_rows = tf.reshape(rows, [-1])
    headers = rows[:, :num]  # [size, tensors] element counts
    itemsize = tf.constant([f.dtype.size for f in flats], tf.int32)
    member_words = _num_words(headers, itemsize)
    # Where each member's tensor starts in flat_rows: after its row's
    # header and its earlier tensors.
    row_starts = tf.range(group.size, dtype=tf.int32)[:, None] * padded
    starts = row_starts + num + tf.cumsum(member_words, axis=1, exclusive=True)
    gathered = [None] * num
    for members in _by_dtype(flats):
        pieces, splits = _unpack(
            flat_rows,
            tf.gather(starts, members, axis=1),
            tf.gather(member_words, members, axis=1),
            tf.gather(headers, members, axis=1),
            flats[members[0]].dtype,
        )
        for j, i in enumerate(members):
            gathered[i] = tf.RaggedTensor.from_row_splits(
                pieces[j], splits[j], validate=False
            )
    sent = tf.reduce_sum(
        tf.cast(counts, tf.int64) * tf.cast(itemsize, tf.int64)
    )
    length_bytes = 4  # this member's length, in the first collective
    overhead = 4 * tf.cast(padded, tf.int64) + length_bytes - sent
    return gathered, overhead


def _runs(flat, starts, lengths):
    """flat[starts[i] : starts[i] + lengths[i]] for every i, one after
    another (one gather)."""
    return tf.gather(
        flat, tf.ragged.range(starts, starts + lengths).flat_values
    )


def _unpack(flat_rows, starts, member_words, counts, dtype):
    """The tensors of one dtype out of the gathered rows.

    `starts`, `member_words` and `counts` are [size, m]: where member r's
    copy of the dtype's j-th tensor starts in `flat_rows`, its words and
    its elements. One gather takes every copy, tensor by tensor.

    Returns:
        (pieces, splits): per tensor its members' elements one after
        another, and its int64 row splits [size + 1].
    """
    m = counts.shape[1]

    def tensor_major(x):  # [size, m] -> [m * size], tensor by tensor
        return tf.reshape(tf.transpose(x), [-1])

    words = tensor_major(member_words)
    values = _decode_words(_runs(flat_rows, tensor_major(starts), words), dtype)
    lengths = tf.transpose(counts)  # [m, size]
    if dtype.size < 4:
        # Each copy starts on a word boundary: drop the padding after it.
        first = tf.cumsum(words, exclusive=True) * (4 // dtype.size)
        values = _runs(values, first, tf.reshape(lengths, [-1]))
    ends = tf.cumsum(tf.cast(lengths, tf.int64), axis=1)
    splits = tf.pad(ends, [[0, 0], [1, 0]])
    pieces = tf.split(values, ends[:, -1], num=m) if m > 1 else [values]
    return pieces, tf.unstack(splits, num=m)
