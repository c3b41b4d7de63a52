"""`non_finite` on real workers, one process each, with an Inf in the last
worker's gradients only: every worker takes the same decision (before the
decision was global, a worker that acted alone would have left the others
waiting in their collectives)."""

import numpy as np
import pytest

from tests.workers import run_worker_script, weights_of

pytestmark = pytest.mark.multiworker

NUM_WORKERS = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("non_finite")
    return run_worker_script("non_finite_worker.py", NUM_WORKERS, out)


def test_skip_on_every_worker_is_the_run_without_that_step(results):
    for result in results:
        assert int(result["skip/skipped"]) == 1
        assert int(result["skip/steps"]) == int(result["without_step/steps"])
        for got, expected in zip(
            weights_of(result, "skip"), weights_of(result, "without_step")
        ):
            assert np.all(np.isfinite(got))
            np.testing.assert_array_equal(got, expected)
    for got, other in zip(
        weights_of(results[0], "skip"), weights_of(results[-1], "skip")
    ):
        np.testing.assert_array_equal(got, other)


def test_raise_fails_every_worker_naming_the_last_one(results):
    last = NUM_WORKERS - 1
    for result in results:
        message = str(result["raise/error"])
        assert "Non-finite gradient" in message
        assert f"replica {last}: " in message
        assert "replica 0" not in message


def test_propagate_gives_the_same_weights_everywhere(results):
    weights = [weights_of(r, "propagate") for r in results]
    assert not all(np.all(np.isfinite(w)) for w in weights[0])
    for got, other in zip(weights[0], weights[-1]):
        np.testing.assert_array_equal(got, other)
