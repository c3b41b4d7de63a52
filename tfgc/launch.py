"""Start N local workers for tf.distribute.MultiWorkerMirroredStrategy.

Each worker runs the same command with its own ``TF_CONFIG`` describing a
cluster of ``localhost`` ports, so a multi-worker training script can be
tried on one machine::

    python -m tfgc.launch -n 2 -- python examples/train.py --epochs 1

With ``--hosts M`` the workers are split into M consecutive groups that
look like M hosts: group h listens on the loopback address 127.0.0.(h+1),
so the cluster spec names M host names (for the hierarchical
communicator). They are still one machine: nothing is shaped or slower.

Every line a worker prints is echoed with a ``[worker i] `` prefix. If a
worker fails, the others are stopped and the launcher exits with the
failing worker's exit code; on ``--timeout`` it exits with 124.

Stopping is gentle first: the workers get SIGTERM once (the training mains
then save a backup and exit), then ``--grace`` seconds (default 30) to
exit, and only then SIGKILL. Ctrl-C (SIGINT) or SIGTERM to the launcher
stops the workers that way (exit code 130 or 143); a second Ctrl-C or
SIGTERM during the grace period kills them at once.

Quiet by default: the workers get ``TF_CPP_MIN_LOG_LEVEL=2`` unless the
environment sets a level, and the lines TensorFlow logs while it loads,
before that level takes effect (absl's and oneDNN's notices), are dropped
as that level asks (`tfgc.quiet`). ``--verbose`` shows everything.

This module does not import TensorFlow, so that it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple, TextIO

from tfgc import quiet

__all__ = [
    "DEFAULT_GRACE",
    "EXIT_TIMEOUT",
    "Stopped",
    "cluster_spec",
    "free_ports",
    "host_names",
    "main",
    "run",
    "stop_workers",
    "tf_config",
]

#: Exit code used when ``timeout`` expires (same as coreutils ``timeout``).
EXIT_TIMEOUT = 124
#: Exit code used when the launcher is interrupted with Ctrl-C (SIGINT).
EXIT_SIGINT = 128 + signal.SIGINT
#: Exit code used when the launcher receives SIGTERM.
EXIT_SIGTERM = 128 + signal.SIGTERM
#: Exit code used when a worker command cannot be started at all.
EXIT_CANNOT_START = 127
#: Seconds between SIGTERM and SIGKILL: room for a main to save a backup.
DEFAULT_GRACE = 30.0

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


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``count`` distinct TCP ports that are currently free.

    Every socket stays bound until all ports are chosen, so the kernel
    cannot hand out the same port twice. The ports are released before
    returning; a different process could grab one in between, which is an
    accepted (and rare) race.

    Args:
        count: Number of ports wanted.
        host: Address to bind to.

    Returns:
        A list of ``count`` distinct port numbers.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def host_names(num_workers: int, num_hosts: int = 1) -> list[str]:
    """The host name of every worker when they stand for ``num_hosts``.

    One host: ``localhost``. Several: workers are split into consecutive
    groups of ``num_workers // num_hosts``, group h on 127.0.0.(h+1).

    Raises:
        ValueError: If ``num_hosts`` is not in [1, 254] or does not divide
            ``num_workers``.
    """
    if not 1 <= num_hosts <= 254 or num_workers % num_hosts:
        raise ValueError(
            f"hosts={num_hosts} must be in [1, 254] and divide num_workers="
            f"{num_workers}, so that every host runs as many workers; "
            f"e.g. -n {num_workers} --hosts 1"
        )
    if num_hosts == 1:
        return ["localhost"] * num_workers
    per_host = num_workers // num_hosts
    return [f"127.0.0.{1 + i // per_host}" for i in range(num_workers)]


def cluster_spec(
    num_workers: int,
    ports: Sequence[int],
    host: str = "localhost",
    hosts: Sequence[str] | None = None,
) -> dict[str, list[str]]:
    """Builds the ``cluster`` part of ``TF_CONFIG``.

    Args:
        num_workers: Number of workers; must equal ``len(ports)``.
        ports: One port per worker, in worker-index order.
        host: Host name each worker address uses.
        hosts: One host name per worker, instead of ``host``.

    Returns:
        ``{"worker": ["host:port", ...]}``.

    Raises:
        ValueError: If ``num_workers`` does not match the number of ports
            (or of ``hosts``).
    """
    if len(ports) != num_workers:
        raise ValueError(
            f"cluster_spec: got {len(ports)} ports for num_workers="
            f"{num_workers}; pass exactly one port per worker"
        )
    if hosts is None:
        hosts = [host] * num_workers
    if len(hosts) != num_workers:
        raise ValueError(
            f"cluster_spec: got {len(hosts)} host names for num_workers="
            f"{num_workers}; pass exactly one per worker"
        )
    return {"worker": [f"{h}:{port}" for h, port in zip(hosts, ports)]}


def tf_config(
    num_workers: int,
    ports: Sequence[int],
    index: int,
    hosts: Sequence[str] | None = None,
) -> str:
    """Returns the ``TF_CONFIG`` JSON string for one worker.

    Args:
        num_workers: Number of workers in the cluster.
        ports: One port per worker, in worker-index order.
        index: This worker's index, ``0 <= index < num_workers``.
        hosts: One host name per worker (default: all ``localhost``).

    Returns:
        JSON text as ``MultiWorkerMirroredStrategy`` expects it.

    Raises:
        ValueError: If ``index`` is out of range.
    """
    if not 0 <= index < num_workers:
        raise ValueError(
            f"tf_config: index={index} is out of range for num_workers="
            f"{num_workers}; use 0 <= index < num_workers"
        )
    return json.dumps(
        {
            "cluster": cluster_spec(num_workers, ports, hosts=hosts),
            "task": {"type": "worker", "index": index},
        }
    )


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 1, got {text!r}; e.g. -n 2"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be >= 1, got {value}; pass the number of workers, e.g. -n 2"
        )
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {text!r}; e.g. --timeout 300"
        ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"must be > 0 seconds, got {text}; pass a positive limit, "
            "e.g. --timeout 300, or leave it out for no limit"
        )
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(
            f"expected seconds >= 0, got {text!r}; e.g. --grace 30"
        )
    return value


class _Parser(argparse.ArgumentParser):
    """Puts the error first and the usage behind ``--help``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\nsee {self.prog} --help\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m tfgc.launch",
        usage=(
            "%(prog)s -n N [--hosts M] [--timeout SECONDS] [--port-base P] "
            "[--grace SECONDS] [--verbose] -- COMMAND [ARG ...]"
        ),
        description=(
            "Start N local MultiWorkerMirroredStrategy workers, each running "
            "COMMAND with its own TF_CONFIG, and stream their output."
        ),
        epilog="example: python -m tfgc.launch -n 2 -- python train.py",
    )
    parser.add_argument(
        "-n",
        "--num-workers",
        type=_positive_int,
        required=True,
        help="number of worker processes to start (>= 1)",
    )
    parser.add_argument(
        "--hosts",
        type=_positive_int,
        default=1,
        metavar="M",
        help="split the workers into M groups on loopback addresses "
        "127.0.0.1..M, so that they look like M hosts (must divide N)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="stop all workers and exit 124 after this many seconds",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=None,
        metavar="P",
        help="use ports P .. P+N-1 instead of picking free ones",
    )
    parser.add_argument(
        "--grace",
        type=_non_negative_float,
        default=DEFAULT_GRACE,
        metavar="SECONDS",
        help="when stopping (a worker failed, --timeout, Ctrl-C or SIGTERM), "
        "send the workers SIGTERM once, wait this long for them to exit "
        "(the training mains save a backup), then SIGKILL (default "
        f"{DEFAULT_GRACE:g}); a second Ctrl-C or SIGTERM kills at once",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show all of the workers' output: TensorFlow's start-up lines "
        "too, and no default TF_CPP_MIN_LOG_LEVEL=2 for the workers",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` if
            ``None``.

    Returns:
        The launcher's exit code (see :func:`run`); 130 on Ctrl-C, 143 on
        SIGTERM.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    # Split by hand so the worker command may contain its own options.
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
    else:
        options, command = argv, []
    args = parser.parse_args(options)
    if not command:
        parser.error(
            "missing worker command: put it after '--', e.g. "
            "python -m tfgc.launch -n 2 -- python train.py"
        )
    ports = None
    if args.port_base is not None:
        last = args.port_base + args.num_workers - 1
        if args.port_base < 1 or last > 65535:
            parser.error(
                f"argument --port-base: ports {args.port_base}..{last} are "
                "outside 1..65535; choose e.g. --port-base 20000, or leave "
                "it out to pick free ports"
            )
        ports = list(range(args.port_base, last + 1))

    try:
        host_names(args.num_workers, args.hosts)
    except ValueError as err:
        parser.error(f"argument --hosts: {err}")

    return run(
        command,
        args.num_workers,
        timeout=args.timeout,
        ports=ports,
        grace=args.grace,
        hosts=args.hosts,
        verbose=args.verbose,
    )


if __name__ == "__main__":
    sys.exit(main())
