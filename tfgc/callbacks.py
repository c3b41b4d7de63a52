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
    """Adds `CompressedOptimizer.compression_stats()` to the logs.

    Put this callback in `model.fit(callbacks=[...])`; the progress bar,
    `History`, TensorBoard and CSV loggers then show the values like any
    metric. All are per worker, in bytes before the collective's own
    transport factor (a ring all-reduce moves 2(p-1)/p of its buffer per
    worker). Of the last step:

    - `sent_bytes`: the compressed payloads this worker sent, measured
      from the tensors.
    - `overhead_bytes`: what went on the wire beyond them (headers, and
      the padding of gathers whose payloads differ in size between
      workers).
    - `intra_host_bytes`: what stayed inside the host (the hierarchical
      communicator; 0 otherwise).
    - `dense_bytes`: what an uncompressed all-reduce of the same
      gradients carries.
    - `compression_ratio`: dense / (sent + overhead).

    Over every step since the optimizer was built:

    - `run_steps`: the steps counted.
    - `run_mean_bytes`: (sent + overhead) per step.
    - `run_compression_ratio`: dense / run_mean_bytes (with SBC's
      communication delay most steps send nothing, so this, not the last
      step's ratio, is what the run saved).
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
