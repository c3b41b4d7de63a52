"""Importance-weighted pruning in one process: the root drawn from the step,
ranking by |gradient| / (|weight| + floor), updates only at the root's
positions, bad arguments, configs. Against numpy on real workers:
tests/multiworker/test_paper_algorithms.py; convergence:
test_importance_convergence.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from custom_ops.cuda_harness.numpy_oracle import np_slice_start
from tests.compressors.common import heavy_tailed, replica_copies, shared_key
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import compressors
from tfgc.communicators import exchange
from tfgc.core.compressor import StepInfo


def test_importance_root_follows_the_step():
    roots = [
        int(compressors.importance.root_worker(tf.constant(s), 4))
        for s in range(40)
    ]
    assert roots == [np_slice_start(s, 3) for s in range(40)]
    assert len(set(roots)) == 4


def _np_importance(acc, w, relative_epsilon=1.0, epsilon=1e-8):
    """numpy's |acc| / (|w| + relative_epsilon * rms(w) + epsilon), flat."""
    w = np.asarray(w, np.float32).reshape(-1)
    rms = np.float32(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    floor = np.float32(relative_epsilon) * rms + np.float32(epsilon)
    return np.abs(np.asarray(acc, np.float32).reshape(-1)) / (np.abs(w) + floor)


def _selected(compressor, acc, w, step=0):
    """The positions the root picks (the root: worker 0 of 2)."""
    step = next(s for s in range(step, step + 100) if np_slice_start(s, 1) == 0)
    payload, _ = compressor.compress(
        tf.constant(acc),
        (),
        shared_key(0, step),
        StepInfo(tf.constant(w), 0, 2),
    )
    return payload.indices.numpy()


def test_importance_root_picks_by_gradient_over_weight():
    # relative_epsilon=0: the ratio alone, |acc| / (|w| + epsilon).
    c = compressors.ImportancePruning(
        density=0.25, epsilon=1e-8, relative_epsilon=0.0
    )
    x = tf.constant([1.0, 1.0, 0.1, 4.0, 0.2, 0.0, 3.0, 0.5])
    w = tf.constant([10.0, 0.1, 0.001, 100.0, 1.0, 1.0, 1.0, 0.05])
    # |x| / |w|: 0.1, 10, 100, 0.04, 0.2, 0, 3, 10 -> positions 2 and 1 or 7.
    step = next(s for s in range(100) if np_slice_start(s, 1) == 0)
    payload, ctx = c.compress(x, (), shared_key(0, step), StepInfo(w, 0, 2))
    top = set(payload.indices.numpy())
    assert 2 in top and top <= {1, 2, 7}
    assert int(payload.root) == 0
    # The other worker names the same root; its own list is not sent.
    payload, _ = c.compress(x, (), shared_key(0, step), StepInfo(w, 1, 2))
    assert int(payload.root) == 0
    assert c.spec.collectives == (compressors.BROADCAST, "all_reduce")


def test_importance_needs_the_variable():
    with pytest.raises(ValueError, match="reads the variable's value"):
        compressors.ImportancePruning().compress(
            tf.ones(10), (), shared_key(0, 0)
        )
    with pytest.raises(ValueError, match="reads the variable's value"):
        exchange.run_rounds(
            [compressors.ImportancePruning()],
            [tf.ones(10)],
            [()],
            [shared_key(0, 0)],
            carry=None,
        )


def test_importance_floor_matches_numpy():
    """|acc| / (|w| + relative_epsilon * rms(w) + epsilon), rms over the
    tensor, in float32: the same positions as numpy."""
    rng = np.random.default_rng(3)
    w = rng.uniform(-0.1, 0.1, (50, 80)).astype(np.float32)
    w[0, :10] = 0.0  # exact zeros (a bias at its initial value)
    acc = heavy_tailed((50, 80), 4, df=3)
    for rel in (1.0, 0.25, 4.0):
        c = compressors.ImportancePruning(0.01, 1e-8, relative_epsilon=rel)
        score = _np_importance(acc, w, rel)
        expected = np.sort(np.argsort(-score, kind="stable")[:40])
        np.testing.assert_array_equal(_selected(c, acc, w), expected)


def test_importance_floor_keeps_near_zero_weights_from_taking_the_budget():
    """Weights spread around zero (as initialised, or crossing it): the
    bare ratio (relative_epsilon=0) picks the weights nearest zero whatever
    their gradient, the floor ranks them by gradient again. On this draw
    the bare ratio's picks overlap the 200 largest |acc| by 3.5 %, with a
    median |w| 0.015 x the tensor's; the floor's by 37 %, 0.22 x."""
    rng = np.random.default_rng(0)
    w = rng.uniform(-0.1, 0.1, 20000).astype(np.float32)
    acc = 0.01 * rng.standard_normal(20000).astype(np.float32)
    largest = set(np.argsort(-np.abs(acc))[:200])
    median = np.median(np.abs(w))
    bare = _selected(
        compressors.ImportancePruning(0.01, relative_epsilon=0.0), acc, w
    )
    floored = _selected(compressors.ImportancePruning(0.01), acc, w)
    assert len(largest & set(bare)) < 0.1 * 200
    assert np.median(np.abs(w[bare])) < 0.05 * median
    assert len(largest & set(floored)) > 0.25 * 200
    assert np.median(np.abs(w[floored])) > 0.1 * median


def test_importance_of_zero_weights_is_the_gradients_magnitude():
    """A tensor of zeros (a bias at its initialisation): the floor is
    epsilon alone, the same for every entry, so the root picks TopK's
    positions."""
    acc = heavy_tailed((4000,), 5, df=3)
    c = compressors.ImportancePruning(0.01)
    _, topk = tfgc.ops.top_k_abs(tf.constant(acc), 40)
    np.testing.assert_array_equal(
        _selected(c, acc, np.zeros(4000, np.float32)), np.sort(topk.numpy())
    )


@pytest.mark.parametrize("epsilon", [0, -1, "x"])
def test_importance_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="`epsilon`"):
        compressors.ImportancePruning(epsilon=epsilon)


