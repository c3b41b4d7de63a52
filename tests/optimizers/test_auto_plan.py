"""`compressor="auto"`: the planner's cost model, its choices from given
costs, its measurements on replicas, and training by its plan."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests.optimizers.test_buckets import _fit
from tfgc import communicators, compressors
from tfgc.communicators.topology import Topology
from tfgc.core import bucket_costs
from tfgc.core.bucket_costs import (
    CodecCosts,
    CollectiveCosts,
    Line,
    TensorLoad,
)
from tfgc.optimizers import auto_plan, codec_timing, plan_clock, planning

AR, AG = compressors.ALL_REDUCE, compressors.ALL_GATHER


# --- the cost model ---------------------------------------------------------


def test_a_line_through_two_points_is_never_below_zero():
    line = Line.through(10, 2.0, 110, 7.0)
    assert line == pytest.approx((1.5, 0.05))
    assert line(30) == pytest.approx(3.0)
    # A slower small point (noise) gives a flat line, not a negative slope.
    assert Line.through(10, 5.0, 110, 4.0) == (5.0, 0.0)
    assert Line.through(10, 0.0, 110, 100.0).fixed == 0.0


def test_codec_costs_are_solved_from_two_workloads():
    truth = CodecCosts(per_tensor=2e-4, per_element=3e-9)
    one = (1, 2**20, truth.seconds(1, 2**20))
    many = (16, 16 * 4096, truth.seconds(16, 16 * 4096))
    assert CodecCosts.solve(one, many) == pytest.approx(truth)


def test_a_buckets_seconds_add_its_codec_and_one_collective_per_round():
    links = CollectiveCosts(Line(1e-3, 1e-9), Line(2e-3, 4e-9))
    codec = CodecCosts(1e-4, 1e-8)
    # Two compressed tensors gathered, one dense tensor all-reduced.
    loads = [
        TensorLoad(AG, 1, 800, 1000),
        TensorLoad(AG, 1, 200, 3000),
        TensorLoad(AR, 1, 4000, 0),
    ]
    expected = (2e-4 + 4000e-8) + (2e-3 + 1000 * 4e-9) + (1e-3 + 4000e-9)
    assert bucket_costs.bucket_seconds([loads], codec, links) == (
        pytest.approx(expected)
    )
    # Two rounds (PowerSGD): two all-reduces, the bytes split between them.
    two = [TensorLoad(AR, 2, 1000, 100)]
    expected = codec.seconds(1, 100) + 2 * (1e-3 + 500e-9)
    assert bucket_costs.bucket_seconds([two], codec, links) == (
        pytest.approx(expected)
    )
    # Phases (ACP-SGD's P and Q steps): their mean.
    p, q = [TensorLoad(AR, 1, 100, 10)], [TensorLoad(AR, 1, 300, 10)]
    mean = bucket_costs.bucket_seconds([p, q], codec, links)
    assert mean == pytest.approx(
        (
            bucket_costs.bucket_seconds([p], codec, links)
            + bucket_costs.bucket_seconds([q], codec, links)
        )
        / 2
    )


def test_buckets_go_on_the_wire_one_after_another():
    # The second bucket is ready early and waits for the first.
    assert bucket_costs.pipelined_seconds([0.0, 0.1], [1.0, 1.0]) == 2.0
    # The second is ready late: the wire waits for it.
    assert bucket_costs.pipelined_seconds([0.0, 5.0], [1.0, 1.0]) == 6.0


def test_a_bucket_is_compressed_while_the_one_before_travels():
    # Each 1 s exchange is 0.4 s of codec: bucket 1 (ready at 0.1 s) is
    # compressed by 0.5 s, while bucket 0 is on the wire until 1 s.
    ready, exchange, compute = [0.0, 0.1], [1.0, 1.0], [0.4, 0.4]
    assert bucket_costs.pipelined_seconds(
        ready, exchange, compute
    ) == pytest.approx(1.6)
    # Ready late: its codec and collectives follow, 1 s in all.
    assert bucket_costs.pipelined_seconds(
        [0.0, 5.0], exchange, compute
    ) == pytest.approx(6.0)
    # No codec time: as without `compute`.
    assert bucket_costs.pipelined_seconds(ready, exchange, [0.0, 0.0]) == 2.0


def test_the_codec_part_of_a_buckets_seconds():
    codec = CodecCosts(per_tensor=1e-4, per_element=1e-8)
    links = CollectiveCosts(Line(1e-3, 1e-9), Line(2e-3, 2e-9))
    p = [TensorLoad(AR, 1, 100, 10), TensorLoad(AR, 1, 40, 0)]
    q = [TensorLoad(AR, 1, 300, 30)]
    compute = bucket_costs.codec_seconds([p, q], codec)
    # Only the compressed tensors, the mean over the phases.
    assert compute == pytest.approx(
        (codec.seconds(1, 10) + codec.seconds(1, 30)) / 2
    )
    total = bucket_costs.bucket_seconds([p, q], codec, links)
    wire = (links.seconds(AR, 140) + links.seconds(AR, 300)) / 2
    assert total == pytest.approx(compute + wire)


# --- the Auto argument ------------------------------------------------------


@pytest.mark.parametrize(
    "candidate, match",
    [
        (compressors.SBC(0.01), "weight updates"),
        (compressors.RedSync(0.01, cost_model=None), "momentum|one fixed"),
        (compressors.ImportancePruning(0.01), "reads the weights"),
        (compressors.PowerSGD(rank=2, warmup_steps=5), "warm-up"),
    ],
)
def test_auto_refuses_what_it_cannot_predict(candidate, match):
    with pytest.raises(ValueError, match=match):
        compressors.Auto(candidates=["identity", candidate])


def test_auto_checks_its_arguments():
    with pytest.raises(ValueError, match="at least one"):
        compressors.Auto(candidates=[])
    with pytest.raises(ValueError, match="differ"):
        compressors.Auto(candidates=["topk", "topk"])
    with pytest.raises(ValueError, match="indices into `candidates`"):
        compressors.Auto(candidates=["identity", "topk"], choices=[0, 2])
    with pytest.raises(ValueError, match="min_speedup"):
        compressors.Auto(min_speedup=0.5)
    with pytest.raises(TypeError, match="not a codec"):
        compressors.Auto().compress(None, None, None)


def test_auto_is_saved_with_the_optimizer():
    auto = compressors.Auto(
        candidates=["identity", compressors.TopK(0.001)],
        choices=[1, 0],
        min_speedup=1.2,
    )
    opt = tfgc.CompressedOptimizer(keras.optimizers.SGD(0.1), auto)
    again = tfgc.CompressedOptimizer.from_config(opt.get_config())
    assert again.compressor == auto
    assert again.compressor.candidates[1] == compressors.TopK(0.001)
    by_name = tfgc.CompressedOptimizer(keras.optimizers.SGD(0.1), "auto")
    assert by_name.compressor == compressors.Auto()
    assert [type(c).__name__ for c in by_name.compressor.candidates] == [
        "Identity",
        "FP16",
        "TopK",
        "MSTopK",
        "PowerSGD",
        "ACPSGD",
    ]


def test_auto_refuses_communicators_it_cannot_plan_for():
    with pytest.raises(ValueError, match="cannot carry"):
        tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1), "auto", communicator="allreduce"
        )
    # All-reduced candidates only: accepted; and the hierarchical
    # communicator, which carries every payload.
    tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1),
        compressors.Auto(candidates=["identity", "fp16", "powersgd"]),
        communicator="allreduce",
    )
    tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1), "auto", communicator="hierarchical"
    )


# --- choices from given costs -----------------------------------------------


class _Variable:
    def __init__(self, *shape):
        self.shape = shape
        self.dtype = "float32"


class _FourWorkers(type(communicators.get("auto"))):
    num_peers = 4


def _choose(candidates, collectives, codecs):
    """The choices for a 2048 x 2048 kernel and a 16-element bias among 4
    workers, each in a bucket of its own, every tensor compressed."""
    auto = compressors.Auto(candidates=candidates)
    flat = _FourWorkers()
    settings = planning.Settings(auto, flat, True, 0, 0, 0)
    variables = [_Variable(2048, 2048), _Variable(16)]
    return auto_plan.choose(
        settings, variables, [[1], [0]], flat, collectives, codecs
    )


TOPK = compressors.TopK(0.01)
CHEAP_TOPK = (CodecCosts(0.0, 0.0), CodecCosts(1e-5, 1e-9))


def test_a_slow_link_compresses_large_buckets_and_not_small_ones():
    slow = CollectiveCosts(Line(1e-4, 8e-8), Line(1e-4, 8e-8))  # 100 Mbit/s
    small, large = _choose(["identity", TOPK], slow, CHEAP_TOPK)
    assert large.choice == 1  # 16 MiB: 1.3 s dense against 18 ms sparse
    assert small.choice == 0  # 16 elements: TopK only adds its own time
    assert large.seconds[0] == pytest.approx(1e-4 + 8e-8 * 2048 * 2048 * 4)
    assert large.dense_seconds == pytest.approx(large.seconds[0])


def test_a_fast_link_keeps_every_bucket_dense():
    fast = CollectiveCosts(Line(1e-5, 1e-11), Line(1e-5, 1e-11))
    codecs = (CodecCosts(0.0, 0.0), CodecCosts(1e-5, 1e-9))
    assert [b.choice for b in _choose(["identity", TOPK], fast, codecs)] == [
        0,
        0,
    ]


def test_a_compressor_that_is_barely_faster_leaves_the_bucket_dense():
    link = CollectiveCosts(Line(0.0, 1e-9), Line(0.0, 1e-9))
    dense_time = 1e-9 * 2048 * 2048 * 4
    # TopK's own time brings it to 0.98x dense: within min_speedup (1.05).
    sparse_bytes = TOPK.payload_bytes((2048, 2048), "float32")
    per_element = (0.98 * dense_time - 1e-9 * sparse_bytes) / (2048 * 2048)
    codecs = (CodecCosts(0.0, 0.0), CodecCosts(0.0, per_element))
    _, large = _choose(["identity", TOPK], link, codecs)
    assert large.seconds[1] == pytest.approx(0.98 * large.seconds[0])
    assert large.choice == 0


def _joined_choices(collectives, codecs):
    """(each unit's own choice, the choices counting joins) for three
    2048 x 2048 kernels, a unit each, among 4 workers: identity, TopK at
    1 % and ACP-SGD at rank 4."""
    auto = compressors.Auto(
        candidates=["identity", TOPK, compressors.ACPSGD(rank=4)]
    )
    flat = _FourWorkers()
    settings = planning.Settings(auto, flat, True, 0, 0, 0)
    variables = [_Variable(2048, 2048) for _ in range(3)]
    units = [[2], [1], [0]]
    per_unit = auto_plan.choose(
        settings, variables, units, flat, collectives, codecs
    )
    joined = auto_plan.choose_joined(
        settings, variables, units, flat, collectives, codecs, per_unit
    )
    return [b.choice for b in per_unit], joined


# TopK's codec a quarter of ACP-SGD's per element.
TOPK_FASTER = (
    CodecCosts(0.0, 0.0),
    CodecCosts(0.0, 1e-9),
    CodecCosts(0.0, 4e-9),
)


def test_units_share_a_joining_codec_where_one_cost_beats_faster_codecs():
    # 50 ms fixed a collective: TopK per unit 54.5 ms, ACP-SGD 66.8 ms,
    # dense 66.8 ms; ACP-SGD's three units in one bucket 100.5 ms
    # against TopK's 163.6 ms.
    slow = CollectiveCosts(Line(0.05, 1e-9), Line(0.05, 1e-9))
    own, joined = _joined_choices(slow, TOPK_FASTER)
    assert own == [1, 1, 1]
    assert joined == [2, 2, 2]
    # Without fixed costs, joining saves nothing: TopK stays.
    free = CollectiveCosts(Line(0.0, 1e-9), Line(0.0, 1e-9))
    assert _joined_choices(free, TOPK_FASTER) == ([1, 1, 1], [1, 1, 1])


def test_a_join_is_weighed_against_dense_as_one_bucket_is():
    # Everything fixed cost: one dense all-reduce per unit (3 x 50 ms)
    # against ACP-SGD's one for all three (50 ms, counted 1.05x) and its
    # codec; ACP-SGD's codec at 30 ms per unit makes it 1.05 x 140 ms
    # against 150: joined. At 35 ms, 1.05 x 155 > 150: dense.
    fixed = CollectiveCosts(Line(0.05, 0.0), Line(0.05, 0.0))
    for per_unit_codec, expected in ((0.030, [2, 2, 2]), (0.035, [0, 0, 0])):
        codecs = (
            CodecCosts(0.0, 0.0),
            CodecCosts(1.0, 0.0),  # TopK out of the running
            CodecCosts(per_unit_codec, 0.0),
        )
        assert _joined_choices(fixed, codecs)[1] == expected


def test_hierarchical_buckets_add_the_hosts_collectives_to_every_candidate():
    """Under the hierarchical communicator a candidate's payload is its
    shard's, among the hosts; every candidate of a sharded gradient also
    pays the sum and the gather inside the host, and a gradient under the
    threshold goes dense among all workers."""
    h = communicators.Hierarchical(dense_threshold=100)
    h.build(Topology((0, 0, 1, 1), ("/cpu:0",), "test", True))
    costs = CollectiveCosts(
        Line(1e-3, 1e-9),  # among the hosts
        Line(2e-3, 2e-9),
        host_reduce=Line(1e-4, 1e-10),
        host_gather=Line(2e-4, 2e-10),
        everyone=Line(5e-3, 5e-9),
    )
    auto = compressors.Auto(candidates=["identity", TOPK])
    settings = planning.Settings(auto, h, True, 0, 0, 0)
    kernel, bias = _Variable(64, 64), _Variable(16)
    codecs = (CodecCosts(0.0, 0.0), CodecCosts(0.0, 1e-9))
    small, large = auto_plan.choose(
        settings, [kernel, bias], [[1], [0]], h, costs, codecs
    )
    shard = 32 * 64 * 4  # half the rows, a host's two workers
    inside = 1e-4 + 1e-10 * 2 * shard + 2e-4 + 2e-10 * shard
    assert large.seconds[0] == pytest.approx(1e-3 + 1e-9 * shard + inside)
    sparse = TOPK.payload_bytes((32, 64), "float32")
    assert large.seconds[1] == pytest.approx(
        1e-9 * 32 * 64 + 2e-3 + 2e-9 * sparse + inside
    )
    assert large.dense_seconds == pytest.approx(large.seconds[0])
    # 16 elements, under the threshold: dense among all four, either way.
    assert small.seconds == pytest.approx((5e-3 + 5e-9 * 64,) * 2)


def test_the_hierarchical_communicator_keeps_units_apart():
    """Each unit is also summed whole inside the host: joined, that sum
    would wait for the last unit's gradients."""
    h = communicators.Hierarchical(dense_threshold=0)
    h.build(Topology((0, 0, 1, 1), ("/cpu:0",), "test", True))
    auto = compressors.Auto(candidates=["identity", compressors.ACPSGD(1)])
    settings = planning.Settings(auto, h, True, 0, 0, 0)
    variables = [_Variable(8, 8), _Variable(8, 8)]
    units = [[1], [0]]
    assert auto_plan.join(settings, variables, units, [1, 1], h) == [
        ([1], 1, 1),
        ([0], 1, 1),
    ]
    flat = _FourWorkers()
    joined = auto_plan.join(
        settings._replace(communicator=flat), variables, units, [1, 1], flat
    )
    assert joined == [([1, 0], 1, 2)]


def test_a_route_without_a_measured_line_is_refused():
    flat = CollectiveCosts(Line(1e-3, 1e-9), Line(1e-3, 1e-9))
    with pytest.raises(ValueError, match="'host_reduce'"):
        flat.seconds(bucket_costs.HOST_REDUCE, 100)


# --- on replicas --------------------------------------------------------------


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(4),
        ]
    )


