"""The lab's cost model: the fit recovers known parameters from points
made with them, validation reports the error of held-out points, and the
crossover density is where the predicted steps are equal. No timing."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from benchmarks import run as lab_run
from benchmarks.lab import cost_fit
from benchmarks.lab.worker import transport_factor

PARAMS = 2 * (1024 * 1024 + 1024)
TRUTH = cost_fit.FittedCosts(
    compute_time=5e-9,
    select_time={"topk": 1e-9},
    sent_time={"topk": 6e-8},
    overhead=4e-3,
    latency={
        "keras all_reduce": 2e-3,
        "tfgc all_reduce": 1e-3,
        "tfgc all_gather": 3e-3,
    },
    host_byte_time=1e-9,
    header_overhead=1.004,
)
# name, kind, compressor, density, payload bytes per worker
CASES = [
    ("dense fp32", "dense_fp32", None, 1.0, 4 * PARAMS),
    ("dense fp16", "compressed", "fp16", 1.0, 2 * PARAMS),
    ("topk 0.001 +EF", "compressed", "topk", 0.001, 8 * 0.001 * PARAMS),
    ("topk 0.1 +EF", "compressed", "topk", 0.1, 8 * 0.1 * PARAMS),
    ("no communication", "floor", None, 1.0, None),
    ("topk 0.001 +EF, no communication", "local_compressed", "topk", 0.001,
     None),
    ("topk 0.1 +EF, no communication", "local_compressed", "topk", 0.1,
     None),
]  # fmt: skip


def _results(truth, hosts=(2, 3, 4), rates=("1gbit", "10gbit"), noise=0.0):
    """The lab's result JSON as `truth` would measure it."""
    rng = np.random.default_rng(0)
    runs = []
    for h in hosts:
        for rate in rates:
            rows = []
            for name, kind, compressor, density, payload in CASES:
                collective = (
                    None
                    if payload is None
                    else cost_fit._collective(compressor)
                )
                wire = (
                    0.0
                    if payload is None
                    else payload * transport_factor(collective, h)
                )
                point = cost_fit.Point(
                    h, float(rate[:-4]) * 1e9, name, kind, compressor,
                    density, PARAMS, collective, wire, None, 0.0,
                )  # fmt: skip
                step = cost_fit.predict(truth, point)
                row = {
                    "name": name,
                    "kind": kind,
                    "median_step_s": step * (1 + noise * rng.normal()),
                    "measured_tx_bytes": wire * truth.header_overhead,
                }
                if payload is not None:
                    row["analytic_payload_bytes"] = payload
                    row["analytic_wire_bytes"] = wire
                rows.append(row)
            runs.append(
                {"hosts": h, "workers_per_host": 1, "rate": rate,
                 "cases": rows, "custom_ops": True}
            )  # fmt: skip
    return {"runs": runs}


def test_fit_recovers_known_parameters_and_predicts_held_out_exactly():
    out = cost_fit.analyse(_results(TRUTH), holdout=[3])
    assert out["fit_hosts"] == [2, 4] and out["holdout_hosts"] == [3]
    fitted = out["fitted"]
    for key, value in dataclasses.asdict(TRUTH).items():
        if isinstance(value, dict):
            for name, v in value.items():
                assert fitted[key][name] == pytest.approx(v, rel=1e-6), key
        else:
            assert fitted[key] == pytest.approx(value, rel=1e-6), key
    assert len(out["held_out"]) == 2 * len(CASES)
    assert {r["hosts"] for r in out["held_out"]} == {3}
    assert out["held_out_summary"]["max_abs_error_pct"] < 1e-6
    assert out["in_fit_summary"]["points"] == 4 * len(CASES)


def test_fit_with_noise_stays_close():
    out = cost_fit.analyse(_results(TRUTH, noise=0.01), holdout=[3])
    fitted = out["fitted"]
    assert fitted["compute_time"] == pytest.approx(5e-9, rel=0.05)
    assert fitted["host_byte_time"] == pytest.approx(1e-9, rel=0.2)
    assert out["held_out_summary"]["max_abs_error_pct"] < 5


def test_validation_reports_the_error_of_a_held_out_point():
    results = _results(TRUTH)
    (row,) = [
        r
        for run in results["runs"]
        if run["hosts"] == 3 and run["rate"] == "1gbit"
        for r in run["cases"]
        if r["name"] == "dense fp16"
    ]
    row["median_step_s"] *= 2  # measured twice what the model says
    out = cost_fit.analyse(results, holdout=[3])
    errors = {
        (r["rate_gbit"], r["case"]): r["error_pct"] for r in out["held_out"]
    }
    assert errors[(1.0, "dense fp16")] == pytest.approx(-50)
    assert errors[(10.0, "dense fp16")] == pytest.approx(0, abs=1e-6)
    assert out["held_out_summary"]["max_abs_error_pct"] == pytest.approx(50)
    # The held-out point did not move the fit.
    assert out["fitted"]["latency"]["tfgc all_reduce"] == pytest.approx(1e-3)


