"""Keras callbacks: what compression saves, and backups that keep every
worker's compressor state."""

from __future__ import annotations

import os
import shutil
import tempfile

import keras


def _find_compressed(optimizer):
    from tfgc.optimizers import CompressedOptimizer

    while optimizer is not None:
        if isinstance(optimizer, CompressedOptimizer):
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return None


class CompressionStats(keras.callbacks.Callback):
    """Adds `sent_bytes`, `dense_bytes` and `compression_ratio` to the logs.

    The values are per step and per worker: the bytes of the compressed
    payloads this worker sent in the last step, the bytes a dense
    all-reduce would carry, and their ratio. Put this callback in
    `model.fit(callbacks=[...])`; the progress bar, `History`, TensorBoard
    and CSV loggers then show them like any metric.
    """

    def _add(self, logs):
        if logs is None:
            return
        optimizer = _find_compressed(getattr(self.model, "optimizer", None))
        if optimizer is None:
            raise ValueError(
                "CompressionStats needs a model compiled with a "
                "tfgc.CompressedOptimizer. Received optimizer: "
                f"{getattr(self.model, 'optimizer', None)!r}"
            )
        logs.update(optimizer.compression_stats())

    def on_train_batch_end(self, batch, logs=None):
        self._add(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._add(logs)


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` for MultiWorkerMirroredStrategy.

    Saving a `CompressedOptimizer` gathers every worker's compressor state
    (residuals, momenta, factors) into the one file, so every worker must
    take part in each save. Keras's callback has every worker write that
    file to the same path at once; here only the chief (the worker with
    `strategy.extended.should_checkpoint`) writes `backup_dir` and deletes
    it at the end, the others save to a temporary file they delete. Every
    worker restores from `backup_dir`, which must therefore be shared by
    the workers (a cluster file system, or one machine). Arguments as for
    Keras's callback.
    """

    def _is_chief(self) -> bool:
        strategy = getattr(self.model, "distribute_strategy", None)
        return strategy is None or strategy.extended.should_checkpoint

    def _save_model(self):
        if self._is_chief():
            return super()._save_model()
        scratch = tempfile.mkdtemp(prefix="tfgc_backup_")
        try:
            self.model.save_weights(os.path.join(scratch, "x.weights.h5"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def on_train_end(self, logs=None):
        if self._is_chief():
            super().on_train_end(logs)
