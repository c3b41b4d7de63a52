"""`models.common.stopping.Signals`: what SIGTERM and SIGINT do to a main
outside and inside `fit`, and the watchdog that bounds the stop. The
stops of real training runs are in test_lstm_lm_main.py and
tests/models/test_models_multiworker.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from models.common import stopping
from tests.models.conftest import REPO

# Generous: a process start (TensorFlow's import) plus the stop.
BOUND_SECONDS = 60

_SCRIPT = """
import sys, time
sys.path.insert(0, {repo!r})
from models.common import stopping
with stopping.Signals(timeout={timeout}) as signals:
    signals.training = {training}
    print("ready", flush=True)
    time.sleep(120)
print("slept through", flush=True)
"""


def _signalled(signals_sent, timeout=60.0, training=True):
    """Starts a process that waits inside `Signals`, sends it the signals
    (0.5 s apart) once it is ready; returns `(exit code, stderr)`."""
    code = _SCRIPT.format(repo=str(REPO), timeout=timeout, training=training)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        for signum in signals_sent:
            proc.send_signal(signum)
            time.sleep(0.5)
        _, err = proc.communicate(timeout=BOUND_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def test_outside_fit_a_signal_stops_at_once():
    code, err = _signalled([signal.SIGTERM], training=False)
    assert code == 128 + signal.SIGTERM, err
    assert "Got SIGTERM: stopping." in err


def test_inside_fit_the_watchdog_bounds_a_stop_that_hangs():
    """The main thread never gets to stop (a step that does not return):
    the watchdog exits `timeout` seconds after the signal. A second
    SIGTERM (a launcher repeating itself) does not cut that short."""
    code, err = _signalled([signal.SIGTERM, signal.SIGTERM], timeout=3)
    assert code == 128 + signal.SIGTERM, err
    assert "stops after the next step" in err
    assert "still running 3 s after SIGTERM: exiting now" in err


def test_inside_fit_a_second_ctrl_c_exits_at_once():
    code, err = _signalled([signal.SIGINT, signal.SIGINT], timeout=100)
    assert code == 128 + signal.SIGINT, err
    assert "SIGINT again: exiting now" in err


def test_handlers_are_restored_and_checked():
    before = {s: signal.getsignal(s) for s in stopping.SIGNALS}
    with stopping.Signals(timeout=5):
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in stopping.SIGNALS} == before
    with pytest.raises(ValueError, match="`timeout` must be > 0 seconds"):
        stopping.Signals(timeout=0)
    stopped = stopping.Stopped(signal.SIGTERM)
    assert stopped.code == 143 and isinstance(stopped, SystemExit)
    assert str(stopped) == "Stopped on SIGTERM (exit code 143)."


class _Backup:
    """Stands in for the run's `BackupAndRestore`: inside epoch 1."""

    backup_dir = "backup"
    position = (0, 3)

    def __init__(self):
        self.saved = False

    def save(self):
        # The launcher stops a worker that has not exited yet.
        os.kill(os.getpid(), signal.SIGTERM)
        self.saved = True


def test_a_signal_during_the_stops_backup_does_not_cut_it_short(monkeypatch):
    """A worker stopping because a peer got SIGTERM, which gets its own
    SIGTERM while it saves: the save completes, then the worker stops."""
    backup = _Backup()
    with stopping.Signals(timeout=30) as signals:
        stop = stopping.StopOnSignal(signals, backup, num_workers=1)
        stop.set_params({"steps": 10})
        stop.on_train_begin()
        # What the all-reduce says when only the peer got the signal.
        monkeypatch.setattr(stop, "_agreed_signal", lambda: signal.SIGTERM)
        with pytest.raises(stopping.Stopped) as stopped:
            stop.on_train_batch_end(2)
    assert backup.saved
    assert stopped.value.code == 128 + signal.SIGTERM
