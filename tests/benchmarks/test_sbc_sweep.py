"""The SBC sweep on a tiny configuration.

Runs `python benchmarks/sbc_sweep.py --tiny` for a few steps into a
temporary directory: dense and every (density, delay) pair asked for get a
row with the bits one worker sent, the rounds the delay leaves and a
perplexity, and the plot is written.
"""

from __future__ import annotations

import json
import math

from tests.benchmarks.scripts import needs_ptb, python

STEPS = 4


def _sweep(*args: str, timeout: float = 300):
    return python("benchmarks/sbc_sweep.py", *args, timeout=timeout)


@needs_ptb
def test_tiny_sweep_writes_bits_perplexity_and_plot(tmp_path):
    proc = _sweep(
        "--tiny", "--steps", str(STEPS), "--densities", "0.01",
        "--delays", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = json.loads((tmp_path / "sbc_sweep.json").read_text())
    runs = sweep["runs"]
    assert list(runs) == ["dense", "SBC 1.0% delay 2"]
    dense, sbc = runs["dense"], runs["SBC 1.0% delay 2"]
    assert dense["rounds"] == STEPS and sbc["rounds"] == STEPS // 2
    assert (sbc["density"], sbc["delay"]) == (0.01, 2)
    for run in runs.values():
        assert math.isfinite(run["test_metric"]) and run["test_metric"] > 1
        assert run["bits_per_worker"] == 8 * run["run_mean_bytes"] * STEPS
    # Dense fp32 sends every weight every step; SBC one value and about
    # 1 % of the positions every second step.
    assert sbc["bits_per_worker"] < dense["bits_per_worker"] / 100
    assert sweep["meta"]["complete"]
    png = tmp_path / "sbc_sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "sbc_sweep.md").read_text()
    assert "](sbc_sweep.png)" in table
    assert sum(line.startswith("| SBC 1.0% delay 2 |") for line in
               table.splitlines()) == 1  # fmt: skip


def test_bad_delays_are_a_usage_error(tmp_path):
    proc = _sweep("--delays", "1,0.5", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "--delays" in proc.stderr
    assert not list(tmp_path.iterdir())
