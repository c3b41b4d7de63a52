"""Collectives over any group of replicas: TensorFlow's V2 collective ops.

tfgc calls `tf.raw_ops.CollectiveReduceV2` / `CollectiveGatherV2` itself
rather than the replica context's `all_reduce` / `all_gather`, for three
reasons found by trying them (TF 2.21):

* HiTopKComm needs collectives among a subset of the replicas (the workers
  of one host, or one local rank on every host); the replica context only
  offers the whole group.
* Dense warm-up steps switch between a dense and a compressed exchange with
  `tf.cond`; the replica context's collectives go through `merge_call`,
  which refuses to run inside control flow.
* Payloads of data-dependent size must be padded to a common length, and a
  collective instance that ran once with one shape refuses another shape
  ("Shape mismatch in the collective instance"). Gathers of unequal sizes
  therefore pad to one of a fixed ladder of lengths and use the instance
  key of that length (`all_gather_unequal`).

Keys. A group key is a hash of the cluster and the member list, so every
member derives it without a message and different groups never share one
(tf.distribute's own keys are small integers, far below ours). Instance
keys are counted per (device, group) while tracing: every replica traces
the same collectives in the same order, so they agree. Like
tf.distribute's V1 keys, this assumes the workers trace the same
functions; a function traced on one worker only would put it out of step.

Every collective on a device reads that device's ordering token (a
resource handle). `tf.function` then runs a device's collectives in program
order, as tf.distribute does for NCCL; without a token, collectives among
logical devices of one process never completed in our tries.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Sequence

import tensorflow as tf

from tfgc import ops
from tfgc.communicators.topology import Topology

_GROUP_KEY_BASE = 1 << 28
_GROUP_KEY_SPAN = (1 << 31) - 1 - _GROUP_KEY_BASE
_FIRST_INSTANCE_KEY = 1

# Padded lengths (in 32-bit words) for gathers of unequal size: an eighth
# of an octave apart, so padding adds at most 9 % to the longest buffer.
LADDER = tuple(sorted({math.ceil(2 ** (i / 8)) for i in range(8 * 31)}))

_lock = threading.Lock()
_next_instance_key: dict[tuple[str, int], int] = {}
_tokens: dict[str, tf.Tensor] = {}


def group_key(topology: Topology, members: Sequence[int]) -> int:
    """The collective group key of `members` (replica ids) in `topology`."""
    text = f"{topology.cluster}|{','.join(str(m) for m in members)}"
    return _GROUP_KEY_BASE + zlib.crc32(text.encode()) % _GROUP_KEY_SPAN


def has_reduce_scatter(device_type: str | None, implementation: str) -> bool:
    """Whether `CollectiveReduceScatterV2` runs on `device_type` (e.g.
    "GPU", "CPU") with `implementation` ("AUTO", "RING" or "NCCL", any case).

    TensorFlow implements the reduce-scatter with NCCL only: its collective
    parameter resolver names every other combination "undef", which fails
    at run time with "did not find collective implementation" (and without
    an ordering token it hung, on CPU, in our tries). NCCL is chosen only
    for GPU groups whose communication hint is "nccl"; "auto" maps to NCCL
    only where the session config sets `collective_nccl`, which
    TensorFlow 2's strategies do not set in eager mode, so AUTO counts as
    no reduce-scatter. Callers fall back to an all-reduce and a slice.
    """
    return (device_type or "").upper() == "GPU" and (
        implementation.upper() == "NCCL"
    )


def _ordering_token(device: str) -> tf.Tensor:
    with _lock:
        token = _tokens.get(device)
        if token is None:
            with tf.init_scope(), tf.device(device):
                token = tf.raw_ops.VarHandleOp(
                    dtype=tf.float32,
                    shape=[],
                    shared_name=f"tfgc_collective_order_{len(_tokens)}",
                )
            _tokens[device] = token
        return token


class Group:
    """The replicas that take part in a collective, seen by one of them.

    Args:
        topology: the run's topology.
        members: replica ids of the group, in rank order.
        replica_id: the replica this object runs on (one of `members`).
        options: `tf.distribute.experimental.CommunicationOptions`
            (implementation and timeout) for every collective.
    """

    def __init__(
        self,
        topology: Topology,
        members: Sequence[int],
        replica_id: int,
        options=None,
    ):
        self.members = tuple(members)
        if replica_id not in self.members:
            raise ValueError(
                f"Replica {replica_id} is not in the group {self.members}."
            )
        self.size = len(self.members)
        self.rank = self.members.index(replica_id)
        self.device = topology.device(replica_id)
        self.key = group_key(topology, self.members)
        self._hint = "auto"
        self._timeout = 0.0
        if options is not None:
            # TensorFlow's resolver compares the hint with "nccl" verbatim
            # (and uses NCCL only on GPUs), and the raw ops pass it as is.
            self._hint = options.implementation.value.lower()
            self._timeout = float(options.timeout_seconds or 0.0)

    @property
    def has_reduce_scatter(self) -> bool:
        """Whether `reduce_scatter` works on this group's device with its
        options (see the module function `has_reduce_scatter`)."""
        device_type = tf.DeviceSpec.from_string(self.device).device_type
        return has_reduce_scatter(device_type, self._hint)

    def _instance_keys(self, count: int) -> int:
        """Reserves `count` consecutive instance keys; returns the first."""
        with _lock:
            slot = (self.device, self.key)
            first = _next_instance_key.get(slot, _FIRST_INSTANCE_KEY)
            _next_instance_key[slot] = first + count
        return first

    def _common(self, instance_key) -> dict:
        return dict(
            group_size=self.size,
            group_key=self.key,
            instance_key=instance_key,
            ordering_token=[_ordering_token(self.device)],
            communication_hint=self._hint,
            timeout_seconds=self._timeout,
        )

    def _refuse_xla(self, op: str) -> None:
        """Refuses a collective that XLA cannot compile on this device.

        TensorFlow has XLA kernels for `CollectiveReduceV2` only, and only
        on GPUs ("not yet implemented for CPU devices").
        """
        device_type = tf.DeviceSpec.from_string(self.device).device_type
        if op == "CollectiveReduceV2" and device_type == "GPU":
            return
        ops.refuse_xla(
            f"tfgc exchanges payloads among {self.size} replicas with "
            f"{op}, which TensorFlow cannot compile with XLA on "
            f"{device_type or 'this device'}",
            data_dependent_shape=False,
        )

    def all_reduce(self, buffer: tf.Tensor) -> tf.Tensor:
        """The element-wise sum of every member's `buffer`."""
        if self.size == 1:
            return buffer
        self._refuse_xla("CollectiveReduceV2")
        with tf.device(self.device):
            return tf.raw_ops.CollectiveReduceV2(
                input=buffer,
                merge_op="Add",
                final_op="Id",
                **self._common(self._instance_keys(1)),
            )

    def reduce_scatter(self, buffer: tf.Tensor) -> tf.Tensor:
        """This member's part of the sum of every member's 1-D `buffer`:
        elements rank * L .. (rank + 1) * L - 1, L = len(buffer) / size.

        Moves (size - 1) / size of the buffer per member on a ring, half
        of an all-reduce. Only where `has_reduce_scatter` is True (GPUs
        with NCCL); elsewhere it raises while tracing rather than fail or
        hang at run time.
        """
        length = buffer.shape.num_elements() if buffer.shape.rank == 1 else None
        if length is None or length % self.size:
            raise ValueError(
                "`buffer` must be a 1-D tensor of static length divisible "
                f"by the group size ({self.size}). Received: shape "
                f"{buffer.shape}. Pad it to a multiple of {self.size}."
            )
        if self.size == 1:
            return buffer
        if not self.has_reduce_scatter:
            raise ValueError(
                "TensorFlow has a reduce-scatter only on GPUs with NCCL; "
                f"this group runs on {self.device!r} with communication "
                f"implementation {self._hint.upper()}. Pass "
                "tf.distribute.experimental.CommunicationOptions("
                "implementation=NCCL) on GPUs, or use all_reduce and slice."
            )
        self._refuse_xla("CollectiveReduceScatterV2")
        with tf.device(self.device):
            shard = tf.raw_ops.CollectiveReduceScatterV2(
                input=buffer,
                merge_op="Add",
                final_op="Id",
                **self._common(self._instance_keys(1)),
            )
        return tf.reshape(shard, [length // self.size])

    def _gather(self, buffer: tf.Tensor, keys: int = 1, which=0) -> tf.Tensor:
        """A gather under instance key `which` of `keys` reserved ones.

        The keys are reserved only once the gather is allowed: a refusal
        must leave this device's keys in step with the other replicas'.
        """
        self._refuse_xla("CollectiveGatherV2")
        instance_key = self._instance_keys(keys) + which
        with tf.device(self.device):
            return tf.raw_ops.CollectiveGatherV2(
                input=buffer, **self._common(instance_key)
            )

    def all_gather(self, buffer: tf.Tensor) -> tf.Tensor:
        """Every member's 1-D `buffer` (all of one length), [size, length]."""
        if self.size == 1:
            return buffer[None]
        gathered = self._gather(buffer)
        return tf.reshape(gathered, [self.size, -1])

    def broadcast(self, buffer: tf.Tensor, root: tf.Tensor) -> tf.Tensor:
        """The 1-D `buffer` of member `root` (a rank, the same on every
        member, known only at run time); every member passes a buffer of
        the same shape and dtype.

        A collective instance remembers its source, so each possible root
        has an instance key of its own.
        """
        if self.size == 1:
            return buffer
        self._refuse_xla("CollectiveBcastSendV2")
        common = self._common(self._instance_keys(self.size) + root)
        # The broadcast ops take no ordering token, so the cond between
        # them uses it: TensorFlow then orders the cond, as the token's
        # user, in program order with the other collectives (NCCL hangs
        # when workers launch collectives in different orders).
        (token,) = common.pop("ordering_token")

        def ordered(collective):
            def branch():
                in_order = tf.raw_ops.VarIsInitializedOp(resource=token)
                with tf.control_dependencies([in_order]):
                    return collective()

            return branch

        def send():
            return tf.raw_ops.CollectiveBcastSendV2(input=buffer, **common)

        def receive():
            return tf.raw_ops.CollectiveBcastRecvV2(
                T=buffer.dtype, shape=tf.shape(buffer), **common
            )

        with tf.device(self.device):
            return tf.cond(
                tf.equal(root, self.rank), ordered(send), ordered(receive)
            )

    def all_gather_unequal(
        self, buffer: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Every member's 1-D int32 `buffer`, of any lengths.

        Two collectives: the lengths, then the buffers padded to the first
        length of `LADDER` that holds the longest.

        Returns:
            (rows, lengths): rows [size, padded] with member i's buffer in
            rows[i, :lengths[i]], and the int32 lengths [size].
        """
        length = tf.shape(buffer, out_type=tf.int32)[0]
        if self.size == 1:
            return buffer[None], length[None]
        lengths = self.all_gather(length[None])[:, 0]
        ladder = tf.constant(LADDER, tf.int32)
        rung = tf.searchsorted(
            ladder, tf.reduce_max(lengths)[None], side="left"
        )[0]
        padded = tf.gather(ladder, rung)
        rows = self._gather(
            tf.pad(buffer, [[0, padded - length]]), len(LADDER), rung
        )
        return tf.reshape(rows, [self.size, padded]), lengths
