"""Every replica's value of per-replica variables, for saving and loading.

The wrapper's own variables (error-feedback residuals, RedSync momenta,
PowerSGD/ACP factors, SBC's round start, accumulators, counters) are
created with `aggregation="none"`: each replica keeps its own value. Keras
and TensorFlow save one copy of such a variable (the first replica's) and
restore it to every replica, which silently replaces every other worker's
state. These helpers gather the values of all replicas, in replica order,
so that one file holds them all, and give each replica its own row back.

Under MultiWorkerMirroredStrategy both run collectives: every worker must
save and load at the same point (as `model.save_weights` in Keras's
`BackupAndRestore` does on every worker).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def gather(strategy: tf.distribute.Strategy, variables) -> list[np.ndarray]:
    """[replicas, *shape] per variable: row r is replica r's value."""
    if strategy.num_replicas_in_sync == 1:
        return [np.asarray(v.numpy())[None] for v in variables]
    # One gather per dtype of every variable flattened into one buffer:
    # one collective each, not one per variable.
    dtypes = sorted({tf.as_dtype(v.dtype).name for v in variables})

    def local():
        # In a replica context a variable reads that replica's copy.
        return [
            tf.concat(
                [
                    tf.reshape(tf.convert_to_tensor(v), [1, -1])
                    for v in variables
                    if tf.as_dtype(v.dtype).name == dtype
                ],
                axis=1,
            )
            for dtype in dtypes
        ]

    buffers = {
        dtype: strategy.gather(value, axis=0).numpy()
        for dtype, value in zip(dtypes, strategy.run(local))
    }
    offsets = dict.fromkeys(dtypes, 0)
    out = []
    for v in variables:
        dtype = tf.as_dtype(v.dtype).name
        size = int(np.prod(v.shape))
        start = offsets[dtype]
        offsets[dtype] += size
        rows = buffers[dtype][:, start : start + size]
        out.append(rows.reshape((-1, *v.shape)))
    return out


def scatter(
    strategy: tf.distribute.Strategy, variables, stacked: list[np.ndarray]
) -> None:
    """Assigns row r of each of `stacked` to replica r's copy."""
    if strategy.num_replicas_in_sync == 1:
        for variable, rows in zip(variables, stacked):
            variable.assign(rows[0])
        return
    rows = [tf.constant(s) for s in stacked]

    def local():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        for variable, values in zip(variables, rows):
            variable.assign(tf.gather(values, replica))

    tf.function(lambda: strategy.run(local))()
