"""Re-planning (`Auto(replan_every=N)`): a residual shared by every
candidate, fresh state for a codec that comes back, the revision's
arithmetic, and training that switches codecs and keeps its plan in a
checkpoint."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests.compressors.common import heavy_tailed, shared_key
from tests.optimizers.test_auto_plan import _clock, _fit, _planned, _two_hosts
from tfgc import communicators, compressors
from tfgc.communicators import exchange
from tfgc.communicators import topology as topology_lib
from tfgc.communicators.collectives import Group
from tfgc.compressors.switchable import Slot
from tfgc.core import bucket_costs
from tfgc.optimizers import auto_plan, plan_clock, replan

SHAPE = (64, 32)
CODECS = (
    compressors.TopK(0.05),
    compressors.Identity(),
    compressors.PowerSGD(2),
)
INITS = tuple(c.init_state for c in CODECS)


def _local_step(slot, x, state, step):
    """One exchange of `x` on one worker through `slot`."""
    group = Group(topology_lib.current(), [0], 0)
    communicator = communicators.get("auto")
    totals, states, _, _ = exchange.run_rounds(
        [slot],
        [x],
        [state],
        [shared_key(0, step)],
        lambda payloads, kinds: communicator.carry(payloads, kinds, group),
    )
    return totals[0], states[0]


def test_every_codec_shares_one_residual_and_nothing_is_lost():
    slots = [Slot(i, c, INITS) for i, c in enumerate(CODECS)]
    state = slots[0].init_state(SHAPE, tf.float32, shared_key(0, -1))
    sent = tf.zeros(SHAPE)
    given = tf.zeros(SHAPE)
    for step, which in enumerate([0, 2, 0, 2, 1, 0]):
        x = tf.constant(heavy_tailed(SHAPE, step))
        total, state = _local_step(slots[which], x, state, step)
        sent += total
        given += x
        assert int(state.last) == which
        if which == 1:  # dense: everything unsent goes out now
            np.testing.assert_array_equal(state.residual, np.zeros(SHAPE))
    np.testing.assert_allclose(sent + state.residual, given, atol=1e-4)


def test_a_codec_that_did_not_run_last_starts_afresh():
    powersgd = Slot(2, CODECS[2], INITS)
    state = powersgd.init_state(SHAPE, tf.float32, shared_key(0, -1))
    x = tf.constant(heavy_tailed(SHAPE, 7))
    _, after = _local_step(powersgd, x, state, step=3)
    stale = after._replace(last=tf.constant(0, tf.int32))  # TopK ran last
    fresh = after._replace(
        inners=(
            after.inners[0],
            after.inners[1],
            CODECS[2].init_state(SHAPE, tf.float32, shared_key(0, 4)),
        ),
        last=tf.constant(2, tf.int32),
    )
    went_stale, _ = _local_step(powersgd, x, stale, step=4)
    went_fresh, _ = _local_step(powersgd, x, fresh, step=4)
    kept, _ = _local_step(powersgd, x, after, step=4)
    np.testing.assert_array_equal(went_stale, went_fresh)
    assert not np.array_equal(kept, went_fresh)  # its own state otherwise


class _OneWorker:
    size = 1


def _add_variable(shape, dtype, aggregation, name, initializer):
    """`add_variable` for a `Replanner` outside an optimizer."""
    del aggregation
    make = tf.ones if initializer == "ones" else tf.zeros
    return tf.Variable(make(shape, dtype), name=name)


def test_a_revision_corrects_each_codec_by_what_it_measured():
    """Bucket 0 sent TopK, predicted 0.5 s, measured 1.5 s; bucket 1 sent
    dense as predicted (1 s). TopK's factor becomes 3: bucket 0 goes
    dense (1 s against 1.5 s corrected)."""
    clock = _clock(2)
    choices = tf.Variable([1, 0], dtype=tf.int32)

    auto = compressors.Auto(candidates=["identity", "topk"], replan_every=2)
    plan = auto_plan.AutoPlan(
        auto.candidates,
        (_bucket(1.0, 0.5, choice=1), _bucket(1.0, 2.0)),
        2,
        None,
        (),
        "test",
    )
    planner = replan.Replanner.create(_add_variable, auto, plan, (True, False))
    timing = plan_clock.Timing(
        clock, ((1.0, 0.5), (1.0, 2.0)), choices, None, planner
    )
    counted = 4
    clock.seen.assign(plan_clock.SETTLE + counted)
    clock.busy.assign([counted * 1.5, counted * 1.0])
    replan.step_end(timing, _OneWorker(), tf.constant(0.0, tf.float64))
    np.testing.assert_array_equal(choices.numpy(), [0, 0])
    np.testing.assert_allclose(planner.factors.numpy(), [1.0, 3.0])
    assert planner.since_seen.numpy() == clock.seen.numpy()
    # Not due again until `replan_every` more exchanges.
    choices.assign([1, 1])
    replan.step_end(timing, _OneWorker(), tf.constant(0.0, tf.float64))
    np.testing.assert_array_equal(choices.numpy(), [1, 1])


def test_the_batched_pick_is_the_planners_pick():
    auto = compressors.Auto(candidates=["identity", "fp16", "topk"])
    rng = np.random.default_rng(0)
    table = rng.uniform(0.5, 1.5, size=(50, 3))
    table[::5, 2] = table[::5, 0] / 1.02  # barely faster: stays dense
    dense = tuple(auto_plan.is_dense(c) for c in auto.candidates)
    batched = replan.pick(tf.constant(table), dense, auto.min_speedup)
    expected = [auto_plan.pick(auto, row) for row in table]
    np.testing.assert_array_equal(batched.numpy(), expected)


@pytest.mark.parametrize(
    "codec",
    [compressors.TopK(0.1), compressors.ACPSGD(rank=2)],
    ids=["topk", "acpsgd"],
)
def test_with_one_choice_kept_it_trains_as_that_codec(
    mirrored, monkeypatch, codec
):
    """Slots over a shared state, the choice held in a variable: bit for
    bit the fixed compressor's training while no revision moves it (a
    codec with state of its own, ACP-SGD's factors, goes on from its
    initial state)."""
    monkeypatch.setattr(auto_plan, "pick", lambda auto, seconds: 1)
    auto = lambda: compressors.Auto(  # noqa: E731
        candidates=["identity", codec], replan_every=1000, verbose=False
    )
    switched = _fit(mirrored, auto, 600, {})
    fixed = _fit(mirrored, lambda: codec, 600, {})
    for a, b in zip(switched, fixed):
        np.testing.assert_array_equal(a, b)


def test_a_switched_plan_under_the_hierarchical_one_trains_as_its_codec(
    mirrored, monkeypatch
):
    """The switch over candidates (re-planning on) around the
    hierarchical exchange: bit for bit fixed TopK's training there."""
    monkeypatch.setattr(auto_plan, "pick", lambda auto, seconds: 1)
    auto = lambda: compressors.Auto(  # noqa: E731
        candidates=["identity", compressors.TopK(0.1)],
        replan_every=1000,
        verbose=False,
    )
    switched = _fit(mirrored, auto, 600, _two_hosts())
    fixed = _fit(mirrored, lambda: compressors.TopK(0.1), 600, _two_hosts())
    for a, b in zip(switched, fixed):
        np.testing.assert_array_equal(a, b)


