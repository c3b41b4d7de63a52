"""Shared test setup: quiet TensorFlow and four logical CPUs.

Four logical CPU devices let `MirroredStrategy` run several replicas in one
process for the fast distribution tests; real multi-process runs are in the
tests marked `multiworker`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)
