"""Shared randomness agrees across real workers, and runs repeat.

Everything drawn from the shared seed (random-k positions, importance
pruning's root, PowerSGD's initial factor) must be the same on every
worker, though each worker trains on other data: a worker that drew other
positions would send values the others add at the wrong places. Observed
through each worker's own state: under error feedback the residual is zero
exactly where the worker sent. And two runs with the same seeds give the
same weights, bit for bit.
"""

import numpy as np
import pytest

from tests.workers import run_worker_script

pytestmark = pytest.mark.multiworker

NUM_WORKERS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("determinism")
    return [
        run_worker_script(
            "determinism_worker.py",
            NUM_WORKERS,
            out,
            args=[f"--run={run}"],
            prefix=f"{run}_",
        )
        for run in ("first", "second")
    ]


def _keys(result, part):
    return [k for k in result.files if f"/{part}/" in k]


@pytest.mark.parametrize("name", ["randomk", "importance"])
def test_sent_positions_agree_across_workers(runs, name):
    first, other = runs[0][0], runs[0][-1]
    residuals = [k for k in _keys(first, "state") if k.startswith(name)]
    assert residuals
    sent_somewhere = False
    for key in residuals:
        # Zero where sent; the workers' data differ, so their residuals
        # differ elsewhere.
        sent, sent_other = first[key] == 0, other[key] == 0
        np.testing.assert_array_equal(sent, sent_other, err_msg=key)
        if sent.any() and not sent.all():
            assert not np.array_equal(first[key], other[key]), key
            sent_somewhere = True
    assert sent_somewhere


def test_powersgd_factors_agree_across_workers(runs):
    first, other = runs[0][0], runs[0][-1]
    factors = [
        k for k in first.files if k.startswith("powersgd/") and "_q" in k
    ]
    assert any("/initial/" in k for k in factors)
    assert any("/state/" in k for k in factors)
    for key in factors:
        np.testing.assert_array_equal(first[key], other[key], err_msg=key)


def test_two_runs_give_the_same_weights(runs):
    for first, second in zip(*runs):
        assert first.files == second.files
        for key in first.files:
            np.testing.assert_array_equal(first[key], second[key], err_msg=key)