def _planned(strategy, auto, **options):
    """(model, optimizer): the small model compiled in `strategy` with
    `auto` in buckets of 600 bytes (`options`: the optimizer's others)."""
    with strategy.scope():
        model = _model()
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1), auto, bucket_bytes=600, **options
        )
        model.compile(opt, "mse")
    return model, opt


def test_a_gathered_payload_is_decompressed_as_from_every_peer():
    """The codec is timed decompressing as many payloads as the step's
    workers send it: its own, stacked once per peer."""
    topk = compressors.TopK(0.25)
    x = tf.constant(np.random.default_rng(0).standard_t(3, (16, 8)), tf.float32)
    key = tf.constant([1, 2], tf.int64)
    payload, ctx = topk.compress(x, topk.init_state(x.shape, x.dtype, key), key)
    once = tf.nest.map_structure(lambda t: t[None], payload)
    (four,) = codec_timing.as_from_peers([once], [AG], 4)
    assert four.values.shape[0] == 4
    np.testing.assert_allclose(
        topk.decompress(four, ctx)[0], 4 * topk.decompress(once, ctx)[0]
    )
    (same,) = codec_timing.as_from_peers([x], [AR], 4)  # a sum: as it is
    assert same is x


def test_auto_measures_the_replicas_and_prints_its_table(
    mirrored, capsys, monkeypatch
):
    peers = []

    def as_from_peers(received, kinds, count):
        peers.append(count)
        return received

    monkeypatch.setattr(codec_timing, "as_from_peers", as_from_peers)
    model, opt = _planned(
        mirrored,
        compressors.Auto(candidates=["identity", TOPK], trial_steps=None),
    )
    with mirrored.scope():
        opt.build(model.trainable_variables)
    assert set(peers) == {4}  # every codec timed as among 4 workers
    plan = opt.plan
    assert plan.num_peers == 4
    assert plan.collectives.all_reduce.slope > 0
    assert len(plan.codecs) == 2
    assert plan.codecs[1].per_element > 0  # a selection costs something
    # Buckets of 600 bytes from the last variable: the last two layers'
    # biases and the last kernel (336 bytes), then a tensor each.
    assert [b.variables for b in plan.buckets] == [(5, 4, 3), (2,), (1,), (0,)]
    for bucket in plan.buckets:
        assert len(bucket.seconds) == 2
        assert bucket.choice == auto_plan.pick(opt.compressor, bucket.seconds)
    printed = capsys.readouterr().out
    assert (
        "| bucket | units | tensors | elements | MiB | Identity ms" in printed
    )
    assert plan.table() in printed
    # The plan's compressors are the optimizer's.
    for bucket in plan.buckets:
        for i in bucket.variables:
            compressor = opt._plans[i].compressor
            chosen = plan.candidates[bucket.choice]
            assert compressor == chosen or (
                compressor == compressors.ErrorFeedback(chosen)
            )


