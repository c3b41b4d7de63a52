"""The demo that scripts/demo.sh runs, as it runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.multiworker
def test_digits_demo_on_two_workers_prints_only_its_results(
    tmp_path, monkeypatch
):
    """No TensorFlow banners or warnings, nothing from worker 1, and the
    workers leave together (no shutdown errors)."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    out = tmp_path / "digits.md"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfgc.launch",
            "-n",
            "2",
            "--",
            sys.executable,
            "-m",
            "examples.digits_demo",
            "--epochs=1",
            f"--out={out}",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    lines = log.splitlines()
    assert all(
        line.startswith(("[launch] ", "[worker 0] ")) for line in lines
    ), log
    assert "warning" not in log.lower(), log
    assert "| topk 1% + EF |" in log
    assert out.read_text().count("\n") == 8
    assert len(lines) <= 20, log
