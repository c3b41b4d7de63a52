"""Starting the workers, streaming their output, stopping them gently."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple, TextIO

from tfgc import quiet
from tfgc.launch.cluster import (
    cluster_spec,
    free_ports,
    host_names,
    tf_config,
)

#: Exit code used when ``timeout`` expires (same as coreutils ``timeout``).
EXIT_TIMEOUT = 124
#: Exit code used when the launcher is interrupted with Ctrl-C (SIGINT).
EXIT_SIGINT = 128 + signal.SIGINT
#: Exit code used when the launcher receives SIGTERM.
EXIT_SIGTERM = 128 + signal.SIGTERM
#: Exit code used when a worker command cannot be started at all.
EXIT_CANNOT_START = 127
#: Seconds between SIGTERM and SIGKILL: room for a main to stop and save a
#: backup within its `--stop_timeout` (30 s by default).
DEFAULT_GRACE = 40.0

_POLL_S = 0.05
_LAUNCH_PREFIX = "[launch] "


class _Signals:
    """Ctrl-C and SIGTERM to the launcher while `run` runs.

    The handlers only record the signal: `run` notices the first and
    stops the workers, and any later one (`kill_now`) ends their grace
    period. Nothing is raised in the middle of starting or stopping
    workers, so none is left running. Handlers can be installed from the
    main thread only; elsewhere the signals keep their handlers.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.kill_now = threading.Event()
        #: Set while workers are being stopped: any signal kills them.
        self.stopping = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        del frame
        if self.received or self.stopping:
            self.kill_now.set()
        self.received.append(signum)


def _exit_code(returncode: int) -> int:
    # Popen reports death by signal N as -N; shells report it as 128 + N.
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {_exit_code(returncode)})"
    return f"failed with exit code {returncode}"


class _Output:
    """Serialises whole lines from several threads onto one text stream."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        if not text.endswith("\n"):
            text += "\n"
        with self._lock:
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError):
                # A closed or broken stream must not kill the launcher.
                pass


def _pump(pipe, prefix: str, out: _Output, level: int) -> None:
    """Copies ``pipe`` to ``out`` line by line, prefixing each line and
    dropping TensorFlow's start-up lines below C++ log level ``level``."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", errors="replace")
            if not quiet.is_hidden(text, level):
                out.line(prefix + text)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Stopped(NamedTuple):
    """How `stop_workers` ended.

    Attributes:
        killed: indices of the workers still running after the grace
            period (or when the launcher was asked again), which got
            SIGKILL.
        interrupted: whether a second Ctrl-C or SIGTERM cut the grace
            period short.
    """

    killed: tuple[int, ...]
    interrupted: bool


def stop_workers(
    procs: Sequence[subprocess.Popen],
    grace: float = DEFAULT_GRACE,
    kill_now: threading.Event | None = None,
) -> Stopped:
    """Stops every worker's process group: SIGTERM once, then SIGKILL.

    Each worker must lead its own process group (started with
    ``start_new_session=True``), so that whatever it started goes with it.
    The workers get SIGTERM once and ``grace`` seconds to exit (the mains
    save a backup); SIGKILL then goes to every group, also of workers that
    exited, whose children may live on. ``kill_now`` being set, or a
    KeyboardInterrupt, ends the wait at once.

    Args:
        procs: The workers, as started by ``subprocess.Popen``.
        grace: Seconds between SIGTERM and SIGKILL, shared by all workers.
        kill_now: Set (e.g. by a second Ctrl-C) to send SIGKILL at once.

    Returns:
        Which workers had to be killed, and whether the wait was cut short.
    """
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    interrupted = False
    deadline = time.monotonic() + grace
    try:
        while any(proc.poll() is None for proc in procs):
            if kill_now is not None and kill_now.is_set():
                interrupted = True
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        interrupted = True  # asked a second time: do not wait any longer
    killed = tuple(i for i, proc in enumerate(procs) if proc.poll() is None)
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
    for proc in procs:
        proc.wait()
    return Stopped(killed, interrupted)


def _stop(
    procs: Sequence[subprocess.Popen],
    grace: float,
    out: _Output,
    signals: _Signals,
) -> None:
    """`stop_workers`, saying what it does."""
    signals.stopping = True
    if any(proc.poll() is None for proc in procs):
        out.line(
            f"{_LAUNCH_PREFIX}sent SIGTERM; waiting up to {grace:g} s for "
            "the workers to exit (a further Ctrl-C kills them now)"
        )
    stopped = stop_workers(procs, grace, signals.kill_now)
    if stopped.killed:
        why = (
            "asked again"
            if stopped.interrupted
            else f"still running after {grace:g} s"
        )
        out.line(
            f"{_LAUNCH_PREFIX}worker(s) {list(stopped.killed)} {why}; "
            "killed with SIGKILL"
        )


def _check_args(
    command: Sequence[str], num_workers: int, timeout: float | None
) -> None:
    if isinstance(command, str):
        raise TypeError(
            f"run: command must be a list of strings, got the string "
            f"{command!r}; split it, e.g. shlex.split(command)"
        )
    if not command:
        raise ValueError(
            "run: command is empty; pass the worker command as a list, "
            "e.g. [sys.executable, 'train.py']"
        )
    if num_workers < 1:
        raise ValueError(
            f"run: num_workers must be >= 1, got {num_workers}; "
            "pass the number of worker processes to start"
        )
    if timeout is not None and timeout <= 0:
        raise ValueError(
            f"run: timeout must be > 0 seconds, got {timeout}; "
            "pass a positive number or None for no limit"
        )