def _auto(choices):
    return lambda: compressors.Auto(
        candidates=["identity", compressors.TopK(0.1)], choices=choices
    )


def test_a_plan_of_one_codec_trains_as_that_codec(mirrored):
    """Given choices, nothing is measured, and the weights are bit for bit
    those of the fixed compressor in the same buckets."""
    for choice, fixed in ((0, compressors.Identity), (1, _topk)):
        planned = _fit(mirrored, _auto([choice] * 4), 600, {})
        alone = _fit(mirrored, fixed, 600, {})
        for a, b in zip(planned, alone):
            np.testing.assert_array_equal(a, b)


def _topk():
    return compressors.TopK(0.1)


def _two_hosts():
    """Two hosts of two of the four replicas, every gradient sharded."""
    return {
        "communicator": communicators.Hierarchical(
            workers_per_host=2, dense_threshold=0
        )
    }


def test_a_plan_under_the_hierarchical_communicator_trains_as_its_codec(
    mirrored,
):
    planned = _fit(mirrored, _auto([1] * 4), 600, _two_hosts())
    alone = _fit(mirrored, _topk, 600, _two_hosts())
    for a, b in zip(planned, alone):
        np.testing.assert_array_equal(a, b)


def test_auto_measures_the_hosts_collectives_under_the_hierarchical_one(
    mirrored,
):
    auto = compressors.Auto(
        candidates=["identity", TOPK], trial_steps=None, verbose=False
    )
    model, opt = _planned(mirrored, auto, **_two_hosts())
    with mirrored.scope():
        opt.build(model.trainable_variables)
    plan = opt.plan
    assert plan.num_peers == 2  # the codecs' payloads travel among hosts
    for line in plan.collectives:
        assert line is not None and line.fixed >= 0
    assert plan.collectives.host_reduce.slope > 0
    assert plan.table().startswith("tfgc Auto plan, 2 hosts (hierarchical)")
    x = np.random.default_rng(0).normal(size=(64, 12)).astype("float32")
    model.fit(x, np.zeros((64, 4)), batch_size=32, verbose=0)
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)


