"""Shared test setup: quiet TensorFlow and four logical CPUs.

Four logical CPU devices let `MirroredStrategy` run several replicas in one
process for the fast distribution tests; real multi-process runs are in the
tests marked `multiworker`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4

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
