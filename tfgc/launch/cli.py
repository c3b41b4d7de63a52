"""The command line: `python -m tfgc.launch -n N -- COMMAND`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tfgc.launch.cluster import host_names
from tfgc.launch.workers import DEFAULT_GRACE, run


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
