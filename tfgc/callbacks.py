"""Keras callbacks that show what compression saves."""

from __future__ import annotations

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
