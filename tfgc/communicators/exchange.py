"""One step of compress -> communicate -> decompress for many tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfgc import ops
from tfgc.core.compressor import Compressor, StepInfo
from tfgc.core.wire import Traffic, payload_nbytes, zero_bytes

#: carry(payloads, collectives) -> (received, overhead bytes): one round of
#: payloads through the collectives their compressors declared.
Carry = Callable[[Sequence[Any], Sequence[str]], tuple[list, tf.Tensor]]


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


def step_infos(variables, rank: int, num_peers: int) -> list:
    """A `StepInfo` per variable value (None where there is none)."""
    if variables is None:
        return None
    return [
        None if v is None else StepInfo(v, rank, num_peers) for v in variables
    ]


def buckets(
    compressors: Sequence[Compressor],
    tensors: Sequence[tf.Tensor],
    bucket_bytes: int | None = None,
) -> list[list[int]]:
    """Tensor indices grouped into exchange buckets.

    Buckets of about `bucket_bytes` uncompressed bytes, or of a
    compressor's own `spec.bucket_bytes` where one asks for it (ACP-SGD:
    bytes of what each tensor sends, `spec.buckets_by_payload`), filled
    from the last tensor backwards (a backward pass produces the last
    layers' gradients first), each exchanged with its own collectives.
    With neither, one bucket of all.
    """
    own = [c.spec for c in compressors if c.spec.bucket_bytes]
    limit = max(s.bucket_bytes for s in own) if own else bucket_bytes
    if not limit:
        return [list(range(len(tensors)))]
    by_payload = any(s.buckets_by_payload for s in own)
    groups, current, size = [], [], 0
    for i in reversed(range(len(tensors))):
        shape, dtype = tensors[i].shape, tensors[i].dtype
        nbytes = (
            compressors[i].payload_bytes(shape, dtype)
            if by_payload
            else shape.num_elements() * dtype.size
        )
        if current and size + nbytes > limit:
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    groups.append(current)
    return groups


def phase_buckets(
    phases: Sequence[Sequence[Compressor]],
    tensors: Sequence[tf.Tensor],
    bucket_bytes: int | None = None,
) -> list[list[int]]:
    """The buckets of a step whose compressors change by phase
    (`phases[j]`: each tensor's compressor in phase j): the finest
    grouping in which every phase's `buckets` lie whole, so that a
    bucket's exchange can pick its phase and still send each phase's
    own buckets (ACP-SGD's P and Q factors fused apart)."""
    # Where each phase starts a new bucket, counted from the last tensor.
    cuts = None
    for compressors in phases:
        groups = buckets(compressors, tensors, bucket_bytes)
        ends = set(np.cumsum([len(g) for g in groups]).tolist())
        cuts = ends if cuts is None else cuts & ends
    order = list(reversed(range(len(tensors))))
    out, start = [], 0
    for end in sorted(cuts):
        out.append(order[start:end])
        start = end
    return out


def _compress_batches(
    compressors, tensors, states, keys, bucket, payloads, contexts
) -> set[int]:
    """Compresses the tensors of `bucket` that equal compressors can take
    together (`Compressor.compress_batch`), filling `payloads` and
    `contexts`; returns the indices done."""
    groups: dict[tuple, list[int]] = {}
    for i in bucket:
        compressor = compressors[i]
        spec = compressor.spec
        if spec.rounds == 1 and not spec.reads_step_info:
            groups.setdefault((compressor, tensors[i].dtype), []).append(i)
    done = set()
    for (compressor, _), members in groups.items():
        if len(members) < 2:
            continue
        out = compressor.compress_batch(
            [tensors[i] for i in members],
            [states[i] for i in members],
            [keys[i] for i in members],
        )
        if out is None:
            continue
        for i, (payload, ctx) in zip(members, out):
            payloads[i], contexts[i] = payload, ctx
        done.update(members)
    return done


def run_rounds(
    compressors: Sequence[Compressor],
    tensors: Sequence[tf.Tensor],
    states: Sequence,
    keys: Sequence[tf.Tensor],
    carry: Carry,
    infos: Sequence[StepInfo | None] | None = None,
    bucket_bytes: int | None = None,
) -> tuple[list, list, tf.Tensor, tf.Tensor]:
    """Compresses, communicates and decompresses every tensor.

    Within a bucket (`buckets` of about `bucket_bytes`), round r of every
    tensor that still has one goes through a single `carry` call, so a
    round costs one fused collective per wire type, however many tensors
    there are. `infos` (per tensor) reach the compressors that read them
    (`Spec.reads_step_info`). While tracing for XLA, a compressor
    that XLA cannot compile (`Compressor.xla_unsupported`) is refused.

    Returns:
        (totals, new_states, sent, overhead): the sum over workers of each
        tensor, each compressor's next state, and the bytes this worker
        put on the wire (payloads, and beyond them).
    """
    for compressor in compressors:
        reason = compressor.xla_unsupported()
        if reason:
            ops.refuse_xla(reason)
    totals = [None] * len(tensors)
    new_states = [None] * len(tensors)
    sent, overhead = zero_bytes(), zero_bytes()
    payloads = [None] * len(tensors)
    contexts = [None] * len(tensors)
    groups = buckets(compressors, tensors, bucket_bytes)
    for number, bucket in enumerate(groups):
        # Each bucket's ops under a name of their own (profiler traces show
        # `tfgc_bucket_<n>/...`); a bucket depends only on its tensors.
        scope = f"tfgc_bucket_{number}" if len(groups) > 1 else "tfgc_exchange"
        with tf.name_scope(scope):
            _compress(
                compressors,
                tensors,
                states,
                keys,
                infos,
                bucket,
                payloads,
                contexts,
            )
            pending = list(bucket)
            round_index = 0
            while pending:
                sent += payload_nbytes(*(payloads[i] for i in pending))
                kinds = [
                    compressors[i].spec.collectives[round_index]
                    for i in pending
                ]
                received, extra = carry([payloads[i] for i in pending], kinds)
                overhead += extra
                still_pending = []
                for i, reduced in zip(pending, received):
                    compressor = compressors[i]
                    if round_index + 1 < compressor.spec.rounds:
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


def _compress(
    compressors, tensors, states, keys, infos, bucket, payloads, contexts
) -> None:
    """Round 0 of every tensor of `bucket`: batched where equal compressors
    can take several tensors at once, one by one otherwise."""
    batched = _compress_batches(
        compressors, tensors, states, keys, bucket, payloads, contexts
    )
    for i in bucket:
        if i in batched:
            continue
        compressor = compressors[i]
        args = (tensors[i], states[i], keys[i])
        if compressor.spec.reads_step_info:
            if infos is None or infos[i] is None:
                raise ValueError(
                    f"{type(compressor).__name__} reads the variable's "
                    "value, and none was given: use it through "
                    "tfgc.CompressedOptimizer, or pass `variables` to "
                    "the communicator's step."
                )
            args += (infos[i],)
        payloads[i], contexts[i] = compressor.compress(*args)
