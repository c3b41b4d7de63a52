"""One step of compress -> communicate -> decompress for many tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from tfgc.compressors.base import Compressor, payload_nbytes

#: carry(payloads, collectives) -> (received, overhead bytes): one round of
#: payloads through the collectives their compressors declared.
Carry = Callable[[Sequence[Any], Sequence[str]], tuple[list, tf.Tensor]]


class Traffic(NamedTuple):
    """Bytes one worker sent in one step (int64 scalar tensors).

    Attributes:
        sent: the payloads' own bytes on the network between hosts (with a
            flat communicator, every byte this worker sent).
        overhead: bytes sent beyond the payloads: headers and padding of
            gathers whose payloads differ in size between workers.
        intra_host: bytes exchanged with workers of the same host
            (`Hierarchical` only), which never cross the slow network.
    """

    sent: tf.Tensor
    overhead: tf.Tensor
    intra_host: tf.Tensor


class StepResult(NamedTuple):
    """What one exchange step returns.

    Attributes:
        totals: per tensor, the sum over workers, in its original shape.
        states: per tensor, the compressor's next state.
        traffic: the bytes this worker sent.
    """

    totals: list
    states: list
    traffic: Traffic


def zero_bytes() -> tf.Tensor:
    return tf.constant(0, tf.int64)


def run_rounds(
    compressors: Sequence[Compressor],
    tensors: Sequence[tf.Tensor],
    states: Sequence,
    keys: Sequence[tf.Tensor],
    carry: Carry,
) -> tuple[list, list, tf.Tensor, tf.Tensor]:
    """Compresses, communicates and decompresses every tensor.

    Round r of every tensor that still has one goes through a single
    `carry` call, so a round costs one fused collective per wire type,
    however many tensors there are.

    Returns:
        (totals, new_states, sent, overhead): the sum over workers of each
        tensor, each compressor's next state, and the bytes this worker
        put on the wire (payloads, and beyond them).
    """
    payloads, contexts = [], []
    for compressor, x, state, key in zip(compressors, tensors, states, keys):
        payload, ctx = compressor.compress(x, state, key)
        payloads.append(payload)
        contexts.append(ctx)
    totals = [None] * len(tensors)
    new_states = [None] * len(tensors)
    sent, overhead = zero_bytes(), zero_bytes()
    pending = list(range(len(tensors)))
    round_index = 0
    while pending:
        for i in pending:
            sent += payload_nbytes(payloads[i])
        received, extra = carry(
            [payloads[i] for i in pending],
            [compressors[i].collective for i in pending],
        )
        overhead += extra
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
    return totals, new_states, sent, overhead