def test_split_hosts():
    assert cost_fit.split_hosts([2, 3, 4], [3]) == ([2, 4], [3])
    with pytest.raises(ValueError, match="swept host counts"):
        cost_fit.split_hosts([2, 3, 4], [5])
    with pytest.raises(ValueError, match="two host counts"):
        cost_fit.split_hosts([2, 3], [3])


def _step(workers, rate, compressor, density, payload, collective):
    point = cost_fit.Point(
        workers, rate, "", "compressed", compressor, density, PARAMS,
        collective, payload * transport_factor(collective, workers), None,
        0.0,
    )  # fmt: skip
    return cost_fit.predict(TRUTH, point)


def test_crossover_is_where_sparse_and_dense_steps_are_equal():
    for workers, rate in ((8, 1e9), (64, 1e10)):
        d = cost_fit.crossover_density(TRUTH, "topk", 8, PARAMS, workers, rate)
        assert 0 < d < 1
        dense = _step(workers, rate, None, 1.0, 4 * PARAMS, "all_reduce")
        sparse = _step(workers, rate, "topk", d, 8 * d * PARAMS, "all_gather")
        assert sparse == pytest.approx(dense, rel=1e-9)
        half = _step(workers, rate, "topk", d / 2, 4 * d * PARAMS, "all_gather")
        assert half < dense
    # Selection alone costs more than a dense step at 100 Gbit/s: never.
    slow = dataclasses.replace(TRUTH, select_time={"topk": 1e-6})
    assert cost_fit.crossover_density(slow, "topk", 8, PARAMS, 8, 1e11) is None


def test_refit_writes_the_cost_model_section(tmp_path):
    results = _results(TRUTH)
    results.update(
        preset="costmodel",
        command="python -m benchmarks.run --preset costmodel",
        seconds=1.0,
        uptime="load average: 1.00",
        machine={"cpu": "test cpu", "cores": 2, "kernel": "6"},
        settings={"holdout": "3"},
    )
    for run in results["runs"]:
        run.update(latency="0", load_before=[1], load_after=[1], custom_ops=1)
        times = {r["name"]: r["median_step_s"] for r in run["cases"]}
        for row in run["cases"]:
            t = row["median_step_s"]
            row.update(
                steps_per_s=1 / t,
                speedup_vs_fp32=times["dense fp32"] / t,
                speedup_vs_fp16=times["dense fp16"] / t,
                times_floor=t / times["no communication"],
            )
    saved = tmp_path / "costmodel.json"
    saved.write_text(json.dumps(results))
    out = tmp_path / "out"
    assert lab_run.main(["--refit", str(saved), "--out", str(out)]) == 0
    markdown = (out / "costmodel.md").read_text()
    assert "Prediction error, held out: median 0 %" in markdown
    assert "--refit" in markdown  # the command that fitted it
    assert "| 128 | 100 |" in markdown
    for suffix in ("validation", "predicted_speedup", "crossover"):
        assert (out / f"costmodel_fit_{suffix}.png").stat().st_size > 1000
    refit = json.loads((out / "costmodel.json").read_text())
    fitted = refit["cost_model"]["fitted"]
    assert fitted["host_byte_time"] == pytest.approx(1e-9)


def test_bad_holdout_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        lab_run.main(["--preset", "costmodel", "--holdout", "5"])
    assert exit_info.value.code == lab_run.EXIT_USAGE
    assert "holdout" in capsys.readouterr().err


def test_a_run_without_the_compiled_ops_is_listed_apart():
    results = _results(TRUTH)
    (run,) = [
        r for r in results["runs"] if r["hosts"] == 3 and r["rate"] == "1gbit"
    ]
    run["custom_ops"] = False  # the pure-TF fallback: slower TopK
    for row in run["cases"]:
        if row["name"].startswith("topk"):
            row["median_step_s"] *= 10
    out = cost_fit.analyse(results, holdout=[3])
    assert out["custom_ops"] is True
    assert len(out["other_ops"]) == len(CASES)
    assert {r["rate_gbit"] for r in out["other_ops"]} == {1.0}
    assert len(out["held_out"]) == len(CASES)
    assert out["held_out_summary"]["max_abs_error_pct"] < 1e-6
