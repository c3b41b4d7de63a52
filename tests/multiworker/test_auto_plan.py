"""`compressor="auto"` on real workers (one process each): every worker
measures on its own and all of them plan alike, so their collectives
match and the training runs in step."""

import numpy as np
import pytest

from tests.multiworker.auto_worker import STEPS
from tests.workers import run_worker_script
from tfgc.optimizers.plan_clock import SETTLE

pytestmark = pytest.mark.multiworker


@pytest.mark.parametrize("workers", [2, 3])
def test_every_worker_makes_the_same_plan(tmp_path, workers):
    results = run_worker_script("auto_worker.py", workers, tmp_path)
    first = results[0]
    # Three layers' kernels and biases in 512 KiB buckets: several.
    assert len(first["choices"]) > 1
    assert first["collectives"][1] > 0  # an all-reduce costs per byte
    for other in results[1:]:
        for key in ("choices", "seconds", "collectives", "codecs"):
            np.testing.assert_array_equal(other[key], first[key], key)
        # The same sums applied everywhere: the replicas stay equal.
        np.testing.assert_array_equal(other["weights"], first["weights"])
    for result in results:
        assert int(result["exchanges"]) == STEPS - SETTLE
        assert np.all(result["busy"] > 0)
