"""One step of compress -> communicate -> decompress for many tensors."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfgc.compressors.base import Compressor, payload_nbytes


def exchange(
    compressors: Sequence[Compressor],
    tensors: Sequence[tf.Tensor],
    states: Sequence,
    keys: Sequence[tf.Tensor],
    communicator,
):
    """Compresses, communicates and decompresses every tensor.

    Round r of every tensor that still has one goes through a single
    `communicator.exchange` call, so a round costs one fused collective per
    wire type, however many tensors there are.

    Returns:
        (totals, new_states, sent_bytes): the sum over workers of each
        tensor, each compressor's next state, and the bytes this worker put
        on the wire (int64 scalar tensor).
    """
    payloads, contexts = [], []
    for compressor, x, state, key in zip(compressors, tensors, states, keys):
        payload, ctx = compressor.compress(x, state, key)
        payloads.append(payload)
        contexts.append(ctx)
    totals = [None] * len(tensors)
    new_states = [None] * len(tensors)
    sent = tf.constant(0, tf.int64)
    pending = list(range(len(tensors)))
    round_index = 0
    while pending:
        for i in pending:
            sent += payload_nbytes(payloads[i])
        received = communicator.exchange(
            [payloads[i] for i in pending],
            [compressors[i].collective for i in pending],
        )
        still_pending = []
        for i, reduced in zip(pending, received):
            compressor = compressors[i]
            if round_index + 1 < compressor.rounds:
                payloads[i], contexts[i] = compressor.next_round(
                    reduced, contexts[i]
                )
                still_pending.append(i)
            else:
                totals[i], new_states[i] = compressor.decompress(
                    reduced, contexts[i]
                )
        pending = still_pending
        round_index += 1
    return totals, new_states, sent
