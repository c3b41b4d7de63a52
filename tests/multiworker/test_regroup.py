"""A checkpoint restored on another number of workers keeps what the
workers had not yet sent: real workers (one process each) save PowerSGD's
error-feedback residuals, and another number of workers loads them; the
sum of every residual over the workers is the same, each new worker holds
an even share, and the low-rank factors restart the same on every
worker."""

import numpy as np
import pytest

from tests.workers import launch_worker_script

pytestmark = pytest.mark.multiworker


def _sum(rows):
    return np.sum([np.asarray(r, np.float64) for r in rows], axis=0)


def _run(out, path, phase, workers):
    code, log = launch_worker_script(
        "regroup_worker.py",
        workers,
        [f"--out={out}", f"--path={path}", f"--phase={phase}"],
    )
    assert code == 0, log[-5000:]
    return [np.load(out / f"{phase}_worker{i}.npz") for i in range(workers)]


@pytest.mark.parametrize("saved, loaded", [(2, 3), (4, 2)])
def test_residual_sums_survive_another_worker_count(tmp_path, saved, loaded):
    path = tmp_path / "model.weights.h5"
    before = _run(tmp_path, path, "save", saved)
    after = _run(tmp_path, path, "load", loaded)
    residuals = [k for k in before[0].files if "residual" in k]
    factors = [k for k in before[0].files if k.endswith("_q")]
    assert residuals and factors, before[0].files
    for key in residuals:
        old = [w[key] for w in before]
        # The workers' residuals differ, or the sum could not tell.
        assert not np.array_equal(old[0], old[-1]), key
        new = [w[key] for w in after]
        np.testing.assert_allclose(
            _sum(new), _sum(old), rtol=1e-6, atol=1e-7, err_msg=key
        )
        for share in new[1:]:
            np.testing.assert_array_equal(share, new[0], err_msg=key)
    for key in factors:
        new = [w[key] for w in after]
        for factor in new[1:]:
            np.testing.assert_array_equal(factor, new[0], err_msg=key)
        # Restarted, not the saved (all-reduced) factor.
        assert not np.array_equal(new[0], before[0][key]), key
