"""Runs a benchmark script as a user would, for the benchmarks' tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.lstm_lm import shared_subset_dir

REPO = Path(__file__).resolve().parents[2]

#: For a test whose script reads the PTB subset: skipped without it, as
#: the other tests that read it are.
needs_ptb = pytest.mark.skipif(
    not os.path.isfile(os.path.join(shared_subset_dir(), "ptb.train.txt")),
    reason=f"PTB subset not found at {shared_subset_dir()}",
)


def python(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python *args` in the repository, output captured."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
