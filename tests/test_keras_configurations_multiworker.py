"""Mixed float16 with compressed gradients on real workers, one process
each: a float16 overflow on one worker must skip the step on every worker
(before tfgc made the decision global, that worker skipped the collectives
the others waited in, and the run hung)."""

import io
import os
import sys

import numpy as np
import pytest

from tfgc import launch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
pytestmark = pytest.mark.multiworker

NUM_WORKERS = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed_float16")
    log = io.StringIO()
    code = launch.run(
        [
            sys.executable,
            os.path.join(HERE, "multiworker", "mixed_precision_worker.py"),
            "--out",
            str(out),
        ],
        num_workers=NUM_WORKERS,
        # A hang is the failure this guards against: fail fast.
        timeout=300,
        env={"PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"},
        output=log,
    )
    assert code == 0, log.getvalue()[-5000:]
    return [np.load(out / f"worker{i}.npz") for i in range(NUM_WORKERS)]


def _weights(result, run):
    return [
        result[k] for k in sorted(result.files) if k.startswith(f"{run}/weight")
    ]


def test_keras_wraps_the_compressed_optimizer_in_loss_scaling(results):
    for run in ("identity", "topk_clean", "topk_inf"):
        assert str(results[0][f"{run}/kind"]) == "LossScaleOptimizer"
        assert str(results[0][f"{run}/inner"]) == "CompressedOptimizer"


def test_identity_matches_plain_keras(results):
    for result in results:
        assert result["identity/steps"] == result["plain/steps"]
        assert result["identity/scale"] == result["plain/scale"]
        for got, expected in zip(
            _weights(result, "identity"), _weights(result, "plain")
        ):
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("compressor", ["topk", "signsgd"])
def test_overflow_on_one_worker_skips_the_step_on_all(results, compressor):
    clean, inf = f"{compressor}_clean", f"{compressor}_inf"
    for result in results:
        assert result[inf + "/steps"] == result[clean + "/steps"] - 1
        assert result[inf + "/scale"] == result[clean + "/scale"] / 2
        for w in _weights(result, inf):
            assert np.all(np.isfinite(w))
    for key in results[0].files:
        np.testing.assert_array_equal(
            results[1][key], results[0][key], err_msg=key
        )