def test_revisions_switch_codecs_and_a_checkpoint_keeps_them(
    mirrored, monkeypatch, tmp_path
):
    monkeypatch.setattr(auto_plan, "pick", lambda auto, seconds: 0)

    def everything_sparse(corrected, dense, min_speedup):
        return tf.ones(tf.shape(corrected)[:1], tf.int32)

    monkeypatch.setattr(replan, "pick", everything_sparse)

    def make():
        auto = compressors.Auto(
            candidates=["identity", compressors.TopK(0.1)],
            replan_every=2,
            verbose=False,
        )
        model, opt = _planned(mirrored, auto)
        with mirrored.scope():
            opt.build(model.trainable_variables)
        return model, opt

    model, opt = make()
    assert set(opt.plan.choices) == {0}
    steps = plan_clock.SETTLE + 3
    x = np.random.default_rng(0).normal(size=(32 * steps, 12))
    model.fit(
        x.astype("float32"), np.zeros((32 * steps, 4)), batch_size=32, verbose=0
    )
    assert set(opt.plan.choices) == {1}
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)
    path = str(tmp_path / "replanned.weights.h5")
    model.save_weights(path)
    monkeypatch.undo()
    monkeypatch.setattr(auto_plan, "pick", lambda auto, seconds: 0)
    again, again_opt = make()
    assert set(again_opt.plan.choices) == {0}
    again.load_weights(path)
    assert again_opt.plan.choices == opt.plan.choices


