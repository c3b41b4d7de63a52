"""The start-up benchmark on two runs: a row each, with the step's graph
counted (its times are the benchmark's to report)."""

import json

import pytest

from tests.benchmarks.scripts import python


def _run(*args, timeout=600):
    return python("benchmarks/startup_benchmark.py", *args, timeout=timeout)


@pytest.mark.slow
def test_runs_write_a_row_each_with_the_graph_counted(tmp_path):
    out = str(tmp_path / "startup")
    proc = _run("--runs", "keras topk@0.01", "--repeats", "1",
                "--image-size", "32", "--out", out)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = json.loads((tmp_path / "startup.json").read_text())["runs"]
    assert list(runs) == ["keras", "topk@0.01"]
    for row in runs.values():
        assert row["first_run_s"] > row["next_run_s"] > 0
        assert row["startup_s"] > row["trace_s"] > 0
    # ResNet-50's step on two replicas: thousands of ops; tfgc's exchange
    # adds its own to Keras's.
    assert 5000 < runs["keras"]["ops"] < runs["topk@0.01"]["ops"]
    text = (tmp_path / "startup.md").read_text()
    assert "| topk@0.01 |" in text


def test_bad_runs_and_values_are_usage_errors(tmp_path):
    out = str(tmp_path / "startup")
    for args, named in [
        (["--runs", "keras nosuch"], "nosuch"),
        (["--repeats", "0"], "--repeats"),
        (["--image-size", "8"], "--image-size"),
    ]:
        proc = _run(*args, "--out", out, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert named in proc.stderr
