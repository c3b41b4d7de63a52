"""SIGTERM and SIGINT in the mains: back up at the next step, then exit.

TensorFlow's `MultiWorkerMirroredStrategy` installs a C++ SIGTERM handler
of its own when it starts its coordination service (the preemption
notifier, which only records the signal in the service's key-value
store), so without this module `kill` and `timeout` do nothing to a
worker. `Signals` takes both signals back once the strategy exists:

- Outside `fit` (start-up, evaluation, the final save) the first signal
  stops the main at once with `Stopped` (exit code 128 + the signal), as
  Python's KeyboardInterrupt would: nothing there needs saving, and the
  last backup stays in force.
- Inside `fit` it only records the signal. `StopOnSignal` then, after
  every step, sums every worker's record in one 8-byte all-reduce, so
  that all workers stop after the same step even when only one of them
  got the signal; every worker takes part in the backup (the save
  gathers every worker's compressor state) and raises `Stopped`. A
  signal in an epoch's last step lets the epoch end (and its backup)
  happen first.
- A watchdog thread, woken by the signal itself (not by the busy main
  thread), ends the process with the same code if it is still alive
  `timeout` seconds after the first signal (a step or a save that does
  not finish, e.g. a peer that is gone), and at once on a second SIGINT
  (Ctrl-C again). A second SIGTERM is ignored: a launcher or scheduler
  that signals every worker again must not cut the backup short.
  Backups are written atomically, so the last complete one survives
  either way.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import keras
import tensorflow as tf
from absl import logging

import tfgc

#: The signals a main stops on, in the order of their places in the
#: all-reduced record.
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(SystemExit):
    """A main stopped on a signal; its `code` is 128 + the signal number.

    A `SystemExit`, so that nothing on the way out swallows it and an
    uncaught one ends the process with that code.
    """

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return (
            f"Stopped on {signal.Signals(self.signum).name} (exit code "
            f"{self.code})."
        )


class Signals:
    """Catches SIGTERM and SIGINT for a main, inside a `with` block.

    Enter it before the strategy is built and call `install()` again once
    it exists (TensorFlow replaced the SIGTERM handler meanwhile). Must be
    used from the main thread.

    Args:
        timeout: seconds after the first signal before the watchdog ends
            the process if the main has not stopped by itself.
    """

    def __init__(self, timeout: float):
        if not timeout > 0:
            raise ValueError(
                f"`timeout` must be > 0 seconds. Received: timeout={timeout!r}"
            )
        self.timeout = timeout
        #: The first signal received, or `None`.
        self.received: int | None = None
        #: True while `fit` runs: a signal is then only recorded.
        self.training = False
        self._previous = {}
        self._previous_wakeup = -1
        self._pipe = None
        self._timer = None
        self._watchdog = None

    def install(self) -> None:
        """(Re)installs the handlers of `SIGNALS`."""
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def __enter__(self) -> Signals:
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous_wakeup = signal.set_wakeup_fd(
            write, warn_on_full_buffer=False
        )
        self._watchdog = threading.Thread(
            target=self._watch, name="tfgc-stop-watchdog", daemon=True
        )
        self._watchdog.start()
        self.install()
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_wakeup)
        read, write = self._pipe
        os.close(write)  # ends the watchdog's read
        self._watchdog.join(timeout=5)
        os.close(read)
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum, frame) -> None:
        del frame
        if self.received is not None:
            return  # the watchdog handles a second signal
        self.received = signum
        name = signal.Signals(signum).name
        if not self.training:
            logging.warning("Got %s: stopping.", name)
            raise Stopped(signum)
        logging.warning(
            "Got %s: every worker stops after the next step, saves a "
            "backup and exits (at most %g s from now; Ctrl-C again exits "
            "at once, keeping the last backup).",
            name,
            self.timeout,
        )

    def _watch(self) -> None:
        """Reads the signal numbers CPython writes to the wakeup pipe."""
        read = self._pipe[0]
        seen = 0
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in SIGNALS:
                    continue
                seen += 1
                if seen == 1:
                    self._timer = threading.Timer(
                        self.timeout, self._exit_now, (signum, "timeout")
                    )
                    self._timer.daemon = True
                    self._timer.start()
                elif signum == signal.SIGINT:
                    self._exit_now(signum, "second")

    def _exit_now(self, signum: int, why: str) -> None:
        name = signal.Signals(signum).name
        if why == "second":
            reason = f"{name} again"
        else:
            reason = f"still running {self.timeout:g} s after {name}"
        # Written directly: the logging handlers may hold locks of the
        # blocked main thread.
        os.write(
            2,
            f"E tfgc: {reason}: exiting now without a new backup; the "
            "last complete backup is kept.\n".encode(),
        )
        sys.stderr.flush()
        os._exit(128 + signum)


class StopOnSignal(keras.callbacks.Callback):
    """Stops every worker after the same step once any of them got a signal.

    Put it after the `BackupAndRestore`, so that at an epoch's end the
    epoch's backup comes first. With several workers it adds one 8-byte
    all-reduce per step (a few milliseconds on CPUs); with one it only
    reads a flag.

    Args:
        signals: the main's `Signals`.
        backup: the run's backup callback; `save()` is called on every
            worker at the step where they stop.
        num_workers: worker processes in the cluster.
    """

    def __init__(
        self,
        signals: Signals,
        backup: tfgc.callbacks.BackupAndRestore,
        num_workers: int,
    ):
        super().__init__()
        self.signals = signals
        self.backup = backup
        self.num_workers = num_workers
        self._pending: int | None = None
        self._record = None
        self._agree = None
        self._recorded = False

    def on_train_begin(self, logs=None):
        self.signals.training = True
        if self.num_workers > 1 and self._agree is None:
            strategy = self.model.distribute_strategy
            with tf.init_scope():
                # A plain local variable: each worker writes its own.
                self._record = tf.Variable(
                    tf.zeros([len(SIGNALS)]), trainable=False
                )
            record = self._record

            @tf.function
            def agree():
                def replica_fn():
                    context = tf.distribute.get_replica_context()
                    return context.all_reduce("SUM", tf.identity(record))

                results = strategy.experimental_local_results(
                    strategy.run(replica_fn)
                )
                return results[0]

            self._agree = agree

    def on_train_end(self, logs=None):
        self.signals.training = False

    def _agreed_signal(self) -> int | None:
        """The signal some worker got, the same on every worker, or `None`.

        SIGTERM wins over SIGINT when workers got different ones.
        """
        received = self.signals.received
        if self._agree is None:
            return received
        if received is not None and not self._recorded:
            self._record.assign([float(received == s) for s in SIGNALS])
            self._recorded = True
        counts = self._agree().numpy()
        for signum, count in zip(SIGNALS, counts):
            if count > 0:
                return signum
        return None

    def on_train_batch_end(self, batch, logs=None):
        signum = self._agreed_signal()
        if signum is None or self._pending is not None:
            return
        steps = self.params.get("steps") if self.params else None
        if steps and self.backup.position[1] >= steps:
            self._pending = signum  # after the epoch's own backup
            return
        self._stop(signum)

    def on_epoch_end(self, epoch, logs=None):
        if self._pending is not None:
            signum, self._pending = self._pending, None
            self._stop(signum, save=False)

    def _stop(self, signum: int, save: bool = True) -> None:
        if save:
            # Still `training`: a signal now (e.g. a launcher stopping the
            # workers that have not exited yet) only gets recorded.
            self.backup.save()
        self.signals.training = False
        epoch, batch = self.backup.position
        if save:
            where = f"epoch {epoch + 1}, step {batch}"
        else:
            where = f"the end of epoch {epoch}"
        logging.warning(
            "Stopped on %s at %s; backup in %s. Run the same command "
            "again to resume.",
            signal.Signals(signum).name,
            where,
            self.backup.backup_dir,
        )
        raise Stopped(signum)