def test_replanning_needs_error_feedback():
    with pytest.raises(ValueError, match="error_feedback=False"):
        tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1),
            compressors.Auto(replan_every=10),
            error_feedback=False,
        )


def _bucket(*seconds, choice=0):
    return auto_plan.BucketChoice(
        (0,), 1, 4, tuple(seconds), seconds[0], choice
    )


def test_the_contenders_differ_where_the_measurement_cannot_tell():
    auto = compressors.Auto(
        candidates=["identity", "topk", "powersgd"], trial_margin=1.5
    )
    buckets = (
        _bucket(10.0, 5.0, 5.5, choice=1),  # TopK; PowerSGD within 1.5x
        _bucket(1.0, 3.0, 1.0, choice=0),  # PowerSGD declines: the same
        _bucket(8.0, 2.0, 9.0, choice=1),  # only TopK is close
    )
    plans = auto_plan.contenders(auto, buckets)
    assert plans[0] == (1, 0, 1)
    assert set(plans[1:]) == {(2, 0, 1)}
    # A wider margin lets dense in where it is within 2x.
    wide = compressors.Auto(
        candidates=["identity", "topk", "powersgd"], trial_margin=2.0
    )
    assert set(auto_plan.contenders(wide, buckets)) == {
        (1, 0, 1),
        (2, 0, 1),
        (0, 0, 1),
    }


def _run_exchanges(timing, group, periods, span=0.1):
    """Times exchanges `periods` seconds apart (each one's first stamp to
    the next one's), as `step.exchange_in_buckets` does: the period read
    before the stamps are recorded. Returns the choices after each."""
    clock, seen, t = timing.clock, [], 0.0
    for period in periods:
        buckets = len(timing.table)
        ready = tf.fill([buckets], tf.constant(t, tf.float64))
        since = ready[0] - clock.previous
        plan_clock.record(clock, tf.unstack(ready), tf.unstack(ready + span))
        replan.step_end(timing, group, since)
        seen.append(tuple(np.atleast_1d(timing.choices.numpy())))
        t += period
    return seen


def test_trials_take_turns_and_keep_the_shortest_median_period():
    clock = _clock(2)
    choices = tf.Variable([0, 0], dtype=tf.int32)
    auto = compressors.Auto(candidates=["identity", "topk"], trial_steps=3)
    plan = auto_plan.AutoPlan(
        auto.candidates,
        (_bucket(1.0, 1.0), _bucket(1.0, 1.0)),
        2,
        None,
        (),
        "test",
        ((0, 0), (1, 1), (1, 0)),
    )
    planner = replan.Replanner.create(_add_variable, auto, plan, (True, False))
    timing = plan_clock.Timing(
        clock, ((1.0, 1.0), (1.0, 1.0)), choices, None, planner
    )
    # Per counted exchange, the period of the contender that ran: (1, 1)
    # is the fastest but for one slow step, which its median ignores (its
    # mean, 2 s, would lose to (1, 0)'s 0.8 s). The last trial's period is
    # known one exchange later.
    periods = [1.0, 0.5, 0.8, 0.8, 5.0, 1.0, 1.0, 0.5, 0.8]
    seen = _run_exchanges(timing, _OneWorker(), [9.0] * 3 + periods + [9.0])
    # In turn, step by step, the second round in reverse (each contender
    # at both parities of the step, ACP-SGD at both phases); one more step
    # of the next turn while the last period is measured; then the
    # shortest median. Shown: the contender for the next step.
    a, b, c = (0, 0), (1, 1), (1, 0)
    assert seen[: plan_clock.SETTLE] == [a] * plan_clock.SETTLE
    assert seen[plan_clock.SETTLE :] == [b, c, c, b, a, a, b, c, c, b]
    np.testing.assert_allclose(planner.periods.numpy(), periods)
    # Each contender's periods, its rounds in order (the reversed round
    # mapped back).
    np.testing.assert_allclose(
        replan.trial_periods(planner),
        [[1.0, 1.0, 1.0], [0.5, 5.0, 0.5], [0.8, 0.8, 0.8]],
    )
    # The winner holds from the step `trial_exchanges` counts (measured
    # plans only), as the lab's warm-up assumes.
    measured = plan._replace(collectives=bucket_costs.FREE)
    after = replan.trial_exchanges(auto, measured)
    assert after == len(seen) and seen[after - 2] != seen[after - 1]
    assert replan.trial_exchanges(auto, plan) == 0


