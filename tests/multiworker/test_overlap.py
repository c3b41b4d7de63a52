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


# TensorFlow's profiler now and then crashes its process in `stop()` (a
# double free or a segfault: in 5 of 29 runs of overlap_worker.py on the
# 2-core build machine). Such a run says nothing about tfgc; it runs again.
ATTEMPTS = 3


def profiler_crashed(log: str) -> bool:
    """Whether a worker died inside TensorFlow's profiler: the stack its
    fault handler printed (most recent call first) starts in the
    profiler's `stop`."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "Fatal Python error" in line:
            calls = [c for c in lines[i : i + 8] if 'File "' in c]
            return (
                bool(calls)
                and "profiler" in calls[0]
                and " in stop" in calls[0]
            )
    return False


def test_only_a_crash_in_the_profiler_counts_as_one():
    crash = (
        "[worker 1] double free or corruption (out)\n"
        "[worker 1] Fatal Python error: Aborted\n"
        "[worker 1] \n"
        "[worker 1] Current thread 0x7f2b (most recent call first):\n"
        '[worker 1]   File "/x/tensorflow/python/profiler/profiler_v2.py", '
        "line 149 in stop\n"
        '[worker 1]   File "/x/overlap_worker.py", line 91 in profiled_steps\n'
    )
    assert profiler_crashed(crash)
    elsewhere = crash.replace("profiler/profiler_v2.py", "ops/top_k.py")
    assert not profiler_crashed(elsewhere)
    assert not profiler_crashed("AssertionError: no overlap")


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    for _ in range(ATTEMPTS):
        out = tmp_path_factory.mktemp("overlap")
        code, log = launch_worker_script(
            "overlap_worker.py", NUM_WORKERS, ["--out", str(out)], timeout=600
        )
        if code == 0 or not profiler_crashed(log):
            break
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
