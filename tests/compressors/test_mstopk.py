"""MSTopK in one process: exactly k by band sampling, the shared seed, error
feedback through the fused op, bad arguments. Against numpy on real
workers: tests/multiworker/test_paper_algorithms.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from custom_ops.cuda_harness.numpy_oracle import np_select
from tests.compressors.common import heavy_tailed, shared_key
from tfgc import compressors
from tfgc.compressors import _sparse


def _np_seed(index, step):
    return int(np.int64(index) ^ (np.int64(step) << np.int64(32)))


def test_mstopk_sends_exactly_k_as_specified():
    c = compressors.MSTopK(density=0.01, rounds=20)
    x = heavy_tailed((300, 70), seed=1)
    payload, _ = c.compress(tf.constant(x), (), shared_key(5, 3))
    k = int(np.ceil(0.01 * x.size))
    assert payload.indices.shape == (k,)
    expected = np_select(x, k, "mstopk", rounds=20, seed=_np_seed(5, 3))
    np.testing.assert_array_equal(np.sort(payload.indices.numpy()), expected)
    np.testing.assert_array_equal(
        payload.values.numpy(), x.reshape(-1)[payload.indices.numpy()]
    )


def test_mstopk_band_slice_follows_the_shared_key():
    # Many equal magnitudes: the band is wide and the slice start matters.
    x = np.where(np.arange(4000) % 3 == 0, 1.0, 0.5).astype(np.float32)
    c = compressors.MSTopK(density=0.05)
    picks = {
        tuple(
            c.compress(tf.constant(x), (), shared_key(0, s))[0].indices.numpy()
        )
        for s in range(4)
    }
    assert len(picks) > 1
    again = c.compress(tf.constant(x), (), shared_key(0, 2))[0].indices.numpy()
    assert tuple(again) in picks


def test_mstopk_error_feedback_conserves_mass_through_fused_op():
    c = compressors.ErrorFeedback(compressors.MSTopK(density=0.02))
    state = c.init_state((50, 40), tf.float32, shared_key(0, -1))
    total_in = np.zeros((50, 40), np.float32)
    total_sent = np.zeros((50, 40), np.float32)
    for step in range(4):
        x = heavy_tailed((50, 40), seed=step)
        payload, ctx = c.compress(tf.constant(x), state, shared_key(0, step))
        sent, state = c.decompress(
            tf.nest.map_structure(lambda t: t[None], payload), ctx
        )
        total_in += x
        total_sent += sent.numpy()
    np.testing.assert_allclose(
        total_sent + state.residual.numpy(), total_in, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("rounds", [0, 65, 2.5])
def test_mstopk_bad_rounds(rounds):
    with pytest.raises(ValueError, match="`rounds`"):
        compressors.MSTopK(rounds=rounds)


def test_selection_seed_matches_the_documented_formula():
    seed = _sparse.selection_seed(tf.constant([12345, 7], tf.int64))
    assert int(seed) == _np_seed(12345, 7)
