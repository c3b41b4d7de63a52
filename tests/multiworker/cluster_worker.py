"""A worker that joins its cluster and leaves it with models.common.cluster.

    cluster_worker.py MODE

MODE "slow_chief": the chief works 12 s longer than the other workers at
the end, longer than the coordination service's 10 s heartbeat timeout.
MODE "worker_leaves": worker 1 exits at once, without `finish_run`.
MODE "no_finish": every worker exits without `finish_run` (the chief
12 s late), as the mains did.
Every worker that gets to the end prints "finished".
"""

import os
import sys
import time

from tfgc import quiet

tf = quiet.import_tensorflow()

from models.common import cluster  # noqa: E402

mode = sys.argv[1]
strategy = cluster.multi_worker_strategy(startup_timeout=60)
total = strategy.reduce(
    "SUM", strategy.run(lambda: tf.constant(1.0)), axis=None
)
print("all-reduce", float(total), flush=True)
chief = strategy.cluster_resolver.task_id == 0
if mode == "worker_leaves" and not chief:
    os._exit(0)
if mode in ("slow_chief", "no_finish") and chief:
    time.sleep(12)
if mode != "no_finish":
    cluster.finish_run()
print("finished", flush=True)
