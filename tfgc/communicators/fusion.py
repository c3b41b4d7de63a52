"""Fused collectives: many tensors, few collective ops.

Every collective costs milliseconds of fixed latency (ENVIRONMENT.md
measured 50 separate all-gathers at 25x the time of one fused all-gather of
the same bytes), so tensors are flattened into one buffer per wire type.
"""

from __future__ import annotations

import tensorflow as tf


def _as_words(flat: tf.Tensor) -> tf.Tensor:
    """A 1-D tensor's bytes as int32 (or int64) words, for gathers.

    Gathers only move bytes, and their kernels take few dtypes (no
    bfloat16, no 8- or 16-bit integers), so every payload rides in 32-bit
    words: indices, float32 values, packed bits and 16-bit values share
    one buffer. 8-byte types ride as int64.
    """
    size = flat.dtype.size
    if size == 8:
        return tf.bitcast(flat, tf.int64)
    if size == 4:
        return tf.bitcast(flat, tf.int32)
    per_word = 4 // size
    padding = -flat.shape[0] % per_word
    flat = tf.pad(flat, [[0, padding]])
    return tf.bitcast(tf.reshape(flat, [-1, per_word]), tf.int32)


def _from_words(words: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Inverse of `_as_words` over the last axis; keeps leading axes."""
    values = tf.bitcast(words, like.dtype)
    if like.dtype.size < 4:  # bitcast added an axis of 4 // size elements
        lead = words.shape[:-1].as_list()
        values = tf.reshape(values, lead + [-1])
    return values[..., : like.shape.num_elements()]


def _fuse(tensors, collective, encode, decode, lead):
    """Runs `collective` once per wire dtype over the flattened tensors.

    `encode` maps a flat tensor to its wire form, `decode(wire, original)`
    maps back (keeping leading axes); `collective` maps a 1-D buffer to a
    buffer with `lead` rows stacked ahead of it (lead=0: the same shape, as
    all-reduce; lead=p: [p, length]).
    """
    wires = [encode(tf.reshape(t, [-1])) for t in tensors]
    groups: dict[tf.DType, list[int]] = {}
    for i, wire in enumerate(wires):
        groups.setdefault(wire.dtype, []).append(i)
    out = [None] * len(tensors)
    for members in groups.values():
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


def all_reduce_sum(tensors, replica_context, options=None):
    """Sums each tensor over all replicas, one all-reduce per dtype."""

    def reduce(buffer):
        return replica_context.all_reduce(
            tf.distribute.ReduceOp.SUM, buffer, options=options
        )

    return _fuse(tensors, reduce, lambda t: t, lambda t, _: t, lead=0)


def all_gather(tensors, replica_context, options=None):
    """Stacks each tensor from all replicas on a new leading axis."""
    num = replica_context.num_replicas_in_sync

    def gather(buffer):
        return replica_context.all_gather(buffer, axis=0, options=options)

    return _fuse(tensors, gather, _as_words, _from_words, lead=num)
