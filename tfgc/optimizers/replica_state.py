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

import warnings

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
                "saved with another model, compressor, inner optimizer or "
                "tfgc version."
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


def per_replica(variable) -> bool:
    """Whether each replica keeps its own value of `variable`."""
    return getattr(variable, "aggregation", None) == "none"


class Saver:
    """Saves and restores every replica's value of an optimizer's
    per-replica variables, for Keras saving and `tf.train.Checkpoint`.

    Args:
        strategy: the distribution strategy the variables live in.
        variables: returns the optimizer's variables, in saving order.
        regroup: `regroup(stacked, replicas)`: the per-replica variables'
            rows saved with another number of replicas (a list in
            `per_replica_variables` order), for `replicas` replicas.
        name: the optimizer's name, for messages.
        remade: returns the per-replica variables whose shapes were made
            from this run's measurements at build (the planner's: one
            value per bucket of its plan). Where the saved ones have other
            shapes (the checkpoint's plan cut other buckets), this run's
            are kept, with a warning; every other variable must fit.
    """

    def __init__(self, strategy, variables, regroup, name: str, remade=list):
        self._strategy = strategy
        self._variables = variables
        self._regroup = regroup
        self._name = name
        self._remade = remade

    def per_replica_variables(self) -> list:
        """The variables each replica keeps its own value of, in order."""
        return [v for v in self._variables() if per_replica(v)]

    def checkpoint_entry(self) -> ReplicaValues:
        """The `tf.train.Checkpoint` entry that holds the same values."""
        return ReplicaValues(
            self._strategy, self.per_replica_variables, self.restore
        )

    def save(self, store) -> None:
        """Writes the variables to a Keras saving `store`: every replica's
        value of the per-replica ones (compressor states, accumulators,
        counters), stacked [replicas, ...], the others (the inner
        optimizer's, the same on every replica) once, as Keras does; and
        the number of replicas. Under MultiWorkerMirroredStrategy this
        gathers from every worker: every worker must save at the same
        step (Keras's `BackupAndRestore` and tfgc's do)."""
        variables = self._variables()
        stacked = iter(gather(self._strategy, self.per_replica_variables()))
        for i, variable in enumerate(variables):
            store[str(i)] = (
                next(stacked) if per_replica(variable) else variable.numpy()
            )
        store[REPLICAS_KEY] = np.array(self._strategy.num_replicas_in_sync)

    def load(self, store) -> bool:
        """Reads what `save` wrote, giving each replica its own state back;
        False for a store written before per-replica saving (one copy for
        all), which the caller loads as Keras does."""
        if REPLICAS_KEY not in store:
            return False
        variables = self._variables()
        if len(store.keys()) - 1 != len(variables):
            raise ValueError(
                f"The saved optimizer {self._name!r} has "
                f"{len(store.keys()) - 1} variables and this one "
                f"{len(variables)}: it was saved with another model, "
                "compressor, error_feedback, inner optimizer or tfgc "
                "version. Build the same configuration to load it."
            )
        stacked = []
        for i, variable in enumerate(variables):
            value = np.asarray(store[str(i)])
            if per_replica(variable):
                stacked.append(value)
            else:
                variable.assign(value)
        self.restore(int(np.asarray(store[REPLICAS_KEY])), stacked)
        return True

    def restore(self, saved: int, stacked) -> None:
        """Row r of each of `stacked` (saved with `saved` replicas) to
        replica r. Saved with another number of replicas, the rows are
        regrouped first (`regroup`: what sums over workers, such as the
        error-feedback residuals, divided evenly among the new replicas,
        so nothing that was not yet sent is lost; the other compressor
        state from its initial value), with a warning."""
        replicas = self._strategy.num_replicas_in_sync
        variables = self.per_replica_variables()
        kept = self._misfits(variables, stacked)
        if saved != replicas:
            stacked = self._regroup(stacked, replicas)
        if kept:
            pairs = [
                (v, s) for v, s in zip(variables, stacked) if id(v) not in kept
            ]
            variables, stacked = [v for v, _ in pairs], [s for _, s in pairs]
        scatter(self._strategy, variables, stacked)
        if saved == replicas:
            return
        warnings.warn(
            f"The optimizer {self._name!r} was saved with {saved} replicas "
            f"and is loaded with {replicas}: what the workers had not yet "
            "sent (error-feedback residuals, accumulated momenta and "
            "gradients) is divided evenly among the new replicas, so its "
            "sum is kept; low-rank factors and the rest of the compressor "
            "state start afresh, the same on every worker. Weights, the "
            "inner optimizer's state and the step are restored.",
            stacklevel=4,
        )

    def _misfits(self, variables, stacked) -> set[int]:
        """The ids of the variables to keep as they are: every `remade`
        one where any of them does not fit its saved rows. Raises where
        another variable does not fit."""
        remade = {id(v) for v in self._remade()}
        misfits = [
            (v, tuple(np.shape(rows)[1:]))
            for v, rows in zip(variables, stacked)
            if tuple(np.shape(rows)[1:]) != tuple(v.shape)
        ]
        for v, shape in misfits:
            if id(v) not in remade:
                raise ValueError(
                    f"The saved optimizer {self._name!r} holds "
                    f"{v.name!r} with shape {shape} and this one with "
                    f"shape {tuple(v.shape)}: it was "
                    "saved with another model, compressor or inner "
                    "optimizer. Build the same configuration to load it."
                )
        if not misfits:
            return set()
        warnings.warn(
            f"The optimizer {self._name!r} was saved with a plan of other "
            "buckets than the one this run measured at build "
            "(compressor='auto'), or by a tfgc version that kept the "
            "plan's timings in other shapes: this run's plan is kept, its "
            "timings and "
            "trials from the start; the weights and every compressor's "
            "state are restored. To keep the saved plan, build with "
            "Auto(choices=...) set to the saved run's `optimizer.plan."
            "choices`.",
            stacklevel=4,
        )
        return remade
