"""`PlanSummary`: the plan of `compressor="auto"` in TensorBoard."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfgc.callbacks.statistics import find_compressed

_TEXT = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="text")
).SerializeToString()


class PlanSummary(keras.callbacks.Callback):
    """Writes the planner's table (`optimizer.plan.table()`) as TensorBoard
    text when training starts, and its predicted against measured step
    (`optimizer.plan_report().text()`) at the end of every epoch, under
    `tfgc/plan` in `log_dir` (only the chief writes).

    Args:
        log_dir: the directory TensorBoard reads (the Keras `TensorBoard`
            callback's `log_dir` puts them side by side).
    """

    def __init__(self, log_dir: str):
        super().__init__()
        if not isinstance(log_dir, str) or not log_dir:
            raise ValueError(
                "`log_dir` must be a directory path. Received: "
                f"log_dir={log_dir!r}"
            )
        self.log_dir = log_dir
        self._writer = None

    def _optimizer(self):
        optimizer = find_compressed(getattr(self.model, "optimizer", None))
        if optimizer is None or optimizer.plan is None:
            raise ValueError(
                "PlanSummary needs a model compiled with "
                'tfgc.CompressedOptimizer(compressor="auto"). Received '
                f"optimizer: {getattr(self.model, 'optimizer', None)!r}"
            )
        return optimizer

    def _write(self, text: str, step: int) -> None:
        if not tf.distribute.get_strategy().extended.should_checkpoint:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default():
            # TensorBoard's text plugin reads a string tensor so marked;
            # written with core TF, which needs no TensorBoard installed.
            tf.summary.write("tfgc/plan", tf.constant(text), step, _TEXT)
        self._writer.flush()

    def on_train_begin(self, logs=None):
        self._write(self._optimizer().plan.table(), step=0)

    def on_epoch_end(self, epoch, logs=None):
        found = self._optimizer().plan_report()
        if found is not None:
            self._write(found.text(), step=epoch + 1)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
