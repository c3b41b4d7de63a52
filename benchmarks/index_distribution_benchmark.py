"""How one worker's positions reach every worker: three collectives compared.

Importance-weighted pruning (docs/algorithms.md) sends the root worker's k
positions to all workers each step. Three ways, timed on real
MultiWorkerMirroredStrategy workers on localhost, for index lists of
several lengths (int32):

* all-reduce: every worker but the root sends zeros; the sum is the root's
  list (2 (p-1)/p of the list per worker on a ring);
* broadcast: the root sends, the others receive (`Group.broadcast`, an
  instance key per possible root);
* all-gather: every worker sends its list, each keeps the root's row
  ((p-1) lists per worker).

Median of `--repeats` timed steps after a warm-up, the root changing every
step. Writes `benchmarks/results/index_distribution_cpu.md` and `.json`.

    python benchmarks/index_distribution_benchmark.py            # 2, 4 workers
    python benchmarks/index_distribution_benchmark.py --workers 2 --repeats 5
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
METHODS = ("all_reduce", "broadcast", "all_gather")


def _worker(lengths: list[int], repeats: int, out: str) -> None:
    import tensorflow as tf

    from tfgc.communicators import topology as topology_lib
    from tfgc.communicators.collectives import Group
    from tfgc.communicators.communicator import replica_id

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    topology = topology_lib.current(strategy)
    p = topology.num_replicas

    def make(method, length):
        @tf.function
        def run(root):
            def replica_fn():
                group = Group(topology, range(p), replica_id())
                mine = tf.range(length, dtype=tf.int32) + group.rank
                if method == "all_reduce":
                    sent = tf.where(group.rank == root, mine, 0)
                    return group.all_reduce(sent)
                if method == "broadcast":
                    return group.broadcast(mine, root)
                return tf.gather(group.all_gather(mine), root)

            result = strategy.run(replica_fn)
            return strategy.experimental_local_results(result)[0]

        return run

    results = {}
    for length in lengths:
        for method in METHODS:
            run = make(method, length)
            for root in range(p):  # trace, warm up, check every root
                got = run(tf.constant(root)).numpy()
                expected = list(range(root, root + min(length, 3)))
                assert got[: len(expected)].tolist() == expected, method
            times = []
            for step in range(repeats):
                start = time.perf_counter()
                run(tf.constant(step % p)).numpy()
                times.append((time.perf_counter() - start) * 1e3)
            results[f"{method}/{length}"] = statistics.median(times)
    index = strategy.cluster_resolver.task_id
    with open(os.path.join(out, f"worker{index}.json"), "w") as f:
        json.dump(results, f)


def _launch(workers: int, lengths: list[int], repeats: int) -> dict:
    from tfgc import launch

    with tempfile.TemporaryDirectory() as out:
        log = io.StringIO()
        code = launch.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "--lengths",
                ",".join(map(str, lengths)),
                "--repeats",
                str(repeats),
                "--out",
                out,
            ],
            num_workers=workers,
            timeout=1200,
            env={"PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"},
            output=log,
        )
        if code:
            raise RuntimeError(f"workers failed ({code}):\n{log.getvalue()}")
        per_worker = []
        for i in range(workers):
            with open(os.path.join(out, f"worker{i}.json")) as f:
                per_worker.append(json.load(f))
    # A collective ends when its slowest worker does: take the maximum.
    return {k: max(w[k] for w in per_worker) for k in per_worker[0]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--lengths", default="1000,25000,250000")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument(
        "--output",
        default=os.path.join(HERE, "results", "index_distribution_cpu"),
    )
    args = parser.parse_args(argv)
    lengths = [int(float(x)) for x in args.lengths.split(",")]
    if args.worker:
        _worker(lengths, args.repeats, args.out)
        return
    sys.path.insert(0, HERE)
    import _common

    table = {}
    for workers in [int(w) for w in args.workers.split(",")]:
        print(f"[index distribution] {workers} workers ...", flush=True)
        table[workers] = _launch(workers, lengths, args.repeats)
    meta = _common.machine_meta(args.repeats)
    lines = [
        "# Distributing one worker's positions to all workers",
        "",
        f"Machine: {meta['machine']}; TensorFlow {meta['tensorflow']}; "
        "MultiWorkerMirroredStrategy workers on localhost (RING over gRPC), "
        f"all sharing the machine's cores. Median of {args.repeats} steps, "
        "milliseconds, the slowest worker's; the root changes every step. "
        "Command: `python benchmarks/index_distribution_benchmark.py`.",
        "",
        "| workers | positions (int32) | all-reduce (others send 0) "
        "| broadcast | all-gather, keep the root's |",
        "|---|---|---|---|---|",
    ]
    for workers, results in table.items():
        for length in lengths:
            cells = [f"{results[f'{m}/{length}']:.2f}" for m in METHODS]
            lines.append(
                f"| {workers} | {length:,} | " + " | ".join(cells) + " |"
            )
    _common.write_results(
        args.output,
        {"meta": meta, "results": {str(k): v for k, v in table.items()}},
        "\n".join(lines) + "\n",
    )


if __name__ == "__main__":
    main()
