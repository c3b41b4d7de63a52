"""The convergence benchmark on a tiny configuration.

Runs `python -m benchmarks.run --preset convergence --tiny` for a few steps
into a temporary directory: every run records a finite loss per step, each
task gets its loss-curve plot, and the table lists every compressor run.
"""

from __future__ import annotations

import json
import math

from tests.benchmarks.scripts import needs_ptb, python

STEPS = 3
COMPRESSORS = ("dense", "topk")
TASKS = ("lstm_ptb", "resnet_digits")


@needs_ptb
def test_tiny_run_writes_losses_plots_and_table(tmp_path):
    proc = python(
        "-m", "benchmarks.run", "--preset", "convergence", "--tiny",
        "--steps", str(STEPS), "--out", str(tmp_path),
        "--compressors", ",".join(COMPRESSORS),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for task in TASKS:
        assert f"{task} topk step {STEPS}/{STEPS} loss" in proc.stdout

    results = json.loads((tmp_path / "convergence.json").read_text())
    assert set(results["results"]) == set(TASKS)
    for task in TASKS:
        runs = results["results"][task]["runs"]
        assert list(runs) == list(COMPRESSORS)
        for name, run in runs.items():
            losses = run["losses"]
            assert len(losses) == STEPS, (task, name, losses)
            assert all(math.isfinite(x) and x > 0 for x in losses)
            # Each step's own loss, not Keras's running mean repeated.
            assert len(set(losses)) > 1, (task, name, losses)
        # Untrained: the LSTM starts near ln(vocabulary), the digits near
        # ln(10).
        first = runs["dense"]["losses"][0]
        assert first > (8.0 if task == "lstm_ptb" else 2.0), first
        png = tmp_path / f"convergence_{task}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    table = (tmp_path / "convergence.md").read_text()
    for task in TASKS:
        assert f"## {task}" in table
        assert f"](convergence_{task}.png)" in table
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    for label in ("dense fp32", "TopK"):
        assert sum(row.startswith(f"| {label} |") for row in rows) == 2


def test_unknown_compressor_is_a_usage_error(tmp_path):
    proc = python(
        "benchmarks/convergence_benchmark.py", "--compressors", "dense,nosuch",
        "--out", str(tmp_path), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "nosuch" in proc.stderr
    assert not list(tmp_path.iterdir())


@needs_ptb
def test_a_run_of_one_task_keeps_the_other_tasks_results(tmp_path):
    earlier = {
        "description": "an earlier digits run",
        "metric": "accuracy",
        "steps": 4,
        "window": 1,
        "meta": {
            "command": "python -m benchmarks.run --preset convergence "
            "--tasks resnet_digits --steps 4",
            "machine": "x86_64, 2 cores",
            "tensorflow": "2.21.0",
            "custom_ops": True,
            "wall_seconds": 90.0,
            "complete": True,
        },
        "runs": {
            "dense": {
                "train_loss": 1.5,
                "test_metric": 0.5,
                "run_compression_ratio": 1.0,
                "seconds": 12.0,
                "losses": [2.3, 2.0, 1.7, 1.5],
            }
        },
    }
    (tmp_path / "convergence.json").write_text(
        json.dumps({"results": {"resnet_digits": earlier}})
    )
    proc = python(
        "benchmarks/convergence_benchmark.py", "--tiny", "--steps", "2",
        "--tasks", "lstm_ptb", "--compressors", "dense",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = json.loads((tmp_path / "convergence.json").read_text())
    assert list(results["results"]) == ["resnet_digits", "lstm_ptb"]
    assert results["results"]["resnet_digits"] == earlier
    lstm = results["results"]["lstm_ptb"]
    assert lstm["steps"] == 2 and list(lstm["runs"]) == ["dense"]
    assert lstm["meta"]["complete"]
    assert "--tasks lstm_ptb" in lstm["meta"]["command"]

    table = (tmp_path / "convergence.md").read_text()
    # Each section names the command that measured it.
    assert f"Command: `{earlier['meta']['command']}`" in table
    assert f"Command: `{lstm['meta']['command']}`" in table
    assert table.index("## resnet_digits") < table.index("## lstm_ptb")
    assert (tmp_path / "convergence_resnet_digits.png").exists()


def test_update_reruns_some_compressors_and_keeps_the_rest(tmp_path):
    common = ["--tiny", "--steps", "2", "--tasks", "resnet_digits",
              "--out", str(tmp_path)]  # fmt: skip
    first = python(
        "benchmarks/convergence_benchmark.py", *common,
        "--compressors", "dense,topk",
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = json.loads((tmp_path / "convergence.json").read_text())
    second = python(
        "benchmarks/convergence_benchmark.py", *common, "--update",
        "--compressors", "topk",
    )  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resnet_digits dense" not in second.stdout  # not rerun
    after = json.loads((tmp_path / "convergence.json").read_text())
    runs = after["results"]["resnet_digits"]["runs"]
    old = before["results"]["resnet_digits"]["runs"]
    assert list(runs) == ["dense", "topk"]
    # Kept as it was measured, with the command that measured it.
    assert runs["dense"] == {
        **old["dense"],
        "command": runs["dense"]["command"],
    }
    assert "--update" in runs["topk"]["command"]
    assert "--update" not in runs["dense"]["command"]
    assert runs["topk"]["seconds"] != old["topk"]["seconds"]  # rerun
    table = (tmp_path / "convergence.md").read_text()
    assert "Rows kept from an earlier run: dense fp32 (`" in table


@needs_ptb
def test_mixed_plan_gives_the_buckets_different_codecs(tmp_path):
    proc = python(
        "-m", "benchmarks.run", "--preset", "convergence", "--tiny",
        "--steps", "2", "--tasks", "lstm_ptb", "--out", str(tmp_path),
        "--compressors", "auto_mixed",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "convergence.json").read_text())
    run = results["results"]["lstm_ptb"]["runs"]["auto_mixed"]
    # The candidates in turn from the last bucket: TopK, ACP-SGD, ...
    assert run["plan"][:2] == ["TopK", "ACPSGD"], run["plan"]
    assert all(math.isfinite(x) for x in run["losses"])