ACPSGD = compressors.ACPSGD(rank=2)


def _acpsgd_plan(choices):
    return lambda: compressors.Auto(
        candidates=["identity", ACPSGD], choices=choices, verbose=False
    )


def test_units_that_chose_a_codec_with_its_own_buckets_are_joined(mirrored):
    """ACP-SGD sizes its buckets by what it sends: units that chose it
    side by side become one exchange bucket, as ACP-SGD alone makes; the
    plan's choices stay one per unit, to be given back."""
    for choices, groups in (
        ([1, 1, 1, 1], [(5, 4, 3, 2, 1, 0)]),
        ([1, 1, 0, 1], [(5, 4, 3, 2), (1,), (0,)]),
        ([0, 0, 1, 1], [(5, 4, 3), (2,), (1, 0)]),
    ):
        model, opt = _planned(mirrored, _acpsgd_plan(choices)())
        with mirrored.scope():
            opt.build(model.trainable_variables)
        assert [b.variables for b in opt.plan.buckets] == groups
        assert opt.plan.choices == tuple(choices)
        assert sum(b.units for b in opt.plan.buckets) == 4
    # Dense units are never joined, nor a codec without sizes of its own.
    model, opt = _planned(mirrored, _auto([1, 1, 1, 1])())
    with mirrored.scope():
        opt.build(model.trainable_variables)
    assert len(opt.plan.buckets) == 4


