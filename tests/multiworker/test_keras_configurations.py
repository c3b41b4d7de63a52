"""Mixed float16 with compressed gradients on real workers, one process
each: a float16 overflow on one worker must skip the step on every worker
(before tfgc made the decision global, that worker skipped the collectives
the others waited in, and the run hung)."""

import numpy as np
import pytest

from tests.workers import run_worker_script, weights_of

pytestmark = pytest.mark.multiworker

NUM_WORKERS = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed_float16")
    return run_worker_script("mixed_precision_worker.py", NUM_WORKERS, out)


def test_keras_wraps_the_compressed_optimizer_in_loss_scaling(results):
    for run in ("identity", "topk_clean", "topk_inf"):
        assert str(results[0][f"{run}/kind"]) == "LossScaleOptimizer"
        assert str(results[0][f"{run}/inner"]) == "CompressedOptimizer"


def test_identity_matches_plain_keras(results):
    for result in results:
        assert result["identity/steps"] == result["plain/steps"]
        assert result["identity/scale"] == result["plain/scale"]
        for got, expected in zip(
            weights_of(result, "identity"), weights_of(result, "plain")
        ):
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("compressor", ["topk", "signsgd"])
def test_overflow_on_one_worker_skips_the_step_on_all(results, compressor):
    clean, inf = f"{compressor}_clean", f"{compressor}_inf"
    for result in results:
        assert result[inf + "/steps"] == result[clean + "/steps"] - 1
        assert result[inf + "/scale"] == result[clean + "/scale"] / 2
        for w in weights_of(result, inf):
            assert np.all(np.isfinite(w))
    for key in results[0].files:
        np.testing.assert_array_equal(
            results[1][key], results[0][key], err_msg=key
        )
