"""Run by test_buckets.py in a process of its own: two replicas (two logical
CPUs), each all-reduced compressor trained with one exchange and with
buckets; prints {compressor: largest weight difference} as JSON."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

from tests.optimizers.test_buckets import COMPRESSORS, linear, train  # noqa: E402

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
differences = {}
for name in sorted(n for n in COMPRESSORS if linear(n)):
    one, _ = train(strategy, COMPRESSORS[name], None)
    many, counts = train(strategy, COMPRESSORS[name], 600)
    assert max(counts) > 1, (name, counts)
    differences[name] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(one, many)
    )
print(json.dumps(differences))
