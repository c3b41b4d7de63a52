"""The exchange overlaps the backward pass, and the updates overlap the
exchange: on 2 real workers, profiled training steps show the first
bucket's collective starting before the backward pass's last gradient op
ends, and the first variable's update before the last bucket's collective
ends; with one fused exchange (`bucket_bytes=None`) the collective only
after the backward pass and the update only after the collective started.

The dataflow allows the overlap (tests/optimizers/test_buckets.py shows
it in the graph); whether the executor takes it in a given step is its
scheduling: on a busy two-core machine it once ran every gradient op
before the waiting collective. So the overlap must show in one of
PROFILED_STEPS steps, and its absence in one exchange in every step."""

import json

import pytest

from tests.workers import launch_worker_script

pytestmark = pytest.mark.multiworker

NUM_WORKERS = 2
# overlap_worker.py: hidden Dense layers of 512 x 512 (1 MiB of float32
# each), so that each kernel is a bucket of its own.
LAYERS = 6
LOCAL_BATCH = 256
BUCKET_BYTES = 512 * 1024
PROFILED_STEPS = 3
# (bucket_bytes, non_finite) of each profiled run.
RUNS = (
    (BUCKET_BYTES, "propagate"),
    (BUCKET_BYTES, "skip"),
    (None, "propagate"),
)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("overlap")
    code, log = launch_worker_script(
        "overlap_worker.py", NUM_WORKERS, ["--out", str(out)], timeout=600
    )
    assert code == 0, log[-5000:]
    return json.loads((out / "overlap.json").read_text())


@pytest.mark.parametrize("non_finite", ["propagate", "skip"])
def test_buckets_start_communicating_during_the_backward_pass(
    profiles, non_finite
):
    """Under the non-finite guard too: its verdicts travel with the
    buckets."""
    steps = profiles[f"{BUCKET_BYTES} {non_finite}"]
    assert len(steps) == PROFILED_STEPS
    for step in steps:
        assert step["gradient_ops"] > 0, step
        assert step["first_bucket_collectives"] > 0, step
    assert any(
        s["first_collective_start"] < s["last_gradient_end"] for s in steps
    ), steps


def test_a_buckets_update_runs_while_later_buckets_communicate(profiles):
    steps = profiles[f"{BUCKET_BYTES} propagate"]
    assert all(step["update_ops"] > 0 for step in steps), steps
    assert any(
        s["first_update_start"] < s["last_collective_end"] for s in steps
    ), steps


def test_one_fused_exchange_waits_for_every_gradient(profiles):
    """The update reads the one exchange's sums, so it starts after that
    collective has started; not necessarily after its profiled span ends,
    which includes handing its outputs on (the executor may start the
    update from the collective's completion callback)."""
    steps = profiles["None propagate"]
    assert len(steps) == PROFILED_STEPS
    for run in steps:
        assert run["gradient_ops"] > 0 and run["first_bucket_collectives"] > 0
        assert run["first_collective_start"] >= run["last_gradient_end"], run
        assert run["first_update_start"] >= run["last_collective_start"], run
        assert run["first_update_start"] >= run["last_gradient_end"], run