def test_a_join_stays_within_the_codecs_own_bucket_size():
    small = compressors.ACPSGD(rank=1, bucket_bytes=100)
    settings = planning.Settings(
        compressors.Auto(candidates=["identity", small]),
        _FourWorkers(),
        True,
        0,
        0,
        0,
    )
    variables = [_Variable(8, 8), _Variable(8), _Variable(8, 8), _Variable(8)]
    units = [[3, 2], [1, 0]]
    # Each unit sends, in either phase, one 8-float factor of its kernel
    # and its bias dense: 64 bytes; two would be 128, over 100.
    joined = auto_plan.join(
        settings, variables, units, [1, 1], settings.communicator
    )
    assert joined == [([3, 2], 1, 1), ([1, 0], 1, 1)]
    roomy = settings._replace(
        compressor=compressors.Auto(
            candidates=["identity", compressors.ACPSGD(rank=1)]
        )
    )
    joined = auto_plan.join(roomy, variables, units, [1, 1], roomy.communicator)
    assert joined == [([3, 2, 1, 0], 1, 2)]


def test_a_plan_of_a_codec_with_its_own_buckets_trains_as_that_codec(
    mirrored,
):
    planned = _fit(mirrored, _acpsgd_plan([1] * 4), 600, {})
    alone = _fit(mirrored, lambda: ACPSGD, 600, {})
    for a, b in zip(planned, alone):
        np.testing.assert_array_equal(a, b)


