"""Keras callbacks the mains share, and the list every main installs."""

from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import keras
import tensorflow as tf
from absl import logging
from tensorflow.core.framework import summary_pb2

import tfgc
from models.common import backup as backup_lib
from models.common import stopping

# TensorBoard's scalar plugin reads summaries tagged with this metadata.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)


def write_scalars(writer, values: dict, step: int, prefix: str = "") -> None:
    """Writes `values` as TensorBoard scalars with `writer` at `step`.

    Uses `tf.summary.write` with the scalar plugin's metadata, which needs
    no `tensorboard` package (TensorFlow 2.21 does not depend on it).
    """
    with writer.as_default():
        for name, value in values.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
            tf.summary.write(
                prefix + name,
                tf.constant(value, tf.float32),
                step=step,
                metadata=_SCALAR_METADATA,
            )
    writer.flush()


class Throughput(keras.callbacks.Callback):
    """Measures examples/s and step time every `log_steps` steps.

    At every `log_steps`-th step (counted over the whole run, 1-based, as
    Keras's TensorBoard counts) it adds `examples_per_second` and
    `step_time` to the batch logs, so that TensorBoard and the progress bar
    show them, and logs a line with absl. Time spent between epochs
    (checkpointing, evaluation) is not counted.

    Args:
        global_batch_size: examples per step over all replicas.
        log_steps: measure every this many steps.
    """

    def __init__(self, global_batch_size: int, log_steps: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.log_steps = log_steps
        self.step = 0
        #: `(step, examples_per_second, step_time)` of every window.
        self.records: list[tuple[int, float, float]] = []
        self._start = None
        self._steps_in_window = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._steps_in_window = 0

    def _record(self, logs):
        elapsed = time.perf_counter() - self._start
        step_time = elapsed / self._steps_in_window
        rate = self.global_batch_size / step_time
        self.records.append((self.step, rate, step_time))
        logging.info(
            "step %d: %.1f examples/s, %.4f s/step",
            self.step,
            rate,
            step_time,
        )
        if logs is not None:
            logs["examples_per_second"] = rate
            logs["step_time"] = step_time
        self._start = time.perf_counter()
        self._steps_in_window = 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self._steps_in_window += 1
        if self.step % self.log_steps == 0:
            self._record(logs)

    def on_epoch_end(self, epoch, logs=None):
        if self._steps_in_window:
            self._record(None)

    def steady_examples_per_second(self) -> float | None:
        """Mean rate over the windows after the first (tracing) one.

        Returns the only window's rate if there is one, `None` if none.
        """
        if not self.records:
            return None
        rates = [rate for _, rate, _ in self.records]
        steady = rates[1:] or rates
        return sum(steady) / len(steady)


class Perplexity(keras.callbacks.Callback):
    """Adds `perplexity` = exp(`loss`) (and `val_perplexity`) to the logs.

    The loss must be the mean cross entropy per token in nats.
    """

    @staticmethod
    def add(logs: dict | None, prefix: str = "") -> None:
        if logs and f"{prefix}loss" in logs:
            loss = float(logs[f"{prefix}loss"])
            logs[f"{prefix}perplexity"] = math.exp(min(loss, 700.0))

    def on_train_batch_end(self, batch, logs=None):
        self.add(logs)

    def on_epoch_end(self, epoch, logs=None):
        self.add(logs)
        self.add(logs, "val_")


class ScalarSummaries(keras.callbacks.Callback):
    """TensorBoard scalars of the logs: every `log_steps` steps and epoch.

    Writes `batch/<name>` for every log value at every `log_steps`-th step
    (loss, metrics, compression ratio, bytes, step time, examples/s) and
    `epoch/<name>` at the end of every epoch, under `log_dir/train`.

    Args:
        log_dir: TensorBoard log directory.
        log_steps: write batch scalars every this many steps.
    """

    def __init__(self, log_dir: str, log_steps: int):
        super().__init__()
        self.log_dir = log_dir
        self.log_steps = log_steps
        self.step = 0
        self._writer = None

    @property
    def writer(self):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(
                os.path.join(self.log_dir, "train")
            )
        return self._writer

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if logs and self.step % self.log_steps == 0:
            write_scalars(self.writer, logs, self.step, "batch/")

    def on_epoch_end(self, epoch, logs=None):
        if logs:
            write_scalars(self.writer, logs, epoch + 1, "epoch/")

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class RunCallbacks(NamedTuple):
    """The callbacks of a run, in order, and the members the run reads."""

    callbacks: list[keras.callbacks.Callback]
    throughput: Throughput
    backup: tfgc.callbacks.BackupAndRestore
    run_state: backup_lib.RunState


def make_callbacks(
    *,
    model_dir: str,
    output_dir: str,
    global_batch_size: int,
    log_steps: int,
    settings: dict,
    extra: tuple[keras.callbacks.Callback, ...] = (),
    backup_steps: int | None = None,
    signals: stopping.Signals | None = None,
    num_workers: int = 1,
) -> RunCallbacks:
    """The callbacks every main installs, in an order that matters.

    `ResumedEpochLogs` comes first (it corrects the metrics of an epoch
    resumed in its middle); callbacks that add values to the logs
    (compression stats, `extra`, throughput) come before the TensorBoard
    writer and the run state; the backup follows them (its state includes
    the epoch just logged), and the signal check comes last (it saves at
    the step it stops at, after the epoch's own backup). Keras appends
    its progress bar and `History` after these.

    Args:
        model_dir: `--model_dir`; the backup lives in `model_dir/backup`,
            is written by the chief with every worker's compressor state
            and is read by every worker.
        output_dir: where this worker writes TensorBoard summaries
            (`model_dir` on the chief, a temporary directory elsewhere).
        global_batch_size: examples per step over all replicas.
        log_steps: throughput and batch summaries every N steps.
        settings: the run's settings, stored with each backup (a backup of
            other settings is refused).
        extra: model-specific callbacks that add to the logs.
        backup_steps: also back up every N global steps; `None`: at
            epoch ends (and signal stops) only.
        signals: the main's `Signals`; `None` leaves signals alone.
        num_workers: worker processes in the cluster.

    Returns:
        The callbacks and the members the run reads.
    """
    resumed_logs = backup_lib.ResumedEpochLogs()
    throughput = Throughput(global_batch_size, log_steps)
    summaries = ScalarSummaries(
        os.path.join(output_dir, backup_lib.TENSORBOARD_DIR), log_steps
    )
    backup = tfgc.callbacks.BackupAndRestore(
        os.path.join(model_dir, backup_lib.BACKUP_DIR),
        # Removed once the summary says finished, not when fit ends.
        delete_checkpoint=False,
        resume_mid_epoch=True,
    )
    run_state = backup_lib.RunState(
        settings, throughput, summaries, resumed_logs, backup
    )
    backup.extra_state = run_state.state
    callbacks = [
        resumed_logs,
        tfgc.callbacks.CompressionStats(),
        *extra,
        throughput,
        summaries,
        run_state,
        backup,
    ]
    if backup_steps:
        callbacks.append(
            backup_lib.PeriodicBackup(backup, throughput, backup_steps)
        )
    if signals is not None:
        callbacks.append(stopping.StopOnSignal(signals, backup, num_workers))
    return RunCallbacks(callbacks, throughput, backup, run_state)
