"""Start N local workers for tf.distribute.MultiWorkerMirroredStrategy.

Each worker runs the same command with its own ``TF_CONFIG`` describing a
cluster of ``localhost`` ports, so a multi-worker training script can be
tried on one machine::

    python -m tfgc.launch -n 2 -- python examples/train.py --epochs 1

With ``--hosts M`` the workers are split into M consecutive groups that
look like M hosts: group h listens on the loopback address 127.0.0.(h+1),
so the cluster spec names M host names (for the hierarchical
communicator). They are still one machine: nothing is shaped or slower.

Every line a worker prints is echoed with a ``[worker i] `` prefix. If a
worker fails, the others are stopped and the launcher exits with the
failing worker's exit code; on ``--timeout`` it exits with 124.

Stopping is gentle first: the workers get SIGTERM once (the training mains
then save a backup and exit), then ``--grace`` seconds (default 40, above
the mains' default ``--stop_timeout`` of 30) to exit, and only then
SIGKILL. Ctrl-C (SIGINT) or SIGTERM to the launcher
stops the workers that way (exit code 130 or 143); a second Ctrl-C or
SIGTERM during the grace period kills them at once.

Quiet by default: the workers get ``TF_CPP_MIN_LOG_LEVEL=2`` unless the
environment sets a level, and the lines TensorFlow logs while it loads,
before that level takes effect (absl's and oneDNN's notices), are dropped
as that level asks (`tfgc.quiet`). ``--verbose`` shows everything.

This module does not import TensorFlow, so that it starts fast.
"""

from tfgc.launch.cli import main
from tfgc.launch.cluster import cluster_spec, free_ports, host_names, tf_config
from tfgc.launch.workers import (
    DEFAULT_GRACE,
    EXIT_TIMEOUT,
    Stopped,
    run,
    stop_workers,
)

__all__ = [
    "DEFAULT_GRACE",
    "EXIT_TIMEOUT",
    "Stopped",
    "cluster_spec",
    "free_ports",
    "host_names",
    "main",
    "run",
    "stop_workers",
    "tf_config",
]