def test_a_mixed_plan_sends_each_bucket_by_its_codec(mirrored):
    model, opt = _planned(mirrored, _auto([1, 0, 1, 0])(), min_compress_size=0)
    x = np.random.default_rng(0).normal(size=(32, 12)).astype("float32")
    model.fit(x, np.zeros((32, 4)), batch_size=32, epochs=1, verbose=0)
    assert opt.plan.reason == "given"
    assert opt.plan.collectives is None
    kinds = [type(p.compressor).__name__ for p in opt._plans]
    # Bucket 0 holds variables 5, 4 and 3, bucket 1 variable 2, and so on.
    assert kinds == [
        "Identity",
        "ErrorFeedback",
        "Identity",
        "ErrorFeedback",
        "ErrorFeedback",
        "ErrorFeedback",
    ]
    sent = opt.compression_stats()["sent_bytes"]
    dense = opt.compression_stats()["dense_bytes"]
    assert 0 < sent < dense


def test_choices_for_another_model_are_refused(mirrored):
    with mirrored.scope():
        model = _model()
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1), _auto([0, 1])(), bucket_bytes=600
        )
        with pytest.raises(ValueError, match="names 2 buckets.*make 4"):
            opt.build(model.trainable_variables)


def test_one_worker_sends_dense_without_measuring():
    model = _model()
    opt = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1),
        compressors.Auto(candidates=[TOPK, "identity"], verbose=False),
    )
    opt.build(model.trainable_variables)
    assert opt.plan.choices == (1,)
    assert opt.plan.reason == "one worker, nothing to exchange"


