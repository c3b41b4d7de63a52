"""Runs a benchmark script as a user would, for the benchmarks' tests."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
