"""An interrupted multi-worker run resumes exactly: real workers (one
process each), a hard stop of every worker after the first epoch's backup,
and the same command again, against the run that never stopped."""

import numpy as np
import pytest

from tests.workers import launch_worker_script

pytestmark = pytest.mark.multiworker

NUM_WORKERS = 2
#: How checkpoint_worker.py exits after the first epoch's backup.
EXIT_AFTER_FIRST_EPOCH = 17


def _launch(out, backup, phase):
    return launch_worker_script(
        "checkpoint_worker.py",
        NUM_WORKERS,
        [f"--out={out}", f"--backup={backup}", f"--phase={phase}"],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("checkpoint")
    code, log = _launch(out, out / "backup_through", "through")
    assert code == 0, log[-5000:]
    backup = out / "backup"
    code, log = _launch(out, backup, "first")
    assert code == EXIT_AFTER_FIRST_EPOCH, log[-5000:]
    assert backup.is_dir()
    code, log = _launch(out, backup, "resume")
    assert code == 0, log[-5000:]
    return {
        phase: [
            np.load(out / f"{phase}_worker{i}.npz") for i in range(NUM_WORKERS)
        ]
        for phase in ("through", "resume")
    }


def test_resumed_run_equals_the_run_that_never_stopped(runs):
    for through, resumed in zip(runs["through"], runs["resume"]):
        assert int(resumed["steps"]) == int(through["steps"])
        for key in resumed.files:
            np.testing.assert_allclose(
                resumed[key], through[key], rtol=1e-6, atol=1e-7, err_msg=key
            )


def test_tf_train_checkpoint_restores_each_workers_residual(runs):
    for through in runs["through"]:
        restored = [k for k in through.files if k.startswith("tf_checkpoint")]
        assert restored
        for key in restored:
            own = key.removeprefix("tf_checkpoint_")
            np.testing.assert_array_equal(through[key], through[own])


def test_each_worker_kept_its_own_residual(runs):
    first, last = runs["resume"][0], runs["resume"][-1]
    residuals = [k for k in first.files if k.startswith("residual")]
    assert residuals
    assert any(not np.array_equal(first[k], last[k]) for k in residuals)


def test_the_backup_is_removed_after_the_run(runs, tmp_path_factory):
    del runs
    root = tmp_path_factory.getbasetemp()
    assert not list(root.glob("checkpoint*/backup"))