class _TwoWorkers:
    """The other worker's periods are `other`'s (an all-reduce of two)."""

    size = 2

    def __init__(self, other):
        self.other = tf.constant(other, tf.float64)

    def all_reduce(self, value):
        return value + self.other


def test_the_trials_keep_the_mean_period_over_the_workers():
    """This worker alone would keep (0,) (1.0 s against 1.2); with the
    other worker's (1.4 and 0.6 s) the mean keeps (1,): every worker
    decides alike."""
    clock = _clock(1)
    choices = tf.Variable([0], dtype=tf.int32)
    auto = compressors.Auto(candidates=["identity", "topk"], trial_steps=1)
    plan = auto_plan.AutoPlan(
        auto.candidates, (_bucket(1.0, 1.0),), 2, None, (), "test", ((0,), (1,))
    )
    planner = replan.Replanner.create(_add_variable, auto, plan, (True, False))
    timing = plan_clock.Timing(clock, ((1.0, 1.0),), choices, None, planner)
    seen = _run_exchanges(
        timing, _TwoWorkers([1.4, 0.6]), [9.0] * 3 + [1.0, 1.2, 9.0]
    )
    np.testing.assert_allclose(planner.periods.numpy(), [1.0, 1.2])
    assert seen[-1] == (1,)


def test_a_checkpoint_of_other_buckets_keeps_this_runs_plan(
    mirrored, monkeypatch, tmp_path
):
    """Measured again after a restart, the plan may join other buckets:
    the weights and compressor states are restored, the plan's own
    variables (other shapes) stay this run's, with a warning."""
    acpsgd = compressors.ACPSGD(rank=1)

    def make(choice):
        monkeypatch.setattr(auto_plan, "pick", lambda auto, seconds: choice)
        monkeypatch.setattr(
            auto_plan, "choose_joined", lambda *args: [choice] * len(args[2])
        )
        auto = compressors.Auto(
            candidates=["identity", acpsgd], replan_every=100, verbose=False
        )
        model, opt = _planned(mirrored, auto, min_compress_size=0)
        with mirrored.scope():
            opt.build(model.trainable_variables)
        return model, opt

    def kept(opt):
        plan = {id(v) for v in opt._plan_variables}
        return [
            v.numpy()
            for v in opt._saver.per_replica_variables()
            if id(v) not in plan
        ]

    model, opt = make(1)  # ACP-SGD everywhere: one bucket
    assert len(opt.plan.buckets) == 1
    x = np.random.default_rng(0).normal(size=(96, 12)).astype("float32")
    model.fit(x, np.zeros((96, 4)), batch_size=32, verbose=0)
    path = str(tmp_path / "joined.weights.h5")
    model.save_weights(path)
    again, again_opt = make(0)  # dense everywhere: four buckets
    assert len(again_opt.plan.buckets) == 4
    with pytest.warns(UserWarning, match="plan of other buckets"):
        again.load_weights(path)
    assert again_opt.plan.choices == (0, 0, 0, 0)
    for a, b in zip(kept(again_opt), kept(opt)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(again.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    again.fit(x, np.zeros((96, 4)), batch_size=32, verbose=0)
    assert all(np.isfinite(w.numpy()).all() for w in again.weights)


def test_a_checkpoint_of_another_model_is_refused_by_name(mirrored, tmp_path):
    model, opt = _planned(mirrored, compressors.TopK(0.1))
    x = np.random.default_rng(0).normal(size=(32, 12)).astype("float32")
    model.fit(x, np.zeros((32, 4)), batch_size=32, verbose=0)
    stacked = [np.zeros((1, 3))] * len(opt._saver.per_replica_variables())
    with pytest.raises(ValueError, match="with shape \\(3,\\) and this one"):
        opt._saver.restore(1, stacked)
