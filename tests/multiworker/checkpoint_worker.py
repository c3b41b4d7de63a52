"""Runs inside every worker of tests/multiworker/test_checkpoint.py.

Trains two epochs with TopK and error feedback under
MultiWorkerMirroredStrategy, each worker on its own share of the data (so
the residuals differ), with `tfgc.callbacks.BackupAndRestore`.
`--phase through` trains without stopping; `--phase first` stops every
worker hard (`os._exit`) after the first epoch's backup; `--phase resume`
is the same command again, which restores from the backup and trains the
second epoch. `--phase killed` has the last worker send itself a signal
in the second epoch, and the others must then fail on their own. Each
writes the weights and this worker's residuals to
`<out>/<phase>_worker<i>.npz`; `through` also round-trips a
`tf.train.Checkpoint` and adds the residuals it restored.
"""

import argparse
import os
import signal
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tfgc
from tests.keras_models import (
    fit_small_model,
    small_model,
    worker_batches,
)
from tests.multiworker.test_checkpoint import EXIT_AFTER_FIRST_EPOCH

LOCAL_BATCH, STEPS, EPOCHS = 8, 4, 2


def make_optimizer():
    return tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9),
        tfgc.compressors.TopK(density=0.25),
        min_compress_size=0,
    )


class SignalSelf(keras.callbacks.Callback):
    """The last worker sends itself `signal` in the second epoch (after
    the first epoch's backup): SIGKILL as a crash, SIGSTOP as a host that
    stops answering."""

    def __init__(self, sig):
        super().__init__()
        self.sig = sig

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and batch == 2:
            os.kill(os.getpid(), self.sig)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


class StopHard(keras.callbacks.Callback):
    """Ends the process after the first epoch, as a crash would."""

    def on_epoch_end(self, epoch, logs=None):
        os._exit(EXIT_AFTER_FIRST_EPOCH)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backup", required=True)
    parser.add_argument(
        "--phase", choices=["through", "first", "killed", "resume"]
    )
    parser.add_argument("--signal", default="SIGKILL")
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    dataset, _ = worker_batches(
        strategy.num_replicas_in_sync, LOCAL_BATCH, STEPS
    )
    callbacks = [tfgc.callbacks.BackupAndRestore(args.backup)]
    if args.phase == "first":
        callbacks.append(StopHard())  # after the backup: callbacks in order
    last = index == strategy.num_replicas_in_sync - 1
    if args.phase == "killed" and last:
        callbacks.append(SignalSelf(getattr(signal, args.signal)))
    model = fit_small_model(
        strategy,
        make_optimizer,
        dataset,
        epochs=EPOCHS,
        callbacks=callbacks,
    )
    optimizer = model.optimizer
    results = {"steps": optimizer.iterations.numpy()}
    for j, w in enumerate(model.get_weights()):
        results[f"weight{j}"] = w
    residuals = [v for v in optimizer.variables if "residual" in v.path]
    for j, v in enumerate(residuals):
        results[f"residual{j}"] = v.numpy()  # this worker's own copy
    if args.phase == "through":
        results.update(tf_checkpoint_round_trip(strategy, model, args.backup))
    np.savez(
        os.path.join(args.out, f"{args.phase}_worker{index}.npz"), **results
    )


def tf_checkpoint_round_trip(strategy, model, backup):
    """Saves a `tf.train.Checkpoint` (the chief to a shared directory, the
    others to their own, as TensorFlow asks), restores the chief's into a
    fresh model on every worker, and returns this worker's restored
    residuals."""
    shared = backup + "_tf_checkpoint"
    target = (
        shared if strategy.extended.should_checkpoint else tempfile.mkdtemp()
    )
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
        os.path.join(target, "ckpt")
    )
    # A barrier: the chief has written its file once every worker is here.
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    fresh = small_model(strategy, make_optimizer)
    with strategy.scope():
        fresh.optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).restore(
        tf.train.latest_checkpoint(shared)
    )
    residuals = [v for v in fresh.optimizer.variables if "residual" in v.path]
    return {
        f"tf_checkpoint_residual{j}": v.numpy() for j, v in enumerate(residuals)
    }


if __name__ == "__main__":
    main()
