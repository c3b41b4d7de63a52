"""TensorFlow's start-up log lines, kept out of a run's output.

TensorFlow's C++ code logs a few lines while it loads, before its own log
settings take effect, so `TF_CPP_MIN_LOG_LEVEL` does not hide them: absl's
"All log messages before absl::InitializeLog() is called are written to
STDERR" and, on x86, "oneDNN custom operations are on" twice (once per
TensorFlow library). Such a line starts with its severity letter and a
zero date, e.g. ``I0000 00:00:1795739909.243028 3642 port.cc:153] ...``.
This module applies the level to those lines too:

- `import_tensorflow()` imports TensorFlow with the process's standard
  error passed through `is_hidden` (what the training mains and the demo
  call first);
- `tfgc.launch` passes every worker's output through `is_hidden`.

It does not import TensorFlow itself, so the launcher stays fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from types import ModuleType

#: The environment variable of TensorFlow's C++ log level: 0 shows
#: everything, 1 hides INFO, 2 also WARNING, 3 also ERROR.
LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
#: The level the mains, the demo and the launcher's workers use unless the
#: environment sets one: warnings and errors only.
DEFAULT_LEVEL = 2

_SEVERITIES = "IWEF"  # absl's letters, in TF_CPP_MIN_LOG_LEVEL's order
# A line logged before absl::InitializeLog(): its date is all zeros.
_EARLY_LINE = re.compile(r"([IWEF])0000 00:00:")
_ABSL_NOTICE = (
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR"
)


def min_level(environ: Mapping[str, str] | None = None) -> int:
    """The C++ log level `environ` (default `os.environ`) asks for.

    Returns:
        `TF_CPP_MIN_LOG_LEVEL` as TensorFlow reads it: an integer in
        [0, 3], 0 when unset or not a number.
    """
    text = (os.environ if environ is None else environ).get(LEVEL_VARIABLE)
    try:
        return min(max(int(text), 0), 3)
    except (TypeError, ValueError):
        return 0


def is_hidden(line: str, level: int) -> bool:
    """Whether `line` is a start-up log line below C++ log level `level`.

    Args:
        line: one line of output, with or without its newline.
        level: a `TF_CPP_MIN_LOG_LEVEL` value; 0 hides nothing.
    """
    if level <= 0:
        return False
    if line.rstrip("\r\n") == _ABSL_NOTICE:
        # A warning about where the lines below it go; level 2 hides them.
        return level >= 2
    match = _EARLY_LINE.match(line)
    return bool(match) and _SEVERITIES.index(match.group(1)) < level


@contextlib.contextmanager
def stderr_filtered(level: int) -> Iterator[None]:
    """Drops the start-up lines below `level` that this process's file
    descriptor 2 receives inside the block (C++ code writes there directly).

    The output is held in a temporary file and written out, in order and
    without the hidden lines, when the block ends, also on an exception.
    """
    if level <= 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", errors="replace")
            kept = [
                line
                for line in text.splitlines(keepends=True)
                if not is_hidden(line, level)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def import_tensorflow(level: int = DEFAULT_LEVEL) -> ModuleType:
    """Imports TensorFlow without its start-up lines below the log level.

    Sets `TF_CPP_MIN_LOG_LEVEL` to `level` unless the environment already
    sets it (the environment wins), then imports TensorFlow with
    `stderr_filtered`. Call it before anything imports TensorFlow (or
    Keras); afterwards it only returns the module.

    Args:
        level: the C++ log level to use when the environment sets none.

    Returns:
        The `tensorflow` module.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault(LEVEL_VARIABLE, str(level))
    with stderr_filtered(min_level()):
        import tensorflow

    return tensorflow
