"""The input cache benchmark on a tiny configuration: a row per rate and
level, the table and the plot (its speed is the benchmark's to report)."""

import json

from tests.benchmarks.scripts import python


def _run(*args, timeout=300):
    return python("benchmarks/input_cache_benchmark.py", *args, timeout=timeout)


def test_tiny_run_writes_a_row_per_rate_and_level_and_the_step(tmp_path):
    proc = _run(
        "--examples", "32", "--batch", "16", "--epochs", "2",
        "--rates", "4,16", "--levels", "none,disk", "--out", str(tmp_path),
        "--train",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "input_cache.json").read_text())
    rows = [(r["rate"], r["level"]) for r in result["rows"]]
    assert rows == [(4.0, "none"), (4.0, "disk"), (16.0, "none"),
                    (16.0, "disk")]  # fmt: skip
    assert all(r["first"] > 0 and r["later"] > 0 for r in result["rows"])
    assert result["meta"]["megabytes"] > 0.1  # real JPEGs, not a stub
    # --train: each epoch's mean step, and the step with input in memory.
    assert result["meta"]["compute_ms"] > 0
    assert all(
        len(r["step_s"]) == 2 and min(r["step_s"]) > 0 for r in result["rows"]
    )
    png = (tmp_path / "input_cache.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "input_cache.md").read_text()
    assert "| 16 | disk |" in text
    assert "## Training step when input-bound" in text


def test_unknown_level_is_a_usage_error(tmp_path):
    proc = _run("--levels", "none,ram", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "ram" in proc.stderr