def run(
    command: Sequence[str],
    num_workers: int,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    output: TextIO | None = None,
    ports: Sequence[int] | None = None,
    grace: float = DEFAULT_GRACE,
    hosts: int = 1,
    verbose: bool = False,
) -> int:
    """Runs ``command`` as ``num_workers`` local workers and waits for them.

    Each worker gets ``TF_CONFIG``, ``TFGC_WORKER_INDEX``,
    ``TFGC_NUM_WORKERS``, ``PYTHONUNBUFFERED=1`` and, unless the
    environment or ``verbose`` says otherwise, ``TF_CPP_MIN_LOG_LEVEL=2``,
    and runs in its own session, so stopping it also stops anything it
    started. As soon as one worker exits non-zero the others are stopped
    (see `stop_workers`); so are all on Ctrl-C or SIGTERM.

    Args:
        command: Program and arguments, the same for every worker.
        num_workers: Number of workers to start, at least 1.
        timeout: Seconds to wait before stopping all workers, or ``None``
            to wait indefinitely.
        env: Extra environment variables, added on top of ``os.environ``.
        cwd: Working directory for the workers.
        output: Text stream that receives the prefixed worker output and
            the launcher's own messages; ``sys.stdout`` if ``None``.
        ports: One port per worker; free ports are picked if ``None``.
        grace: Seconds between SIGTERM and SIGKILL when stopping workers:
            long enough for a main to save its backup.
        hosts: Number of hosts the workers stand for (see the module
            docstring); must divide ``num_workers``.
        verbose: Show all of the workers' output, TensorFlow's start-up
            lines included, and leave ``TF_CPP_MIN_LOG_LEVEL`` unset.

    Returns:
        0 if every worker exited 0; otherwise the exit code of the first
        worker that failed (128 + N if killed by signal N), 124 on timeout,
        127 if a worker could not be started, 130 on Ctrl-C and 143 on
        SIGTERM (to the launcher, in the main thread).

    Raises:
        ValueError: If ``command`` is empty, ``num_workers`` < 1, ``timeout``
            is not positive, ``ports`` has the wrong length or ``hosts``
            does not divide ``num_workers``.
        TypeError: If ``command`` is a string rather than a list.
    """
    _check_args(command, num_workers, timeout)
    out = _Output(sys.stdout if output is None else output)
    if ports is None:
        ports = free_ports(num_workers)
    # Validate early so a bad port list fails before anything starts.
    names = host_names(num_workers, hosts)
    cluster_spec(num_workers, ports, hosts=names)

    base_env = dict(os.environ)
    if env is not None:
        base_env.update(env)
    base_env["PYTHONUNBUFFERED"] = "1"
    level = 0
    if not verbose:
        base_env.setdefault(quiet.LEVEL_VARIABLE, str(quiet.DEFAULT_LEVEL))
        level = quiet.min_level(base_env)

    out.line(
        f"{_LAUNCH_PREFIX}starting {num_workers} worker(s) on ports "
        f"{', '.join(str(p) for p in ports)}"
    )
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    with _Signals() as signals:
        for index in range(num_workers):
            if signals.received:
                break  # _wait stops the ones started so far
            worker_env = dict(base_env)
            worker_env["TF_CONFIG"] = tf_config(
                num_workers, ports, index, hosts=names
            )
            worker_env["TFGC_WORKER_INDEX"] = str(index)
            worker_env["TFGC_NUM_WORKERS"] = str(num_workers)
            try:
                proc = subprocess.Popen(
                    list(command),
                    env=worker_env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as err:
                out.line(
                    f"{_LAUNCH_PREFIX}cannot start worker {index} with "
                    f"command {list(command)!r}: {err}"
                )
                _stop(procs, grace, out, signals)
                return EXIT_CANNOT_START
            procs.append(proc)
            pump = threading.Thread(
                target=_pump,
                args=(proc.stdout, f"[worker {index}] ", out, level),
                name=f"tfgc-launch-worker-{index}",
                daemon=True,
            )
            pump.start()
            pumps.append(pump)
        code = _wait(procs, timeout, grace, out, signals)
    # Let the pumps print what is left, but do not hang on pipes that a
    # stray grandchild still holds open.
    for pump in pumps:
        pump.join(timeout=2.0)
    return code


def _wait(
    procs: Sequence[subprocess.Popen],
    timeout: float | None,
    grace: float,
    out: _Output,
    signals: _Signals,
) -> int:
    """Polls the workers until all succeed, one fails, time runs out or
    the launcher gets Ctrl-C or SIGTERM."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if signals.received:
            if signals.received[0] == signal.SIGINT:
                out.line(f"{_LAUNCH_PREFIX}interrupted; stopping all workers")
                code = EXIT_SIGINT
            else:
                out.line(f"{_LAUNCH_PREFIX}got SIGTERM; stopping all workers")
                code = EXIT_SIGTERM
            _stop(procs, grace, out, signals)
            return code
        codes = [proc.poll() for proc in procs]
        for index, returncode in enumerate(codes):
            if returncode not in (None, 0):
                out.line(
                    f"{_LAUNCH_PREFIX}worker {index} {_describe(returncode)}; "
                    "stopping the other workers"
                )
                _stop(procs, grace, out, signals)
                return _exit_code(returncode)
        if all(returncode == 0 for returncode in codes):
            out.line(f"{_LAUNCH_PREFIX}all {len(procs)} worker(s) exited 0")
            return 0
        if deadline is not None and time.monotonic() >= deadline:
            running = [i for i, c in enumerate(codes) if c is None]
            out.line(
                f"{_LAUNCH_PREFIX}timeout of {timeout:g} s expired with "
                f"worker(s) {running} still running; stopping all workers"
            )
            _stop(procs, grace, out, signals)
            return EXIT_TIMEOUT
        time.sleep(_POLL_S)
