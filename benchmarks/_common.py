"""Timing, profiles, command line and result files shared by the benchmark
scripts.

The scripts run as `python benchmarks/<name>.py`, so this module is imported
as `_common` from their own directory.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import tensorflow as tf

from tfgc.ops import _library

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def split_cpu(count: int) -> None:
    """Makes `count` logical CPU devices (replicas of a MirroredStrategy
    in one process). Call before TensorFlow initialises its devices."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count
    )


def timeit(
    fn: Callable[[], object], repeats: int, fetch_below: float = math.inf
) -> float:
    """Median wall time in milliseconds of fn() after one warm-up call.

    fn's result (its first element for a tuple or list) is copied to numpy
    inside the timing when it has fewer than `fetch_below` elements (eager
    ops are synchronous; the copy makes that explicit).
    """
    return timeit_interleaved({"": fn}, repeats, fetch_below)[""]


def timeit_interleaved(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    fetch_below: float = math.inf,
) -> dict[str, float]:
    """`timeit` of each function, by name, calling them in turn in every
    repeat: a slow spell of a shared machine then slows all of them alike,
    so the ratios of their times hold better than those of times taken one
    function after another."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            out = fn()
            if isinstance(out, (tuple, list)):
                out = out[0]
            if hasattr(out, "numpy") and out.shape.num_elements() < fetch_below:
                out.numpy()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def parse_args(
    doc: str,
    argv: list[str] | None,
    *,
    sizes: str,
    densities: str,
    repeats: int,
    reference_help: str,
    output: str,
) -> argparse.Namespace:
    """The options every benchmark has; `output` is a name in results/."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default=sizes)
    parser.add_argument("--densities", default=densities)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument(
        "--reference-max-n", type=float, default=25e6, help=reference_help
    )
    parser.add_argument("--output", default=os.path.join(RESULTS, output))
    args = parser.parse_args(argv)
    if not _library.using_custom_ops():
        print("warning: custom ops not loaded; timing the references")
    args.sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    args.densities = [float(d) for d in args.densities.split(",") if d]
    return args


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what `platform` knows."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return model


def machine_meta(repeats: int) -> dict:
    """What the results say about the machine and the run."""
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "tensorflow": tf.__version__,
        "intra_op_threads": (
            tf.config.threading.get_intra_op_parallelism_threads()
            or os.cpu_count()
        ),
        "custom_ops": _library.using_custom_ops(),
        "repeats": repeats,
        "unit": "ms (median)",
    }


def report_header(title: str, doc: str, command: str, meta: dict) -> list:
    """A result file's first markdown lines: the title, the script's first
    paragraph (`doc`, its module docstring), the command and the machine."""
    return [
        f"# {title}",
        "",
        " ".join(doc.split("\n\n")[0].split()),
        "",
        f"Command: `{command}`; machine: {meta['machine']}, TensorFlow "
        f"{meta['tensorflow']}, compiled ops "
        f"{'on' if meta['custom_ops'] else 'off'}.",
    ]


def write_results(output: str, results: dict, markdown: str) -> None:
    """Writes `output`.json (results) and `output`.md (markdown)."""
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(output + ".md", "w") as f:
        f.write(markdown)
    print(f"wrote {output}.md and .json")


class ProfiledEvent(NamedTuple):
    """One event of a TensorFlow profile (an op: name "scope/op:OpType"),
    its times in picoseconds on the profiler's clock."""

    name: str
    start: int
    end: int
    line: str  # the thread it ran on, e.g. "tf_Compute/..."


def profile_events(logdir: str) -> Iterator[ProfiledEvent]:
    """Every event of the one profile `tf.profiler.experimental` wrote
    under `logdir`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(
        os.path.join(logdir, "**", "*.xplane.pb"), recursive=True
    )
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                start = line.timestamp_ns * 1000 + event.offset_ps
                yield ProfiledEvent(
                    names.get(event.metadata_id, ""),
                    start,
                    start + event.duration_ps,
                    line.name,
                )
