"""The fidelity study on a few steps of the digits task.

Runs `python benchmarks/fidelity_study.py` as a user would, into a
temporary directory: every run asked for gets a row with its metric per
seed, the compressed runs their ratio to the dense run they are judged
against (two workers, or four for HiTopKComm) and whether the goal was
met.
"""

from __future__ import annotations

import json

from tests.benchmarks.scripts import needs_ptb, python


def _study(*args: str, timeout: float = 300):
    return python("benchmarks/fidelity_study.py", *args, timeout=timeout)


@needs_ptb
def test_a_short_study_writes_each_ratio_to_dense_and_its_goal(tmp_path):
    proc = _study(
        "--tasks", "digits", "--seeds", "0", "--steps", "3",
        "--runs", "dense,mstopk,dense4,hitopk", "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "fidelity.json").read_text())
    runs = results["tasks"]["digits"]["results"]
    assert sorted(runs) == ["dense 0", "dense4 0", "hitopk 0", "mstopk 0"]
    assert all(run["workers_identical"] for run in runs.values())
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ")
        for line in (tmp_path / "fidelity.md").read_text().splitlines()
        if line.startswith("| ") and "---" not in line
    }
    for label, dense in (
        ("MSTopK 1 %", "dense 0"),
        ("HiTopKComm (MSTopK 1 %), 2 hosts x 2", "dense4 0"),
    ):
        name = "mstopk 0" if label.startswith("MSTopK") else "hitopk 0"
        ratio = runs[name]["metric"] / runs[dense]["metric"]
        assert rows[label][2] == rows[label][3] == f"{ratio:.3f}"
        assert rows[label][4] == "1.05x"
        assert rows[label][5] == ("yes, every seed" if ratio <= 1.05 else "no")
    assert rows["dense fp32"][2] == ""
    # A run of another task keeps this one's results.
    proc = _study(
        "--tasks", "lstm", "--seeds", "0", "--steps", "2", "--runs", "dense",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tasks = json.loads((tmp_path / "fidelity.json").read_text())["tasks"]
    assert tasks["digits"]["results"] == runs
    assert list(tasks["lstm"]["results"]) == ["dense 0"]
    table = (tmp_path / "fidelity.md").read_text()
    assert "## digits" in table and "## lstm" in table
    # --render writes the same markdown from the JSON alone.
    (tmp_path / "fidelity.md").unlink()
    proc = _study("--render", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "fidelity.md").read_text() == table


def test_an_unknown_run_is_a_usage_error(tmp_path):
    proc = _study(
        "--runs", "dense,powersgd", "--out", str(tmp_path), timeout=120
    )
    assert proc.returncode == 2
    assert "--runs" in proc.stderr and "powersgd" in proc.stderr
    assert not list(tmp_path.iterdir())
