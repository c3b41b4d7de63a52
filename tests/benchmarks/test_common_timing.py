"""The timing helpers every benchmark script shares."""

import itertools

from benchmarks import _common


def test_interleaved_timing_calls_each_function_in_turn():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = _common.timeit_interleaved(fns, repeats=3)
    assert sorted(times) == ["a", "b", "c"]
    assert all(t >= 0 for t in times.values())
    # One warm-up call each, then a, b, c in every repeat.
    assert calls == list("abc") * 4


def test_interleaved_timing_reports_each_functions_median(monkeypatch):
    # Each call of `slow` takes 5 ticks, each of `fast` 1 (a fake clock).
    clock = itertools.count()
    monkeypatch.setattr(_common.time, "perf_counter", lambda: next(clock))
    advance = {"slow": 5, "fast": 1}

    def run(name):
        for _ in range(advance[name] - 1):
            next(clock)

    fns = {name: (lambda name=name: run(name)) for name in advance}
    times = _common.timeit_interleaved(fns, repeats=5)
    assert times == {"slow": 5e3, "fast": 1e3}
    assert _common.timeit(fns["fast"], repeats=3) == 1e3
