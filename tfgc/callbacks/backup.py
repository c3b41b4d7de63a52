"""`BackupAndRestore`: Keras's backup callback for MultiWorkerMirroredStrategy,
crash-safe, with every worker's compressor state."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from typing import NamedTuple

import keras

from tfgc.callbacks.files import (
    TEMPORARY_PREFIX,
    fsync,
    sha256,
    write_json_atomically,
)

#: The file in a backup directory that says which weights file is current.
METADATA_FILE = "training_metadata.json"
# What Keras's own callback writes (read for backups it left behind).
_KERAS_WEIGHTS_FILE = "latest.weights.h5"
_WEIGHTS_FILE = re.compile(r"^ckpt-(\d+)\.weights\.h5$")


class BackupError(RuntimeError):
    """A backup that exists cannot be used; the message names the file."""


class BackupState(NamedTuple):
    """Where training stood when a backup was written.

    Attributes:
        epoch: epochs finished.
        batch: batches of epoch `epoch` (0-based) finished; 0 for a backup
            written at an epoch's end.
        path: the weights file.
        extra: what `extra_state` returned at the save (`{}` without it).
    """

    epoch: int
    batch: int
    path: str
    extra: dict


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Crash-safe `keras.callbacks.BackupAndRestore` for every strategy.

    **Every worker's state.** Saving a `CompressedOptimizer` gathers every
    worker's compressor state (residuals, momenta, factors) into the one
    file, so every worker must take part in each save. Keras's callback
    has every worker write that file to the same path at once; here only
    the chief (the worker with `strategy.extended.should_checkpoint`)
    writes `backup_dir`, the others save to a temporary file they delete.
    Every worker restores from `backup_dir`, which must therefore be
    shared by the workers (a cluster file system, or one machine).

    **Crash-safe.** Each backup goes to a new file,
    `ckpt-<n>.weights.h5`, which is flushed to the disk before
    `training_metadata.json` is replaced (atomically, by a rename) to
    point at it, with its size and SHA-256. A process killed at any
    moment therefore leaves the last complete backup in force. With
    `double_checkpoint` (the default here) the one before it is kept
    too. A restore checks the file against its checksum: a damaged
    latest backup (a disk error, a file edited or truncated by hand) is
    reported with a warning naming the file and the previous one is used;
    with none left, `BackupError` names the file and the fix.

    **Mid-epoch backups.** With an integer `save_freq` (or `save()` called
    by another callback) a backup records the batches of the epoch
    already done. Keras reruns such an epoch from its first batch. With
    `resume_mid_epoch=True` the restored epoch instead runs only its
    remaining batches, and batches and backups count on from where they
    stopped; the input must then continue from the restored position too
    (`restored` says where), or the data order will differ from a run
    that never stopped.

    Args:
        backup_dir: where backups are written (by the chief) and read (by
            every worker). Use it for nothing else.
        save_freq: "epoch", or save every this many batches.
        double_checkpoint: keep the previous backup beside the latest, to
            fall back to when the latest is damaged.
        delete_checkpoint: delete `backup_dir` when `fit` ends.
        extra_state: called on every worker at each save; its JSON value
            is stored with the backup and comes back in `restored.extra`.
        resume_mid_epoch: see above.
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: str | int = "epoch",
        double_checkpoint: bool = True,
        delete_checkpoint: bool = True,
        extra_state: Callable[[], dict] | None = None,
        resume_mid_epoch: bool = False,
    ):
        super().__init__(
            backup_dir,
            save_freq=save_freq,
            double_checkpoint=double_checkpoint,
            delete_checkpoint=delete_checkpoint,
        )
        self.backup_dir = os.fspath(backup_dir)
        self.extra_state = extra_state
        self.resume_mid_epoch = resume_mid_epoch
        #: The backup `fit` started from, or `None` (set by `restore`).
        self.restored: BackupState | None = None
        self._metadata_path = os.path.join(self.backup_dir, METADATA_FILE)
        self._epoch = 0
        self._batch = 0  # batches of `_epoch` done
        self._skip = 0  # batches of `_epoch` done before the restart
        self._cut_epoch_short = False
        self._restore_done = False

    @property
    def position(self) -> tuple[int, int]:
        """`(epoch, batches of it done)` of the training so far."""
        return self._epoch, self._batch

    def _is_chief(self) -> bool:
        strategy = getattr(self.model, "distribute_strategy", None)
        return strategy is None or strategy.extended.should_checkpoint

    # --- reading -----------------------------------------------------------

    def _read_metadata(self) -> dict | None:
        if not os.path.exists(self._metadata_path):
            return None
        try:
            with open(self._metadata_path) as f:
                metadata = json.load(f)
            int(metadata["epoch"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise BackupError(
                f"The backup's {self._metadata_path} cannot be read "
                f"({type(err).__name__}: {err}). Delete {self.backup_dir} "
                "to train from the start, or put back an intact copy."
            ) from err
        return metadata

    def _problem(self, entry: dict) -> str | None:
        """Why the weights file of `entry` cannot be used, or `None`."""
        path = os.path.join(self.backup_dir, entry["weights"])
        if not os.path.isfile(path):
            return "the file is missing"
        size = os.path.getsize(path)
        if entry.get("bytes") is not None and size != entry["bytes"]:
            return f"{size} bytes where {entry['bytes']} were written"
        if entry.get("sha256") and sha256(path) != entry["sha256"]:
            return "its SHA-256 differs from the one written with it"
        return None

    def find_backup(self) -> BackupState | None:
        """The newest intact backup in `backup_dir`, or `None` if none.

        Raises:
            BackupError: there are backups, but none is intact.
        """
        metadata = self._read_metadata()
        if metadata is None:
            return None
        entries = [metadata]
        if isinstance(metadata.get("previous"), dict):
            entries.append(metadata["previous"])
        problems = []
        for entry in entries:
            entry.setdefault("weights", _KERAS_WEIGHTS_FILE)
            problem = self._problem(entry)
            path = os.path.join(self.backup_dir, entry["weights"])
            if problem is None:
                if problems:
                    warnings.warn(
                        f"The latest backup is damaged ({problems[0]}); "
                        f"restoring the previous one, {path} (epoch "
                        f"{entry['epoch']}, batch {entry.get('batch', 0)}).",
                        stacklevel=2,
                    )
                return BackupState(
                    int(entry["epoch"]),
                    int(entry.get("batch", 0)),
                    path,
                    dict(entry.get("extra", {})),
                )
            problems.append(f"{path}: {problem}")
        raise BackupError(
            "No intact backup to resume from: "
            + "; ".join(problems)
            + f". Delete {self.backup_dir} to train from the start (the "
            "work done so far is lost), or put back an intact copy."
        )

    def restore(self, model: keras.Model | None = None) -> BackupState | None:
        """Loads the newest intact backup into the model, if there is one.

        `fit` calls it at the start; calling it before `fit` (in the
        strategy's scope, with the model) lets the caller read `restored`
        first, and `fit` then does not restore again.

        Args:
            model: the model to restore; `None` for the one `fit` set.

        Returns:
            `restored`: the backup loaded, or `None`.

        Raises:
            BackupError: no backup is intact, or the intact one does not
                fit the model.
        """
        if model is not None:
            self.set_model(model)
        state = self.find_backup()
        self.restored = state
        self._restore_done = True
        if state is None:
            return None
        if not self.model.built:
            raise ValueError(
                "BackupAndRestore needs a built model: call it on a batch "
                f"of data (or build it) before fit. Received: {self.model}"
            )
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        try:
            self.model.load_weights(state.path)
        except (OSError, ValueError) as err:
            raise BackupError(
                f"The backup {state.path} is intact but does not fit this "
                f"model ({type(err).__name__}: {err}). It was written by "
                "another model or other settings: use another backup_dir, "
                f"or delete {self.backup_dir} to train from the start."
            ) from err
        self.model._initial_epoch = state.epoch
        self._epoch = state.epoch
        self._skip = state.batch if self.resume_mid_epoch else 0
        self._batch = self._skip
        return state

    def on_train_begin(self, logs=None):
        if not getattr(self, "_restore_done", False):
            self.restore()
        self._restore_done = False  # the next fit restores again

    # --- the position --------------------------------------------------------

    def on_epoch_begin(self, epoch, logs=None):
        if epoch != self._epoch:
            self._skip = 0
        self._epoch = epoch
        self._batch = self._skip

    def on_train_batch_end(self, batch, logs=None):
        self._batch = self._skip + batch + 1
        steps = self.params.get("steps") if self.params else None
        if self._skip and steps and self._batch >= steps:
            # The restored epoch is complete: end it here, not after
            # another `steps` batches (undone in `on_epoch_end`).
            self.model.stop_training = True
            self._cut_epoch_short = True
        if self._should_save_on_batch(batch):
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        if self._cut_epoch_short:
            self.model.stop_training = False
            self._cut_epoch_short = False
        self._epoch, self._batch, self._skip = epoch + 1, 0, 0
        self._last_batch_seen = 0
        if self.save_freq == "epoch":
            self.save()

    # --- writing -----------------------------------------------------------

    def _save_model(self):
        self.save()

    def save(self) -> None:
        """Backs up the training state now, at `position`.

        Under MultiWorkerMirroredStrategy every worker must call it at the
        same step (the save gathers every worker's compressor state).
        """
        extra = self.extra_state() if self.extra_state is not None else {}
        if not self._is_chief():
            scratch = tempfile.mkdtemp(prefix="tfgc_backup_")
            try:
                self.model.save_weights(os.path.join(scratch, "x.weights.h5"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        try:
            previous = self._read_metadata()
        except BackupError:
            previous = None  # replaced below by an intact backup
        serial = 1 + max(self._serials(previous), default=0)
        name = f"ckpt-{serial}.weights.h5"
        path = os.path.join(self.backup_dir, name)
        # A new name: until the metadata points at it, nothing reads it.
        self.model.save_weights(path)
        fsync(path)
        epoch, batch = self.position
        metadata = {
            "epoch": epoch,
            "batch": batch,
            "weights": name,
            "bytes": os.path.getsize(path),
            "sha256": sha256(path),
            "serial": serial,
            "extra": extra,
        }
        if self.double_checkpoint and previous is not None:
            previous.pop("previous", None)
            previous.setdefault("weights", _KERAS_WEIGHTS_FILE)
            metadata["previous"] = previous
        write_json_atomically(self._metadata_path, metadata)
        self._remove_unused(metadata)

    def _serials(self, metadata: dict | None) -> list[int]:
        serials = [int((metadata or {}).get("serial", 0))]
        for name in os.listdir(self.backup_dir):
            match = _WEIGHTS_FILE.match(name)
            if match:
                serials.append(int(match.group(1)))
        return serials

    def _remove_unused(self, metadata: dict) -> None:
        """Removes older weights files and leftovers of interrupted saves."""
        keep = {metadata["weights"]}
        if "previous" in metadata:
            keep.add(metadata["previous"]["weights"])
        for name in os.listdir(self.backup_dir):
            unused = (
                _WEIGHTS_FILE.match(name)
                or name.startswith(TEMPORARY_PREFIX)
                or name == _KERAS_WEIGHTS_FILE
                or name.endswith(".bkp")
            )
            if unused and name not in keep:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.backup_dir, name))

    def on_train_end(self, logs=None):
        if self._is_chief() and self.delete_checkpoint:
            shutil.rmtree(self.backup_dir, ignore_errors=True)
