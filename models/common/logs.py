"""Quiet logs for the mains: warnings and the chief's progress by default.

A main imports TensorFlow first through `tfgc.quiet.import_tensorflow()`
(C++ logs at warning level, start-up notices dropped), and `flags.run`
calls `configure` once the flags are parsed. `make_strategy` then leaves
the workers other than the chief with warnings only, so that a run shows
one worker's progress. `--verbose` keeps TensorFlow's INFO logs and every
worker's lines.
"""

from __future__ import annotations

import logging

from absl import logging as absl_logging

# Warnings TensorFlow repeats at every epoch end of a main, about work the
# mains do on purpose: reading every worker's compressor state for a
# backup is one eager gather per save, under a fresh function each time.
_EXPECTED_WARNINGS = (
    "Using CollectiveAllReduceStrategy eagerly has significant overhead",
    "triggered tf.function retracing",
)


class _DropExpected(logging.Filter):
    """Drops `_EXPECTED_WARNINGS` from TensorFlow's logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in _EXPECTED_WARNINGS)


_FILTER = _DropExpected()


def configure(verbose: bool = False) -> None:
    """Sets up Python logging for a main; call once the flags are parsed.

    TensorFlow's Python logger writes through absl's handler only (it adds
    a handler of its own when it is imported before absl sets one up, and
    every line then came out twice), at WARNING, without the expected
    warnings above; the mains' own INFO lines (throughput, where files
    went) stay. With `verbose`, TensorFlow's INFO lines and every warning
    show too.

    Args:
        verbose: show TensorFlow's INFO logs and every warning.
    """
    tf_logger = logging.getLogger("tensorflow")
    for handler in list(tf_logger.handlers):
        tf_logger.removeHandler(handler)
    tf_logger.propagate = True
    tf_logger.setLevel(logging.INFO if verbose else logging.WARNING)
    tf_logger.removeFilter(_FILTER)
    if not verbose:
        tf_logger.addFilter(_FILTER)
    absl_logging.set_verbosity(absl_logging.INFO)


def show_warnings_only() -> None:
    """Leaves this process with warnings and errors only (a worker other
    than the chief, whose progress the chief already shows)."""
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
