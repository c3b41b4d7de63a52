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
`BackupAndRestore` does on every worker, and as TensorFlow asks of
`tf.train.Checkpoint.save`).

Keras saving calls the optimizer's `save_own_variables`; for
`tf.train.Checkpoint`, `ReplicaValues` is a checkpoint entry (TensorFlow's
trackable protocol) that holds the same stacked values.
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


REPLICAS_KEY = "replicas"


class ReplicaValues(tf.__internal__.tracking.Trackable):
    """A `tf.train.Checkpoint` entry with every replica's value of the
    variables `variables()` returns, stacked [replicas, ...], and their
    number; restoring calls `load(saved_replicas, stacked)`."""

    def __init__(self, strategy, variables, load):
        self._strategy = strategy
        self._variables = variables
        self._load = load

    def _serialize_to_tensors(self):
        stacked = gather(self._strategy, self._variables())
        tensors = {str(i): tf.constant(s) for i, s in enumerate(stacked)}
        tensors[REPLICAS_KEY] = tf.constant(
            self._strategy.num_replicas_in_sync, tf.int64
        )
        return tensors

    def _restore_from_tensors(self, restored_tensors):
        count = len(self._variables())
        if len(restored_tensors) - 1 != count:
            raise ValueError(
                f"The checkpoint holds {len(restored_tensors) - 1} "
                f"per-replica variables and this optimizer {count}: it was "
                "saved with another model, compressor or inner optimizer."
            )
        stacked = [restored_tensors[str(i)].numpy() for i in range(count)]
        self._load(int(restored_tensors[REPLICAS_KEY]), stacked)
        return tf.no_op()


def track(owner, entry: ReplicaValues, name: str = "replica_values") -> None:
    """Makes `entry` a checkpoint dependency of `owner` (a Keras object).

    Called from a Keras `build`, where attribute assignment does not track,
    so the dependency is added explicitly; if a restore is pending for
    `owner`, TensorFlow restores the entry now, after the variables the
    build created.
    """
    owner._track_trackable(entry, name=name, overwrite=True)