@pytest.mark.parametrize(
    "value", [-1.0, -1e-12, "1", float("nan"), float("inf"), True, None]
)
def test_importance_bad_relative_epsilon(value):
    with pytest.raises(ValueError, match="`relative_epsilon` must be") as e:
        compressors.ImportancePruning(relative_epsilon=value)
    assert f"relative_epsilon={value!r}" in str(e.value)


def test_importance_config_round_trip():
    c = compressors.ImportancePruning(0.02, 1e-6, relative_epsilon=0.5)
    assert c.get_config() == {
        "density": 0.02,
        "epsilon": 1e-6,
        "relative_epsilon": 0.5,
    }
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(c)
    )
    assert restored == c
    # A config saved before relative_epsilon existed gets the floor.
    old = compressors.ImportancePruning.from_config(
        {"density": 0.02, "epsilon": 1e-6}
    )
    assert old.relative_epsilon == 1.0


def test_importance_updates_only_the_roots_positions(mirrored):
    """Every replica applies the same update, at the root's positions."""
    p = NUM_LOGICAL_CPUS
    with mirrored.scope():
        w0 = heavy_tailed((50, 40), 9, df=3)
        w = keras.Variable(w0)
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(1.0),
            compressors.ImportancePruning(density=0.01),
            min_compress_size=0,
        )
        opt.build([w])

    def grad(r):
        return tf.constant(heavy_tailed((50, 40), 100 + r, df=3))

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.switch_case(r, [lambda i=i: grad(i) for i in range(p)])
            opt.apply([g], [w])

        mirrored.run(replica_fn)

    step()
    root = np_slice_start(0, p - 1)
    g_root = heavy_tailed((50, 40), 100 + root, df=3).reshape(-1)
    importance = _np_importance(g_root, w0)
    chosen = np.sort(np.argsort(-importance, kind="stable")[:20])
    total = sum(
        heavy_tailed((50, 40), 100 + r, df=3).reshape(-1) for r in range(p)
    )
    expected = w0.reshape(-1).copy()
    expected[chosen] -= total[chosen]
    copies = replica_copies(w)
    assert len(copies) == p
    for replica in copies:
        np.testing.assert_allclose(
            replica.reshape(-1), expected, rtol=1e-5, atol=1e-5
        )
    residual = opt._plans[0].state_variables[0]
    for r, local in enumerate(replica_copies(residual)):
        kept = heavy_tailed((50, 40), 100 + r, df=3).reshape(-1)
        kept[chosen] = 0
        np.testing.assert_array_equal(local.reshape(-1), kept)
