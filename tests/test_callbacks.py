"""`tfgc.callbacks.BackupAndRestore`: crash-safe writes, damaged backups
named and the previous one used, and an exact resume inside an epoch.
The multi-worker runs are in tests/multiworker/test_checkpoint.py and
tests/multiworker/test_fault_tolerance.py."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc.callbacks import (
    METADATA_FILE,
    BackupAndRestore,
    BackupError,
    atomic_file,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEATURES, STEPS, BATCH = 4, 6, 8


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(3), keras.layers.Dense(1)]
    )
    model.compile(
        tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9),
            tfgc.compressors.TopK(density=0.5),
            min_compress_size=0,
        ),
        "mse",
        jit_compile=False,
    )
    return model


def _batches(start_step=0):
    """Batch i of every run is the same, wherever the stream starts."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS * 4, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    return ds.skip(start_step)


def _backups(model, backup_dir, count):
    """Saves `count` backups of `model`, weights k + 1 at backup k."""
    callback = BackupAndRestore(str(backup_dir))
    callback.set_model(model)
    model.optimizer.build(model.trainable_variables)
    for k in range(count):
        model.set_weights([np.full_like(w, k + 1) for w in model.get_weights()])
        callback.on_epoch_end(k)
    return callback


def _restored_value(backup_dir):
    fresh = _model(seed=1)
    callback = BackupAndRestore(str(backup_dir))
    state = callback.restore(fresh)
    return state, float(fresh.get_weights()[0].flat[0])


def test_atomic_file_keeps_the_old_file_on_an_error(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_file(path) as temporary:
            with open(temporary, "w") as f:
                f.write("half of the new")
            raise RuntimeError("killed while writing")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["summary.json"]
    with atomic_file(path) as temporary:
        assert temporary.endswith("summary.json")
        with open(temporary, "w") as f:
            f.write("new")
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_backups_keep_the_latest_two_files(tmp_path):
    _backups(_model(), tmp_path, 3)
    metadata = json.loads((tmp_path / METADATA_FILE).read_text())
    assert metadata["epoch"] == 3 and metadata["batch"] == 0
    assert metadata["previous"]["epoch"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-2.weights.h5",
        "ckpt-3.weights.h5",
        METADATA_FILE,
    ]
    state, value = _restored_value(tmp_path)
    assert (state.epoch, state.batch, value) == (3, 0, 3.0)


@pytest.mark.parametrize(
    "damage", ["truncate:0", "truncate:100", "truncate:-1", "garble:0.5"]
)
def test_a_damaged_backup_is_named_and_the_previous_one_used(tmp_path, damage):
    _backups(_model(), tmp_path, 2)
    latest = tmp_path / "ckpt-2.weights.h5"
    _damage(latest, damage)
    with pytest.warns(UserWarning, match="ckpt-2.weights.h5") as warned:
        state, value = _restored_value(tmp_path)
    assert "previous one" in str(warned[0].message)
    assert (state.epoch, value) == (1, 1.0)
    # The next backup replaces the damaged one and keeps the good one.
    callback = _backups(_model(), tmp_path, 1)
    assert callback.find_backup().epoch == 1
    metadata = json.loads((tmp_path / METADATA_FILE).read_text())
    assert metadata["previous"]["weights"] == "ckpt-2.weights.h5"


def _damage(path, how):
    kind, where = how.split(":")
    data = bytearray(path.read_bytes())
    if kind == "truncate":
        cut = int(where) if int(where) >= 0 else len(data) + int(where)
        path.write_bytes(bytes(data[:cut]))
    else:
        at = int(float(where) * len(data))
        data[at : at + 16] = bytes(16)
        data[at] ^= 0xFF
        path.write_bytes(bytes(data))


def test_no_intact_backup_names_the_files_and_the_fix(tmp_path):
    _backups(_model(), tmp_path, 2)
    for name in ("ckpt-1.weights.h5", "ckpt-2.weights.h5"):
        _damage(tmp_path / name, "garble:0.5")
    with pytest.raises(BackupError) as raised:
        _restored_value(tmp_path)
    message = str(raised.value)
    assert "ckpt-1.weights.h5" in message and "ckpt-2.weights.h5" in message
    assert f"Delete {tmp_path}" in message


def test_unreadable_metadata_is_named(tmp_path):
    _backups(_model(), tmp_path, 1)
    (tmp_path / METADATA_FILE).write_text('{"epoch": 1, "wei')
    with pytest.raises(BackupError, match=f"{METADATA_FILE}.*Delete"):
        _restored_value(tmp_path)


def test_a_backup_of_another_model_is_named(tmp_path):
    _backups(_model(), tmp_path, 1)
    other = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(7)])
    other.compile("sgd", "mse")
    with pytest.raises(BackupError, match="does not fit this model"):
        BackupAndRestore(str(tmp_path)).restore(other)


class _Interrupt(keras.callbacks.Callback):
    """Raises after batch `batch` of epoch `epoch` (after its backup)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise KeyboardInterrupt


def _fit(backup_dir, interrupt=None):
    model = _model()
    callback = BackupAndRestore(
        str(backup_dir), save_freq=1, resume_mid_epoch=True
    )
    state = callback.restore(model)
    start = 0 if state is None else state.epoch * STEPS + state.batch
    callbacks = [callback] + ([interrupt] if interrupt else [])
    model.fit(
        _batches(start),
        epochs=3,
        steps_per_epoch=STEPS,
        callbacks=callbacks,
        verbose=0,
    )
    return model, state


def test_resume_inside_an_epoch_runs_only_its_remaining_batches(tmp_path):
    through, _ = _fit(tmp_path / "through")
    backup_dir = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        _fit(backup_dir, _Interrupt(1, 2))
    resumed, state = _fit(backup_dir)
    assert (state.epoch, state.batch) == (1, 3)
    assert int(resumed.optimizer.iterations) == 3 * STEPS
    for got, expected in zip(resumed.get_weights(), through.get_weights()):
        np.testing.assert_array_equal(got, expected)


_SAVE_LOOP = """
import sys, keras, numpy as np
sys.path.insert(0, {root!r})
from tests.test_callbacks import _model
from tfgc.callbacks import BackupAndRestore
model = _model()
model.optimizer.build(model.trainable_variables)
callback = BackupAndRestore({backup!r})
state = callback.restore(model)
first = 0 if state is None else state.epoch
value = float(model.get_weights()[0].flat[0]) if state else 0.0
print("restored", first, value, flush=True)
for k in range(first, first + 1000):
    model.set_weights([np.full_like(w, k + 1) for w in model.get_weights()])
    callback.on_epoch_end(k)
"""


@pytest.mark.slow
def test_killed_at_random_points_of_the_write_a_rerun_resumes(tmp_path):
    """SIGKILL a process that backs up in a loop, at random moments of its
    writes; every rerun restores the last backup that was committed
    (weights k at epoch k), never a torn one.

    About 40 s (a process start per kill).
    """
    backup = str(tmp_path / "backup")
    code = _SAVE_LOOP.format(root=ROOT, backup=backup)
    rng = random.Random(0)
    last = 0
    for _ in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        line = proc.stdout.readline().split()
        assert line[0] == "restored", line
        epoch, value = int(line[1]), float(line[2])
        # Exactly the last backup that was committed before the kill.
        assert (epoch, value) == (last, last), (epoch, value, last)
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if os.path.exists(os.path.join(backup, METADATA_FILE)):
            with open(os.path.join(backup, METADATA_FILE)) as f:
                last = json.load(f)["epoch"]
    assert last > 8, "the loop never got to back up"
