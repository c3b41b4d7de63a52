"""What goes between workers: collective kinds, payload bytes, traffic.

A payload is a NamedTuple of tensors, the only thing a compressor puts on
the wire. Its compressor declares, per communication round, the collective
that carries it (`Spec.collectives`), and a communicator delivers it:

* `ALL_REDUCE`: the element-wise sum of every worker's payload (the
  payload must be linear);
* `ALL_GATHER`: every field stacked along a new leading axis of size
  `num_workers`;
* `ALL_GATHER_RAGGED`: 1-D fields whose length is data-dependent and may
  differ between workers, as `tf.RaggedTensor`s of shape
  [num_workers, None], row i being worker i's field;
* `BROADCAST`: the payload of the worker named by its `root` field (which
  is not sent), on every worker.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
ALL_GATHER_RAGGED = "all_gather_ragged"
BROADCAST = "broadcast"
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, ALL_GATHER_RAGGED, BROADCAST)
#: The payload field that names a broadcast's sender; it is not sent.
ROOT_FIELD = "root"


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


def zero_bytes() -> tf.Tensor:
    return tf.constant(0, tf.int64)


def no_traffic() -> Traffic:
    """The traffic of a step that sends nothing."""
    return Traffic(zero_bytes(), zero_bytes(), zero_bytes())


def num_elements(shape) -> int:
    """The number of elements of a static shape (1 for a scalar)."""
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def wire_fields(payload) -> list[int]:
    """Positions of the payload's fields that go on the wire: all but a
    broadcast's `root` (a payload without field names sends them all)."""
    names = getattr(payload, "_fields", ())
    return [
        j
        for j in range(len(payload))
        if j >= len(names) or names[j] != ROOT_FIELD
    ]


def payload_nbytes(*payloads) -> tf.Tensor:
    """Bytes of payloads as they go on the wire (int64 scalar tensor).

    Fields of static shape are counted while tracing; only the others
    add ops (a bucket can hold hundreds of payloads).
    """
    static, dynamic = 0, []
    for payload in payloads:
        for j in wire_fields(payload):
            field = payload[j]
            if field.shape.is_fully_defined():
                static += field.shape.num_elements() * field.dtype.size
            else:
                size = tf.size(field, out_type=tf.int64)
                dynamic.append(size * field.dtype.size)
    total = tf.constant(static, tf.int64)
    return tf.add_n([total] + dynamic) if dynamic else total
