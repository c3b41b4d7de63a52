"""What a main keeps in `--model_dir` between runs, so that none is lost.

    model_dir/
      backup/            tfgc.callbacks.BackupAndRestore, while unfinished
      tensorboard/       train/ and eval/ scalars
      model.keras        the trained model and its optimizer state
      model.weights.h5   the trained weights alone
      summary.json       written last; "finished": true

Only the chief writes there, each file atomically. A backup carries, next
to the weights and optimizer state, the run state a resumed run needs to
go on as if never interrupted (`RunState`): the step, the per-epoch
history, the throughput windows, the training time so far, the settings
(a backup of other settings is refused) and, for a backup taken inside an
epoch, the metrics of that epoch so far (`ResumedEpochLogs` folds them
into the resumed epoch's).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

import keras
import tensorflow as tf
from absl import logging

import tfgc
from models.common import distribution, stopping
from models.common.config import CommonConfig

BACKUP_DIR = "backup"
MODEL_FILE = "model.keras"
WEIGHTS_FILE = "model.weights.h5"
SUMMARY_FILE = "summary.json"
TENSORBOARD_DIR = "tensorboard"

# Settings a resumed run may change: where things are, what is logged and
# evaluated, and how it stops. Every other one must match the backup's.
FREE_SETTINGS = frozenset(
    {
        "model_dir",
        "data_dir",
        "log_steps",
        "eval_steps",
        "skip_eval",
        "overwrite",
        "backup_steps",
        "stop_timeout",
    }
)


def _json(value: Any) -> Any:
    """`value` as it comes back from JSON (tuples as lists, ...)."""
    return json.loads(json.dumps(value))


def finished_summary(model_dir: str) -> dict | None:
    """The summary of a finished run in `model_dir`, or `None`."""
    try:
        with open(os.path.join(model_dir, SUMMARY_FILE)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(summary, dict) and summary.get("finished") is True:
        return summary
    return None


def check_model_dir(model_dir: str, overwrite: bool) -> dict | None:
    """What to do with a `model_dir` that may hold a finished run.

    Every worker calls it before the strategy is built (so before any
    worker can write there). A finished run is not trained again: its
    summary is returned, unless `overwrite` is set, in which case its
    files are removed and training starts from scratch. An unfinished run
    is resumed from its backup in either case.

    Returns:
        The finished run's summary, or `None` to train.
    """
    summary = finished_summary(model_dir)
    if summary is None:
        return None
    if not overwrite:
        logging.info(
            "%s holds a finished run (%s says finished): not training "
            "again. Pass --overwrite to train it again from scratch, or "
            "use another --model_dir.",
            model_dir,
            SUMMARY_FILE,
        )
        return summary
    logging.info(
        "--overwrite: removing the finished run in %s to train again.",
        model_dir,
    )
    for name in (SUMMARY_FILE, MODEL_FILE, WEIGHTS_FILE):
        try:
            os.remove(os.path.join(model_dir, name))
        except FileNotFoundError:
            pass
    for name in (BACKUP_DIR, TENSORBOARD_DIR):
        shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)
    return None


def run_unless_finished(
    config: CommonConfig,
    train: Callable[[tf.distribute.Strategy, stopping.Signals], dict],
) -> dict:
    """`train(strategy, signals)`, unless `model_dir` holds a finished run.

    A finished run's summary is returned instead (see `check_model_dir`).
    Otherwise SIGTERM and SIGINT are caught from before the strategy is
    built (which replaces the SIGTERM handler, so it is caught again) to
    the end, and `train` runs.

    Raises:
        stopping.Stopped: a signal stopped the run.
    """
    finished = check_model_dir(config.model_dir, config.overwrite)
    if finished is not None:
        return finished
    with stopping.Signals(config.stop_timeout) as signals:
        strategy = distribution.make_strategy(config)
        signals.install()
        return train(strategy, signals)


def write_summary(path: str, summary: Mapping[str, Any]) -> None:
    """Writes `summary` to `path` as JSON, atomically."""
    tfgc.callbacks.write_json_atomically(path, dict(summary))


def save_model(model: keras.Model, directory: str) -> tuple[str, str]:
    """Saves `<directory>/model.keras` and `<directory>/model.weights.h5`.

    Every worker must call it (the `.keras` save gathers every worker's
    compressor state). Both files are written atomically.

    Returns:
        The two paths.
    """
    model_path = os.path.join(directory, MODEL_FILE)
    weights_path = os.path.join(directory, WEIGHTS_FILE)
    with tfgc.callbacks.atomic_file(model_path) as temporary:
        model.save(temporary)
    # The layers without the optimizer: a functional twin that shares them.
    weights_only = keras.Model(model.inputs, model.outputs, name=model.name)
    with tfgc.callbacks.atomic_file(weights_path) as temporary:
        weights_only.save_weights(temporary)
    return model_path, weights_path


def metric_names(model: keras.Model) -> list[str]:
    """The names of the model's running-mean metrics in the logs."""
    names = []
    for metric in model.metrics:
        inner = getattr(metric, "metrics", None)
        if inner:
            names.extend(m.name for m in inner)
        else:
            names.append(metric.name)
    return names


def _fold(before: int, old: float, after: int, new: float) -> float:
    """The mean over `before + after` batches from the two parts' means."""
    return (before * old + after * new) / (before + after)


