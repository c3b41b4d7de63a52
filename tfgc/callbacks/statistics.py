"""`CompressionStats`: the bytes compression saves, in the Keras logs."""

from __future__ import annotations

import keras


def find_compressed(optimizer):
    """The `CompressedOptimizer` in `optimizer` or the optimizers it wraps
    (e.g. a `LossScaleOptimizer`), else None."""
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
        optimizer = find_compressed(getattr(self.model, "optimizer", None))
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
