"""Importance-weighted pruning in one process: the root drawn from the step,
ranking by |gradient| / |weight|, updates only at the root's positions,
bad arguments. Against numpy on real workers:
tests/multiworker/test_paper_algorithms.py.
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


def test_importance_root_picks_by_gradient_over_weight():
    c = compressors.ImportancePruning(density=0.25, epsilon=1e-8)
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


@pytest.mark.parametrize("epsilon", [0, -1, "x"])
def test_importance_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="`epsilon`"):
        compressors.ImportancePruning(epsilon=epsilon)


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
    importance = np.abs(g_root) / (np.abs(w0.reshape(-1)) + 1e-8)
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
