"""HiTopKComm (the hierarchical communicator) in one process: hosts from
the cluster spec, bad topologies, degenerate layouts, and the unequal
gather it relies on. Against numpy on real workers:
tests/multiworker/test_paper_algorithms.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import communicators, compressors
from tfgc.communicators import fusion
from tfgc.communicators.topology import Topology


def _topology(hosts, from_spec=True):
    return Topology(tuple(hosts), ("/cpu:0",), "test", from_spec)


def test_hierarchical_reads_hosts_from_the_cluster_spec():
    h = communicators.Hierarchical(dense_threshold=100)
    h.build(_topology([0, 0, 1, 1]))
    assert (h.num_hosts, h.per_host, h.num_peers) == (2, 2, 2)
    assert h.compressed_shape((101, 30)) == (51, 30)
    assert h.compressed_shape((3, 3, 16, 8)) == (72, 8)
    assert h.compressed_shape((20001,)) == (10001,)
    assert h.compressed_shape((9, 9)) == (9, 9)  # under the threshold
    assert h.sends_dense((9, 9)) and not h.sends_dense((101, 30))


def test_hierarchical_with_one_host_sends_everything_dense():
    h = communicators.Hierarchical(workers_per_host=4, dense_threshold=0)
    h.build(_topology([0, 0, 0, 0], from_spec=False))
    assert h.sends_dense((1000, 1000))
    assert h.compressed_shape((1000, 1000)) == (1000, 1000)


@pytest.mark.parametrize(
    "hosts, kwargs, match",
    [
        ([0], {}, "at least 2 workers"),
        ([0, 0, 0, 1], {}, "same number of workers on every host"),
        ([0, 0, 1, 1], {"workers_per_host": 3}, "must divide"),
        ([0, 0, 1, 1], {"workers_per_host": 4}, "disagrees with the cluster"),
        ([0, 0, 1, 1], {"workers_per_host": 1}, "disagrees with the cluster"),
    ],
)
def test_hierarchical_bad_topologies(hosts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        communicators.Hierarchical(**kwargs).build(_topology(hosts))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"workers_per_host": 0}, "`workers_per_host`"),
        ({"workers_per_host": 2.0}, "`workers_per_host`"),
        ({"dense_threshold": -1}, "`dense_threshold`"),
    ],
)
def test_hierarchical_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        communicators.Hierarchical(**kwargs)


def test_hierarchical_config_round_trip():
    h = communicators.Hierarchical(workers_per_host=2, dense_threshold=77)
    restored = communicators.get(communicators.serialize(h))
    assert isinstance(restored, communicators.Hierarchical)
    assert restored.get_config() == h.get_config()


def test_hierarchical_optimizer_with_one_replica_fails_at_build():
    opt = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1),
        compressors.MSTopK(),
        communicator="hierarchical",
    )
    with pytest.raises(ValueError, match="at least 2 workers"):
        opt.build([keras.Variable(np.zeros((200, 200), "float32"))])


def _train(strategy, compressor, communicator, steps=3):
    with strategy.scope():
        kernel = keras.Variable(np.zeros((96, 300), "float32"))
        bias = keras.Variable(np.zeros((10,), "float32"))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1),
            compressor=compressor,
            communicator=communicator,
            min_compress_size=100,
        )
        opt.build([kernel, bias])

    @tf.function
    def step(s):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.random.stateless_normal((96, 300), seed=[r, s]) ** 3
            opt.apply([g, tf.ones(10) * tf.cast(r, tf.float32)], [kernel, bias])

        strategy.run(replica_fn)

    for s in range(steps):
        step(tf.constant(s))
    return kernel.numpy(), bias.numpy(), opt.compression_stats()


def test_hierarchical_degenerate_layouts(mirrored):
    def hier(g):
        return communicators.Hierarchical(
            workers_per_host=g, dense_threshold=1000
        )

    flat, _, flat_stats = _train(mirrored, compressors.MSTopK(0.01), "auto")
    one_per_host, _, stats = _train(mirrored, compressors.MSTopK(0.01), hier(1))
    np.testing.assert_allclose(one_per_host, flat, rtol=1e-6, atol=1e-6)
    assert stats["sent_bytes"] == flat_stats["sent_bytes"]
    assert stats["intra_host_bytes"] == 0
    dense, _, _ = _train(mirrored, compressors.Identity(), "auto")
    one_host, _, _ = _train(mirrored, compressors.MSTopK(0.01), hier(4))
    np.testing.assert_allclose(one_host, dense, rtol=1e-5, atol=1e-5)
    # Everything selected: the two-level exchange must give the dense sum.
    full, bias, stats = _train(mirrored, compressors.MSTopK(1.0), hier(2))
    np.testing.assert_allclose(full, dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bias, -0.1 * 3 * sum(range(NUM_LOGICAL_CPUS)))
    # Bytes between hosts: each worker's shard payload (k values + k int32
    # indices of 48 x 300 entries) and the dense bias.
    assert stats["sent_bytes"] == 48 * 300 * 8 + 10 * 4
    assert stats["intra_host_bytes"] == 3 * 48 * 300 * 4


def test_ragged_gather_carries_unequal_sizes_and_dtypes(mirrored):
    # Several tensors of a dtype are unpacked together: sub-word ones (each
    # member's copy padded to a word), 8-byte ones, interleaved with others.
    dtypes = [tf.float32, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.uint8]
    dtypes += [tf.uint8, tf.float32, tf.int64, tf.uint8, tf.float16]

    def values(r, i, dtype):
        n = 3 * r + i  # replica 0 sends an empty tensor for i == 0
        return tf.cast(tf.range(n) * (i + 1) + 10 * r, dtype)

    @tf.function
    def run():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            tensors = [values(r, i, d) for i, d in enumerate(dtypes)]
            group = communicators.Auto().group()
            return fusion.all_gather_ragged(tensors, group)

        return mirrored.run(replica_fn)

    gathered, overhead = run()
    for local in mirrored.experimental_local_results(gathered):
        for i, (rows, dtype) in enumerate(zip(local, dtypes)):
            assert rows.dtype == dtype
            for r in range(NUM_LOGICAL_CPUS):
                np.testing.assert_array_equal(
                    rows[r].numpy(), values(r, i, dtype).numpy()
                )
    # Replica 0's buffer: a header word per tensor + its data, padded to
    # the longest buffer's rung of the ladder, plus its length word.
    sizes = [d.size for d in dtypes]
    words = [
        sum(-(-(3 * r + i) * s // 4) for i, s in enumerate(sizes)) + len(sizes)
        for r in range(NUM_LOGICAL_CPUS)
    ]
    rung = min(x for x in communicators.collectives.LADDER if x >= max(words))
    own = sum(i * s for i, s in enumerate(sizes))
    first = mirrored.experimental_local_results(overhead)[0]
    assert int(first) == 4 * rung + 4 - own


# --- the intra-host sum: reduce-scatter where TensorFlow has one --------------

_GPU = "/job:worker/replica:0/task:0/device:GPU:0"
_CPU = "/job:worker/replica:0/task:0/device:CPU:0"
_LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
_IMPL = tf.distribute.experimental.CommunicationImplementation


@pytest.mark.parametrize(
    "device_type, implementation, expected",
    [
        ("CPU", "AUTO", False),
        ("CPU", "RING", False),
        ("CPU", "NCCL", False),
        (None, "NCCL", False),  # no device named: the default, a CPU
        ("GPU", "NCCL", True),
        ("GPU", "nccl", True),
        ("GPU", "RING", False),
        # TensorFlow maps "auto" to NCCL only under the session option
        # `collective_nccl`, which its eager strategies do not set.
        ("GPU", "AUTO", False),
    ],
)
def test_reduce_scatter_only_on_gpus_with_nccl(
    device_type, implementation, expected
):
    has = communicators.collectives.has_reduce_scatter
    assert has(device_type, implementation) is expected


def _group(device, implementation=None, members=(0, 1)):
    options = None
    if implementation is not None:
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation
        )
    topology = Topology((0,) * len(members), (device,), "test", False)
    return communicators.collectives.Group(topology, members, 0, options)


def test_group_reads_its_device_and_options_for_the_reduce_scatter():
    assert _group(_GPU, _IMPL.NCCL).has_reduce_scatter
    assert not _group(_GPU).has_reduce_scatter
    assert not _group(_GPU, _IMPL.RING).has_reduce_scatter
    assert not _group(_CPU, _IMPL.NCCL).has_reduce_scatter


@pytest.mark.parametrize("implementation", [_IMPL.NCCL, _IMPL.RING, None])
def test_group_passes_its_hint_as_tensorflow_reads_it(implementation):
    # TensorFlow's resolver picks NCCL only for the hint "nccl", verbatim;
    # CommunicationImplementation's values are upper case.
    group = _group(_LOCAL_CPU, implementation)
    graph = (
        tf.function(lambda x: (group.all_reduce(x), group.all_gather(x)))
        .get_concrete_function(tf.TensorSpec([2], tf.float32))
        .graph
    )
    hints = {
        op.get_attr("communication_hint")
        for op in graph.get_operations()
        if op.type.startswith("Collective")
    }
    expected = implementation.value.lower() if implementation else "auto"
    assert hints == {expected.encode()}


def test_group_reduce_scatter_refuses_while_tracing():
    # Both refusals come before any collective is issued, so nothing runs.
    with pytest.raises(ValueError, match="only on GPUs with NCCL"):
        _group(_CPU, _IMPL.NCCL).reduce_scatter(tf.zeros([4]))
    with pytest.raises(ValueError, match="divisible by the group size"):
        _group(_GPU, _IMPL.NCCL).reduce_scatter(tf.zeros([5]))
    with pytest.raises(ValueError, match="1-D tensor"):
        _group(_GPU, _IMPL.NCCL).reduce_scatter(tf.zeros([2, 2]))
    one = _group(_CPU, members=(0,))
    np.testing.assert_array_equal(one.reduce_scatter(tf.ones([3])), [1, 1, 1])


@pytest.mark.parametrize(
    "device, implementation, expected",
    [
        (_CPU, None, "all_reduce_and_slice"),
        (_CPU, _IMPL.NCCL, "all_reduce_and_slice"),
        (_GPU, _IMPL.NCCL, "reduce_scatter"),
        (_GPU, _IMPL.RING, "all_reduce_and_slice"),
        (_GPU, _IMPL.AUTO, "all_reduce_and_slice"),
    ],
)
def test_hierarchical_names_its_intra_host_reduce(
    device, implementation, expected
):
    options = None
    if implementation is not None:
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation
        )
    h = communicators.Hierarchical(options=options)
    with pytest.raises(ValueError, match="not built"):
        h.intra_host_reduce  # noqa: B018
    h.build(Topology((0, 0, 1, 1), (device,), "test", True))
    assert h.intra_host_reduce == expected


class _FakeHost:
    """A host group of `size` members that all hold the same blocks: the
    collectives are computed locally, so no reduce-scatter runs on CPU."""

    def __init__(self, size, rank, has_reduce_scatter):
        self.size, self.rank = size, rank
        self.has_reduce_scatter = has_reduce_scatter
        self.calls = []

    def all_reduce(self, buffer):
        self.calls.append("all_reduce")
        return buffer * self.size

    def reduce_scatter(self, buffer):
        self.calls.append("reduce_scatter")
        return tf.reshape(buffer, [self.size, -1])[self.rank] * self.size


@pytest.mark.parametrize("rank", [0, 2])
def test_both_intra_host_sums_give_each_worker_its_shard(rank):
    h = communicators.Hierarchical(dense_threshold=0)
    h.build(_topology([0, 0, 0, 1, 1, 1]))
    tensors = [
        tf.reshape(tf.range(20, dtype=tf.float32), (5, 4)),
        tf.range(7, dtype=tf.float64),
        tf.reshape(tf.range(30, dtype=tf.float32), (10, 3)) * -1,
    ]
    blocks = [h._blocks(t, 3) for t in tensors]
    results = {}
    for has in (True, False):
        host = _FakeHost(3, rank, has)
        results[has] = h._host_shard_sums(blocks, host)
        expected = "reduce_scatter" if has else "all_reduce"
        assert host.calls == [expected] * 2  # one collective per dtype
    for block, scattered, sliced in zip(blocks, results[True], results[False]):
        want = 3 * block.numpy()[rank]
        np.testing.assert_array_equal(scattered.numpy(), want)
        np.testing.assert_array_equal(sliced.numpy(), want)


def test_intra_host_bytes_count_the_block_and_a_shard_for_either_sum():
    block = tf.zeros((3, 48 * 300), tf.float32)
    # The block into step 1 (all-reduce or reduce-scatter alike, before
    # the transport factor) and one shard into step 4's gather.
    assert communicators.hierarchical._intra_host_bytes(block) == (
        4 * 48 * 300 * 4
    )
