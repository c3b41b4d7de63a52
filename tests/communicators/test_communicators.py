"""Fused collectives give what per-tensor collectives give."""

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import NUM_LOGICAL_CPUS
from tests.graphs import ancestors
from tfgc import communicators
from tfgc.communicators import fusion


def _tensors(replica):
    """Mixed dtypes and shapes, different on every replica."""
    r = tf.cast(replica, tf.float32) + 1.0
    return [
        tf.reshape(tf.range(6, dtype=tf.float32), [2, 3]) * r,
        tf.cast(tf.range(5) * (replica + 1), tf.int32),
        tf.cast(tf.constant([0.5, -1.5]) * r, tf.float16),
        tf.cast(tf.constant([[2.0]]) * r, tf.bfloat16),
        tf.constant([7], tf.int32) + replica,
        tf.cast(tf.range(3) + replica, tf.uint8),  # odd byte count
        tf.cast(tf.range(2) - replica, tf.int64),
    ]


@pytest.mark.parametrize("op", ["all_reduce_sum", "all_gather"])
def test_fused_equals_one_collective_per_tensor(op, mirrored):
    strategy = mirrored

    @tf.function
    def run():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            tensors = _tensors(ctx.replica_id_in_sync_group)
            group = communicators.Auto().group()
            if op == "all_reduce_sum":
                tensors = tensors[:5]  # integer sums of 8-bit types: none
                fused = fusion.all_reduce_sum(tensors, group)
                single = [
                    ctx.all_reduce(tf.distribute.ReduceOp.SUM, t)
                    for t in tensors
                ]
            else:
                fused = fusion.all_gather(tensors, group)
                # The per-tensor reference gathers each tensor as float64
                # (a type every gather kernel takes) and casts back.
                single = [
                    tf.cast(
                        ctx.all_gather(tf.cast(t, tf.float64)[None], axis=0),
                        t.dtype,
                    )
                    for t in tensors
                ]
            return fused, single

        return strategy.run(replica_fn)

    fused, single = run()
    for f, s in zip(fused, single):
        f_local = strategy.experimental_local_results(f)
        s_local = strategy.experimental_local_results(s)
        for a, b in zip(f_local, s_local):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(
                tf.cast(a, tf.float32).numpy(), tf.cast(b, tf.float32).numpy()
            )


def test_ragged_gather_takes_few_ops_per_tensor(mirrored):
    # SBC and RedSync send every compressed tensor of a bucket through one
    # unequal gather, and each op costs tracing and start-up time: adding
    # a tensor must add a few ops (its encoding, its slice of the
    # unpacking), not a row-by-row unpacking of its own (about 50 ops).
    def ops_in_step(num):
        @tf.function
        def run():
            def replica_fn():
                tensors = [tf.zeros([3], tf.uint8)] * num
                tensors += [tf.zeros([2], tf.float32)] * num
                group = communicators.Auto().group()
                return fusion.all_gather_ragged(tensors, group)

            return mirrored.run(replica_fn)

        return len(run.get_concrete_function().graph.get_operations())

    per_tensor = (ops_in_step(16) - ops_in_step(8)) / (16 * NUM_LOGICAL_CPUS)
    assert per_tensor <= 20  # 13 with TensorFlow 2.21


def test_allgather_communicator_sums_linear_payloads(mirrored):
    strategy = mirrored
    comm = communicators.AllGather()

    @tf.function
    def run():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            x = tf.fill([3], tf.cast(ctx.replica_id_in_sync_group, tf.float32))
            return comm.carry([(x,)], ["all_reduce"])[0][0][0]

        return strategy.run(replica_fn)

    total = sum(range(NUM_LOGICAL_CPUS))
    for value in strategy.experimental_local_results(run()):
        np.testing.assert_array_equal(value.numpy(), [total] * 3)


def test_allreduce_refuses_gather_payloads():
    with pytest.raises(ValueError, match="communicator='auto'"):
        communicators.AllReduce().carry([(tf.ones(2),)], ["all_gather"])


def test_communication_options_round_trip():
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=1024,
        timeout_seconds=30.0,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    )
    comm = communicators.get("allgather", options=options)
    restored = communicators.get(communicators.serialize(comm))
    assert isinstance(restored, communicators.AllGather)
    assert restored.options.bytes_per_pack == 1024
    assert restored.options.timeout_seconds == 30.0
    assert restored.options.implementation.name == "RING"
    with pytest.raises(TypeError, match="CommunicationOptions"):
        communicators.Auto(options={"bytes_per_pack": 1})


def test_a_broadcast_runs_in_program_order_with_the_other_collectives(
    mirrored,
):
    """Every collective of a replica runs in the order the program issued
    it (on GPUs NCCL hangs when two workers launch two collectives in
    different orders); a broadcast, whose root is known only at run time,
    is a `tf.cond` between sending and receiving, and that cond must be
    ordered with the collectives before and after it."""

    @tf.function
    def run():
        def replica_fn():
            group = communicators.Auto().group()
            first = group.all_reduce(tf.ones([4]))
            sent = group.broadcast(tf.ones([2]), tf.constant(0))
            again = group.broadcast(tf.ones([3]), tf.constant(1))
            last = group.all_reduce(tf.ones([5]))
            return first, sent, again, last

        return mirrored.run(replica_fn)

    graph = run.get_concrete_function().graph
    device = "CPU:0"
    reduces = [
        op
        for op in graph.get_operations()
        if op.type == "CollectiveReduceV2" and op.device.endswith(device)
    ]
    conds = [
        op
        for op in graph.get_operations()
        if op.type in ("If", "StatelessIf") and op.device.endswith(device)
    ]
    assert len(reduces) == 2 and len(conds) == 2, (reduces, conds)
    first, last = sorted(reduces, key=lambda op: op.inputs[0].shape[0])
    sent, again = sorted(conds, key=lambda op: op.outputs[0].shape[0])
    assert first in ancestors(sent)
    assert sent in ancestors(again)
    assert again in ancestors(last)
