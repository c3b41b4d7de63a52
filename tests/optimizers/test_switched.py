"""A unit whose codec changes between steps (`switched`): its own branch
per candidate and phase, and a join sent as one bucket by its last unit
in the steps where each of its units runs the join's codec."""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tests.optimizers.test_auto_plan import _fit, _planned
from tfgc import compressors
from tfgc.core.wire import no_traffic
from tfgc.optimizers import auto_plan, plan_clock, switched

JOIN = auto_plan.Join((0, 1, 2), 1)


class _Plan(NamedTuple):
    options: tuple


class _Counting:
    """A communicator whose sums tell how the tensors were sent: each
    total is its input times the tensors sent with it, plus the codec's
    number; each state counts the exchanges it went through."""

    def step(self, codecs, inputs, states, keys):
        totals = [x * len(inputs) + c for c, x in zip(codecs, inputs)]
        return totals, [s + 1 for s in states], no_traffic()


def _units(count):
    # Candidate 0: one phase (codec 100); candidate 1: two (10 and 20).
    plan = _Plan(((100.0,), (10.0, 20.0)))
    return {
        n: switched.Unit(
            [plan], [tf.constant([n + 1.0])], [tf.constant(0)], [0]
        )
        for n in range(count)
    }


def _step(choices, step):
    """Every unit's (totals, states) of one step, the join's applied."""
    units = _units(3)
    choices = tf.constant(choices, tf.int32)
    out = {}
    for n in range(3):
        totals, states, _, back = switched.exchange(
            _Counting(), n, units[n], choices, tf.constant(step, tf.int64),
            (JOIN,), units,
        )  # fmt: skip
        out[n] = (float(totals[0][0]), int(states[0]))
        for joined in back:
            for u, (t, s) in zip(
                JOIN.units[:-1], zip(joined.totals, joined.states)
            ):
                if bool(joined.in_force):
                    out[u] = (float(t[0]), int(s))
    return out


def test_a_join_in_force_is_sent_by_its_last_unit():
    # Every unit runs candidate 1: the three tensors go in one exchange
    # (3 x, phase 0's codec 10), each state through one exchange.
    assert _step([1, 1, 1], step=0) == {
        0: (3 * 1 + 10, 1),
        1: (3 * 2 + 10, 1),
        2: (3 * 3 + 10, 1),
    }
    assert _step([1, 1, 1], step=1)[0] == (3 * 1 + 20, 1)  # phase 1


def test_units_out_of_a_join_are_sent_alone():
    # Unit 1 runs candidate 0: no join, each unit alone (1 x), by its own
    # candidate and phase.
    assert _step([1, 0, 1], step=1) == {
        0: (1 + 20, 1),
        1: (2 + 100, 1),
        2: (3 + 20, 1),
    }


ACPSGD = compressors.ACPSGD(rank=2)


def test_a_changing_plan_joined_trains_as_the_joining_codec(
    mirrored, monkeypatch
):
    """ACP-SGD in every unit of a plan that may change: its join is sent
    by the last unit, and training is bit for bit ACP-SGD's alone."""
    monkeypatch.setattr(auto_plan, "pick", lambda auto, seconds: 1)

    def auto():
        return compressors.Auto(
            candidates=["identity", ACPSGD], replan_every=1000, verbose=False
        )

    model, opt = _planned(mirrored, auto())
    with mirrored.scope():
        opt.build(model.trainable_variables)
    assert [j.units for j in opt.plan.joins] == [(0, 1, 2, 3)]
    switched_weights = _fit(mirrored, auto, 600, {})
    fixed = _fit(mirrored, lambda: ACPSGD, 600, {})
    for a, b in zip(switched_weights, fixed):
        np.testing.assert_array_equal(a, b)


def test_trials_run_a_join_and_units_alone_in_turn(mirrored, monkeypatch):
    """The trials try ACP-SGD joined against TopK in each unit alone (the
    plans differ in bucketing, not only in codec); the winner is one of
    them and training stays finite."""
    monkeypatch.setattr(auto_plan, "pick", lambda auto, seconds: 2)
    tried = ((2, 2, 2, 2), (1, 1, 1, 1))
    monkeypatch.setattr(
        auto_plan, "contenders", lambda auto, buckets, joins=(): tried
    )
    auto = compressors.Auto(
        candidates=["identity", compressors.TopK(0.1), ACPSGD],
        trial_steps=2,
        verbose=False,
    )
    model, opt = _planned(mirrored, auto, min_compress_size=0)
    steps = plan_clock.SETTLE + 2 * len(tried) + 2
    x = np.random.default_rng(0).normal(size=(32 * steps, 12))
    model.fit(
        x.astype("float32"), np.zeros((32 * steps, 4)), batch_size=32, verbose=0
    )
    assert [j.units for j in opt.plan.joins] == [(0, 1, 2, 3)]
    assert opt.plan.choices in tried
    spans = opt.plan_report().trials
    assert len(spans) == 2 and all(s > 0 for row in spans for s in row)
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)