# --- measured against predicted -----------------------------------------------


def _clock(buckets):
    def add_variable(shape, dtype, aggregation, name):
        del aggregation
        return tf.Variable(tf.zeros(shape, dtype), name=name)

    return plan_clock.Clock.create(add_variable, buckets)


class _Alone:
    size = 1


def test_the_clock_times_each_bucket_from_when_it_could_start():
    clock = _clock(2)
    # Exchanges 10 s apart; bucket 1 ready 1 s after bucket 0, which is
    # on the wire until 3 s after its ready stamp; bucket 1 done at 4 s.
    for n in range(plan_clock.SETTLE + 2):
        t = 10.0 * n
        stamps = tf.constant([[t, t + 1.0], [t + 3.0, t + 4.0]], tf.float64)
        plan_clock.record(clock, tf.unstack(stamps[0]), tf.unstack(stamps[1]))
        plan_clock.share_when_due(clock, _Alone())
    found = plan_clock.report(
        [v.numpy() for v in clock.sums()], predicted=(1.0, 0.5)
    )
    assert found.exchanges == 2
    assert found.step == pytest.approx(10.0)
    assert found.busy == pytest.approx((3.0, 1.0))  # 1 waited for 0
    assert found.exposed == pytest.approx(3.0)  # 4 s - the last ready
    # Predicted: bucket 0 from 0 to 1 s, bucket 1 from 1 to 1.5 s.
    assert found.predicted_exposed == pytest.approx(0.5)
    assert found.predicted_step == pytest.approx(10.0 - 3.0 + 0.5)
    assert found.error == pytest.approx(-0.25)
    # Bucket 0 predicted on the wire until 2 s: bucket 1's codec (0.25 of
    # its 0.5 s) runs meanwhile, its collectives from 2 to 2.25 s.
    sums = [v.numpy() for v in clock.sums()]
    found = plan_clock.report(sums, (2.0, 0.5), compute=(0.0, 0.25))
    assert found.predicted_exposed == pytest.approx(1.25)
    assert plan_clock.report(sums, (2.0, 0.5)).predicted_exposed == (
        pytest.approx(1.5)
    )


class _WorkerReadyLast:
    """A group of two whose other worker was ready `later` seconds after
    this one, so its exchange after the last gradient was that shorter."""

    size = 2

    def __init__(self, later):
        self.later = later

    def all_gather(self, value):
        return tf.stack([value, value - self.later])