class ResumedEpochLogs(keras.callbacks.Callback):
    """Makes the logs of an epoch resumed in its middle cover all of it.

    Keras resets the metrics at every epoch's start, so after a restart
    inside an epoch its running means would cover only the batches since.
    This folds in the means of the batches before (saved with the backup;
    all batches are the same size). Put it before every callback that
    reads the logs.
    """

    def __init__(self):
        super().__init__()
        self.partial: dict | None = None  # {"epoch", "batches", "logs"}
        self._active = False

    def on_epoch_begin(self, epoch, logs=None):
        self._active = bool(self.partial) and epoch == self.partial["epoch"]

    def _fold_into(self, logs, batches: int) -> None:
        if not self._active or logs is None:
            return
        before = self.partial["batches"]
        for name, old in self.partial["logs"].items():
            if name in logs:
                logs[name] = _fold(before, old, batches, float(logs[name]))

    def on_train_batch_end(self, batch, logs=None):
        self._fold_into(logs, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        if self._active:
            steps = self.params["steps"] - self.partial["batches"]
            self._fold_into(logs, steps)
            self.partial = None
        self._active = False


class RunState(keras.callbacks.Callback):
    """The run state a backup carries (`state()`) and a resume restores.

    Put it after every callback that adds to the logs and before the
    `BackupAndRestore`, whose `extra_state` is `state`.

    Args:
        settings: the run's settings (JSON values); a backup written with
            others (apart from `FREE_SETTINGS`) is refused.
        throughput: the run's `Throughput` callback (its step and windows
            continue).
        summaries: the run's `ScalarSummaries` (its step continues).
        resumed_logs: the run's `ResumedEpochLogs`.
        backup: the run's backup callback.
    """

    def __init__(self, settings, throughput, summaries, resumed_logs, backup):
        super().__init__()
        self.settings = _json(settings)
        self.throughput = throughput
        self.summaries = summaries
        self.resumed_logs = resumed_logs
        self.backup = backup
        #: Per-epoch logs of every epoch, the restored ones included.
        self.history: dict[str, list[float]] = {}
        #: Training seconds of the earlier, interrupted processes.
        self.earlier_seconds = 0.0
        self._fit_start: float | None = None
        self._batch_logs: dict[str, float] = {}
        self._metric_names: list[str] = []

    def resume(self, restored: tfgc.callbacks.BackupState | None) -> None:
        """Takes the counters and history of a restored backup.

        Raises:
            ValueError: the backup was written with other settings.
        """
        if restored is None:
            return
        extra = restored.extra
        saved = extra.get("settings", {})
        changed = {
            key: (saved.get(key), value)
            for key, value in _flatten(self.settings).items()
            if key.split(".")[-1] not in FREE_SETTINGS
            and saved.get(key) != value
        }
        changed.update(
            {
                key: (value, None)
                for key, value in saved.items()
                if key not in _flatten(self.settings)
                and key.split(".")[-1] not in FREE_SETTINGS
            }
        )
        if changed:
            shown = ", ".join(
                f"{key}={old!r} there, {new!r} here"
                for key, (old, new) in sorted(changed.items())
            )
            raise ValueError(
                f"The backup {restored.path} was written with other "
                f"settings: {shown}. Rerun with its settings to resume "
                f"it, or use another --model_dir (or delete "
                f"{self.backup.backup_dir} to start over)."
            )
        self.history = {k: list(v) for k, v in extra["history"].items()}
        self.earlier_seconds = float(extra["train_seconds"])
        self.throughput.step = int(extra["step"])
        self.throughput.records = [tuple(r) for r in extra["throughput"]]
        self.summaries.step = int(extra["step"])
        partial = extra.get("partial_epoch")
        if partial and restored.batch:
            self.resumed_logs.partial = {
                "epoch": restored.epoch,
                "batches": restored.batch,
                "logs": partial,
            }
        logging.info(
            "Resuming from %s: epoch %d, step %d of the epoch, %d steps in "
            "all.",
            restored.path,
            restored.epoch + 1,
            restored.batch,
            self.throughput.step,
        )

    @property
    def train_seconds(self) -> float:
        """Training seconds of this run and the interrupted ones before."""
        seconds = self.earlier_seconds
        if self._fit_start is not None:
            seconds += time.perf_counter() - self._fit_start
        return seconds

    def on_train_begin(self, logs=None):
        self._fit_start = time.perf_counter()
        self._metric_names = metric_names(self.model)

    def on_train_end(self, logs=None):
        self.earlier_seconds = self.train_seconds
        self._fit_start = None

    def on_train_batch_end(self, batch, logs=None):
        self._batch_logs = {
            name: float(logs[name])
            for name in self._metric_names
            if logs and name in logs
        }

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
            self.history.setdefault(key, []).append(value)

    def state(self) -> dict:
        """What the next backup stores besides weights and optimizer."""
        epoch, batch = self.backup.position
        return {
            "settings": _flatten(self.settings),
            "step": self.throughput.step,
            "history": self.history,
            "throughput": [list(r) for r in self.throughput.records],
            "train_seconds": self.train_seconds,
            # Inside an epoch: its metrics so far.
            "partial_epoch": self._batch_logs if batch else None,
        }


class PeriodicBackup(keras.callbacks.Callback):
    """Backs up every `every` global steps, except at an epoch's end
    (which has its own backup). Put it after the `RunState`.

    Args:
        backup: the run's backup callback.
        throughput: the run's `Throughput` (its step is the global step).
        every: steps between backups.
    """

    def __init__(self, backup, throughput, every: int):
        super().__init__()
        self.backup = backup
        self.throughput = throughput
        self.every = every

    def on_train_batch_end(self, batch, logs=None):
        steps = self.params.get("steps") if self.params else None
        at_epoch_end = steps and self.backup.position[1] >= steps
        if self.throughput.step % self.every == 0 and not at_epoch_end:
            self.backup.save()


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict:
    """`{"a": {"b": 1}}` as `{"a.b": 1}`."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
