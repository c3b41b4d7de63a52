"""Shared test setup: quiet TensorFlow, four logical CPUs, and (in CI) the
compiled ops required.

Four logical CPU devices let `MirroredStrategy` run several replicas in one
process for the fast distribution tests; real multi-process runs are in the
tests marked `multiworker`.

Without the compiled custom ops the tests of them skip and everything else
runs on the pure-TF reference ops, which a developer without a compiler
wants. `TFGC_REQUIRE_CUSTOM_OPS=1` (set by .ci/run) makes the session fail
before any test instead, so a green CI run always tested the compiled ops.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4
REQUIRE_ENV = "TFGC_REQUIRE_CUSTOM_OPS"

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)


@pytest.fixture(scope="session")
def mirrored():
    """One MirroredStrategy over the logical CPUs for the whole session.

    Separate strategies in one process reuse collective instance keys, and
    the runtime then rejects a gather under a key it saw as an all-reduce.
    """
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(NUM_LOGICAL_CPUS)]
    )


def pytest_sessionstart(session):
    """With TFGC_REQUIRE_CUSTOM_OPS=1, ends the session (exit status 1)
    unless `tfgc.ops` runs the compiled ops."""
    del session
    if os.environ.get(REQUIRE_ENV, "").strip().lower() in ("", "0", "false"):
        return
    from tfgc.ops import _library

    if not _library.using_custom_ops():
        why = _library.load_error() or f"{_library.DISABLE_ENV} is set"
        pytest.exit(
            f"{REQUIRE_ENV}=1 but tfgc's compiled custom ops are not in use "
            f"({why}). Build them: `python -m custom_ops.build`.",
            returncode=pytest.ExitCode.TESTS_FAILED,
        )