def test_the_prediction_keeps_the_wait_for_the_worker_ready_last():
    clock = _clock(1)
    # This worker's gradients are ready at 0 s, its sums at 3 s; the
    # other worker's were ready at 2 s: this one waited 2 s of the 3.
    every = plan_clock.SHARE_EVERY
    for n in range(plan_clock.SETTLE + every + 3):
        t = 10.0 * n
        stamps = tf.constant([[t], [t + 3.0]], tf.float64)
        plan_clock.record(clock, tf.unstack(stamps[0]), tf.unstack(stamps[1]))
        plan_clock.share_when_due(clock, _WorkerReadyLast(2.0))
    # The first `every` counted exchanges shared; the last 3 not yet.
    assert clock.critical.numpy() == pytest.approx(1.0 * every)
    found = plan_clock.report([v.numpy() for v in clock.sums()], (0.5,))
    assert found.exposed == pytest.approx(3.0)
    assert found.critical == pytest.approx(1.0)
    # The 2 s wait stays; the exchange's own 1 s is predicted as 0.5 s.
    assert found.predicted_step == pytest.approx(10.0 - 1.0 + 0.5)
    assert "2000.0 ms waiting for other workers" in found.text()


def test_a_prediction_far_off_is_warned_about():
    off = plan_clock.PlanReport(10, 1.0, 1.3, (0.5,), (0.8,), 0.2, 0.5, 0.2)
    with pytest.warns(UserWarning, match=r"predicted 1300.0 ms \(\+30 %\)"):
        plan_clock.warn_if_off(off)
    close = off._replace(predicted_step=1.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_clock.warn_if_off(close)
        plan_clock.warn_if_off(None)


def test_training_times_the_plans_buckets(mirrored, monkeypatch):
    """Every bucket timed in every step after the first few; the check
    runs once, when due (here made to warn whatever it finds)."""
    monkeypatch.setattr(plan_clock, "TOLERANCE", -1.0)
    steps = plan_clock.SETTLE + 4
    model, opt = _planned(
        mirrored,
        compressors.Auto(
            candidates=["identity", TOPK], check_after=2, verbose=False
        ),
    )
    x = np.random.default_rng(0).normal(size=(32 * steps, 12))
    with pytest.warns(UserWarning, match="over 2 steps") as caught:
        model.fit(
            x.astype("float32"),
            np.zeros((32 * steps, 4)),
            batch_size=32,
            epochs=1,
            verbose=0,
        )
    assert len([w for w in caught if "tfgc Auto plan" in str(w.message)]) == 1
    found = opt.plan_report()
    assert found.exchanges == steps - plan_clock.SETTLE
    assert found.step > 0
    assert len(found.busy) == len(opt.plan.buckets)
    assert all(b >= 0 for b in found.busy)
    assert found.predicted_busy == tuple(
        b.seconds[b.choice] for b in opt.plan.buckets
    )
    # Each candidate's prediction splits into its codec's compute and
    # its collectives, which take some time.
    for b in opt.plan.buckets:
        assert len(b.compute) == 2
        assert all(0 <= c < s for c, s in zip(b.compute, b.seconds))


def _texts(log_dir) -> dict[int, str]:
    """step -> the `tfgc/plan` text in `log_dir`'s event files."""
    out = {}
    for path in log_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "tfgc/plan":
                    text = tf.make_ndarray(value.tensor).item().decode()
                    out[event.step] = text
    return out


def test_the_plan_and_its_report_reach_tensorboard(mirrored, tmp_path):
    steps = plan_clock.SETTLE + 2
    model, opt = _planned(
        mirrored, compressors.Auto(candidates=["identity", TOPK], verbose=False)
    )
    x = np.zeros((32 * steps, 12), "float32")
    model.fit(
        x,
        np.zeros((32 * steps, 4)),
        batch_size=32,
        epochs=2,
        verbose=0,
        callbacks=[tfgc.callbacks.PlanSummary(str(tmp_path))],
    )
    texts = _texts(tmp_path)
    assert sorted(texts) == [0, 1, 2]
    assert texts[0] == opt.plan.table()
    assert texts[2] == opt.plan_report().text()
    assert "over 2 steps" in texts[1]  # the first epoch's, after settling


def test_plan_summary_needs_a_plan():
    model = _model()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    callback = tfgc.callbacks.PlanSummary("/tmp/unused")
    callback.set_model(model)
    with pytest.raises(ValueError, match='compressor="auto"'):
        callback.on_train_begin()
    with pytest.raises(ValueError, match="directory path"):
        tfgc.callbacks.PlanSummary("")
