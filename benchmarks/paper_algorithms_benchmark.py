"""End-to-end step time and bytes of the paper algorithms on local workers.

For each configuration, `tfgc.launch.run` starts `--workers` (default 4)
local worker processes under `MultiWorkerMirroredStrategy`; each trains
the same model with a `tfgc.CompressedOptimizer` in a custom training loop
(`strategy.run` inside one `tf.function`), times every step until its loss
is on the host, and reads `compression_stats()` after every step. Reported
per configuration: the median and mean step time after `--warmup` steps
(over each worker's timed steps, then the median over workers) and, per
worker and step,
the bytes sent, the overhead bytes (padding of unequal gathers) and the
bytes that stayed inside a host, averaged over the timed steps, against a
dense fp32 all-reduce (identity) measured in the same run.

Configurations, all at `--density` (default 0.1 %):

* `dense`: `Identity()`, fp32 all-reduce;
* `topk_ef`: `TopK` with error feedback;
* `mstopk_ef`: `MSTopK` with error feedback;
* `redsync_threshold`, `redsync_trimmed`: `RedSync` with threshold or
  trimmed selection, momentum moved from the inner SGD into RedSync (as
  the training mains do), `cost_model=None` (every compressible tensor
  sparse; the probe would measure localhost, see `--redsync-cost-model`);
* `hierarchical_mstopk`: `MSTopK` with error feedback under the
  `hierarchical` communicator, the workers started as `--hosts` (default 2)
  hosts of workers / hosts each (`tfgc.launch.run(..., hosts=2)`);
* `sbc`, `sbc_delay4`: `SBC` (binarized, Golomb-coded positions) with
  error feedback, communication delay 1 and 4 (bytes and the mean step
  time count every step, so the delay shows);
* `importance`: `ImportancePruning` with error feedback;
* `powersgd`: `PowerSGD(rank=4)` with error feedback (two dependent
  all-reduces per step), the baseline ACP-SGD is judged against;
* `acpsgd`, `acpsgd_one_bucket`: `ACPSGD(rank=4)` with error feedback,
  25 MiB buckets (each its own all-reduce, so one bucket can be on the
  wire while the next is compressed) and everything in one bucket.

Models (`--model`): `dense` (default), a communication-heavy stand-in: a
stack of `--layers` Dense layers of `--width` units (the last linear, as
many classes as units) on one fixed synthetic batch of `--batch` examples
per worker, SGD with momentum `--momentum`; or `lstm_small`, the LSTM LM of
`models.lstm_lm` (small) on the PTB subset (`--data-dir`), batch 20 x 35
per worker, SGD at learning rate 1 with global-norm clipping 5 (no
momentum), each worker reading its own shard of the windows.

Writes `benchmarks/results/paper_algorithms_cpu.md` and `.json`.

    python benchmarks/paper_algorithms_benchmark.py
    python benchmarks/paper_algorithms_benchmark.py --density 0.01
    python benchmarks/paper_algorithms_benchmark.py --steps 3 --warmup 1 \\
        --width 256 --configs dense,mstopk_ef --output /tmp/paper
    python benchmarks/paper_algorithms_benchmark.py --model lstm_small
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
CONFIGS = (
    "dense",
    "topk_ef",
    "mstopk_ef",
    "redsync_threshold",
    "redsync_trimmed",
    "hierarchical_mstopk",
    "sbc",
    "sbc_delay4",
    "importance",
    "powersgd",
    "acpsgd",
    "acpsgd_one_bucket",
)
DESCRIPTIONS = {
    "dense": ("Identity (fp32)", "auto (all-reduce)"),
    "topk_ef": ("TopK + EF", "auto (all-gather)"),
    "mstopk_ef": ("MSTopK + EF", "auto (all-gather)"),
    "redsync_threshold": ("RedSync threshold", "auto (ragged all-gather)"),
    "redsync_trimmed": ("RedSync trimmed", "auto (all-gather)"),
    "hierarchical_mstopk": ("MSTopK + EF", "hierarchical"),
    "sbc": ("SBC + EF, delay 1", "auto (ragged all-gather)"),
    "sbc_delay4": ("SBC + EF, delay 4", "auto (ragged all-gather)"),
    "importance": ("ImportancePruning + EF", "auto (broadcast, all-reduce)"),
    "powersgd": ("PowerSGD rank 4 + EF", "auto (2 all-reduces)"),
    "acpsgd": ("ACP-SGD rank 4 + EF, 25 MiB buckets", "auto (all-reduce)"),
    "acpsgd_one_bucket": (
        "ACP-SGD rank 4 + EF, one bucket",
        "auto (all-reduce)",
    ),
}
MODELS = ("dense", "lstm_small")

if ROOT not in sys.path:  # run as a script: make `tfgc`, `models` importable
    sys.path.insert(0, ROOT)

from models.lstm_lm import shared_subset_dir  # noqa: E402

PTB = shared_subset_dir()


# --- inside a worker ----------------------------------------------------------


def _optimizer(args, inner_momentum: float, inner_kwargs: dict):
    """The CompressedOptimizer of configuration `args.config`."""
    import keras

    import tfgc

    c = tfgc.compressors
    name, density = args.config, args.density
    momentum = inner_momentum
    communicator = "auto"
    if name == "dense":
        compressor = c.Identity()
    elif name == "topk_ef":
        compressor = c.TopK(density)
    elif name in ("mstopk_ef", "hierarchical_mstopk"):
        compressor = c.MSTopK(density)
        if name == "hierarchical_mstopk":
            communicator = "hierarchical"
    elif name.startswith("redsync_"):
        cost = None if args.redsync_cost_model == "none" else "probe"
        compressor = c.RedSync(
            density,
            momentum=inner_momentum,
            selection=name.split("_", 1)[1],
            cost_model=cost,
        )
        momentum = 0.0  # RedSync applies it; plain SGD applies the sum
    elif name == "sbc":
        compressor = c.SBC(density)
    elif name == "sbc_delay4":
        compressor = c.SBC(density, delay=4)
    elif name == "importance":
        compressor = c.ImportancePruning(density)
    elif name == "powersgd":
        compressor = c.PowerSGD(rank=4)
    elif name == "acpsgd":
        compressor = c.ACPSGD(rank=4)
    elif name == "acpsgd_one_bucket":
        compressor = c.ACPSGD(rank=4, bucket_bytes=None)
    else:
        raise ValueError(f"unknown configuration {name!r}")
    inner = keras.optimizers.SGD(momentum=momentum, **inner_kwargs)
    return tfgc.CompressedOptimizer(
        inner,
        compressor=compressor,
        error_feedback=True,
        communicator=communicator,
        seed=0,
    )


def _dense_setup(args, rank: int):
    """Model, inner optimizer settings and a batch function: Dense stack."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    layers = [keras.Input((args.width,))]
    for i in range(args.layers):
        last = i == args.layers - 1
        layers.append(keras.layers.Dense(args.width, None if last else "relu"))
    model = keras.Sequential(layers)
    rng = np.random.default_rng(100 + rank)
    x = tf.constant(rng.normal(size=(args.batch, args.width)), tf.float32)
    y = tf.constant(rng.integers(0, args.width, size=args.batch), tf.int32)
    return model, args.momentum, {"learning_rate": 0.01}, lambda i: (x, y)


def _lstm_setup(args, rank: int, num_workers: int):
    """Model, inner optimizer settings and batches: LSTM LM small on PTB."""
    import keras
    import numpy as np
    import tensorflow as tf

    from models.lstm_lm import data, model

    size = model.SIZES["small"]
    words = data.read_words(data.split_path(args.data_dir, "train"))
    vocab = data.build_vocab(words)
    inputs, targets = data.windows(
        data.to_ids(words, vocab, "train"), size.num_steps
    )
    inputs, targets = inputs[rank::num_workers], targets[rank::num_workers]
    order = np.random.default_rng(rank).permutation(len(inputs))
    batch = size.batch_size
    per_pass = len(inputs) // batch

    def batch_at(i):
        sel = order[(i % per_pass) * batch : (i % per_pass + 1) * batch]
        return tf.constant(inputs[sel]), tf.constant(targets[sel])

    keras.utils.set_random_seed(0)
    lm = model.build_model(size, len(vocab), size.num_steps, seed=0)
    inner = {
        "learning_rate": size.learning_rate,
        "global_clipnorm": size.max_grad_norm,
    }
    return lm, 0.0, inner, batch_at


def _compressed_variables(optimizer) -> int | None:
    """How many variables travel compressed (None if it cannot be told).

    Reads the optimizer's private plans; they may change shape.
    """
    dense = ("Identity", "MomentumDense")
    try:
        count = 0
        for plan in optimizer._plans:
            c = getattr(plan, "compressor", None)
            if c is None:
                c = plan.phases[0]
            count += type(c).__name__ not in dense
        return count
    except (AttributeError, IndexError, TypeError):
        return None


def worker(args) -> int:
    """One worker of one configuration; writes `<out>/worker<i>.json`."""
    import tensorflow as tf

    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.intra_op_threads
        )
    import keras

    import tfgc  # noqa: F401  (fixes Keras under multi-worker)

    t_start = time.perf_counter()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(os.environ.get("TFGC_WORKER_INDEX", "0"))
    p = strategy.num_replicas_in_sync
    with strategy.scope():
        if args.model == "lstm_small":
            model, momentum, inner, batch_at = _lstm_setup(args, rank, p)
        else:
            model, momentum, inner, batch_at = _dense_setup(args, rank)
        optimizer = _optimizer(args, momentum, inner)
        optimizer.build(model.trainable_variables)
    variables = model.trainable_variables
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                # The optimizer sums over workers; under the strategy a
                # Keras loss is already scaled by 1/p (as in model.fit).
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, variables)
            optimizer.apply(grads, variables)
            return loss

        return strategy.run(replica_fn, args=(x, y))

    step_s, stats, losses = [], [], []
    t_setup = time.perf_counter() - t_start
    for i in range(args.warmup + args.steps):
        x, y = batch_at(i)
        t0 = time.perf_counter()
        loss = train_step(x, y)
        loss = float(strategy.experimental_local_results(loss)[0].numpy())
        step_s.append(time.perf_counter() - t0)
        stats.append(optimizer.compression_stats())
        losses.append(loss * p)
        if rank == 0 and args.verbose:
            print(f"step {i + 1}: {step_s[-1]:.3f} s, loss {losses[-1]:.4f}")
    compressed = _compressed_variables(optimizer)
    result = {
        "worker": rank,
        "num_workers": p,
        "config": args.config,
        "parameters": int(sum(v.shape.num_elements() for v in variables)),
        "num_variables": len(variables),
        "compressed_variables": compressed,
        "setup_seconds": t_setup,
        "step_seconds": step_s,
        "stats": stats,
        "losses": losses,
        "intra_op_threads": (
            tf.config.threading.get_intra_op_parallelism_threads()
        ),
    }
    path = os.path.join(args.out, f"worker{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return 0


# --- the launcher -------------------------------------------------------------


def _worker_command(args, config: str, out: str) -> list[str]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--config",
        config,
        "--out",
        out,
    ]
    for name in (
        "model",
        "density",
        "width",
        "layers",
        "batch",
        "momentum",
        "warmup",
        "steps",
        "data_dir",
        "redsync_cost_model",
        "intra_op_threads",
    ):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.verbose:
        cmd.append("--verbose")
    return cmd


def _summarize(config: str, workers: list[dict], warmup: int) -> dict:
    medians = [statistics.median(w["step_seconds"][warmup:]) for w in workers]
    means = [statistics.fmean(w["step_seconds"][warmup:]) for w in workers]

    def per_step(key):
        """Per worker: the mean over timed steps; then mean, min, max."""
        means = [
            statistics.fmean(s[key] for s in w["stats"][warmup:])
            for w in workers
        ]
        return statistics.fmean(means), min(means), max(means)

    sent, sent_min, sent_max = per_step("sent_bytes")
    overhead, _, _ = per_step("overhead_bytes")
    intra, _, _ = per_step("intra_host_bytes")
    dense_bytes = workers[0]["stats"][-1]["dense_bytes"]
    first = workers[0]
    return {
        "config": config,
        "compressor": DESCRIPTIONS[config][0],
        "communicator": DESCRIPTIONS[config][1],
        "parameters": first["parameters"],
        "variables": first["num_variables"],
        "compressed_variables": first["compressed_variables"],
        "step_seconds_median": statistics.median(medians),
        # With SBC's delay most steps are local: the mean shows the rounds.
        "step_seconds_mean": statistics.median(means),
        "step_seconds_worker_medians": medians,
        "sent_bytes": sent,
        "sent_bytes_min_worker": sent_min,
        "sent_bytes_max_worker": sent_max,
        "overhead_bytes": overhead,
        "intra_host_bytes": intra,
        "dense_bytes": dense_bytes,
        "compression_ratio": dense_bytes / max(sent + overhead, 1),
        "loss_first": first["losses"][0],
        "loss_last": first["losses"][-1],
        "setup_seconds_max": max(w["setup_seconds"] for w in workers),
        "intra_op_threads": first["intra_op_threads"],
    }


def run_config(args, config: str, log) -> dict:
    """Launches the workers of one configuration and summarizes them."""
    from tfgc import launch

    out = tempfile.mkdtemp(prefix=f"tfgc_paper_{config}_")
    hosts = args.hosts if config == "hierarchical_mstopk" else 1
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    t0 = time.perf_counter()
    with open(os.path.join(out, "workers.log"), "w") as stream:
        code = launch.run(
            _worker_command(args, config, out),
            args.workers,
            timeout=args.timeout,
            env=env,
            cwd=ROOT,
            output=stream,
            hosts=hosts,
        )
    wall = time.perf_counter() - t0
    if code != 0:
        with open(os.path.join(out, "workers.log")) as f:
            tail = f.read()[-4000:]
        raise RuntimeError(
            f"{config}: the workers exited {code} after {wall:.0f} s; "
            f"the log is in {out}/workers.log; its end:\n{tail}"
        )
    workers = []
    for i in range(args.workers):
        with open(os.path.join(out, f"worker{i}.json")) as f:
            workers.append(json.load(f))
    shutil.rmtree(out, ignore_errors=True)
    r = _summarize(config, workers, args.warmup)
    r["hosts"] = hosts
    r["wall_seconds"] = wall
    return r


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def machine_meta(args) -> dict:
    import tensorflow as tf

    from benchmarks._common import cpu_model
    from tfgc.ops import _library

    return {
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores ({cpu_model()})"
        ),
        "tensorflow": tf.__version__,
        "custom_ops": _library.using_custom_ops(),
        "workers": args.workers,
        "hosts_hierarchical": args.hosts,
        "model": args.model,
        "width": args.width,
        "layers": args.layers,
        "batch": args.batch,
        "momentum": args.momentum,
        "density": args.density,
        "warmup": args.warmup,
        "steps": args.steps,
        "intra_op_threads": args.intra_op_threads,
        "redsync_cost_model": args.redsync_cost_model,
        "load_average_before": _load_average(),
        "unit": "s (median and mean step), bytes per worker per step",
    }


def _model_text(meta, rows) -> str:
    params = rows[0]["parameters"] if rows else 0
    if meta["model"] == "lstm_small":
        return (
            f"the LSTM LM small of `models.lstm_lm` ({params:,} parameters) "
            "on the PTB subset, 20 x 35 tokens per worker, SGD at learning "
            "rate 1 with global-norm clipping 5"
        )
    return (
        f"{meta['layers']} Dense layers of {meta['width']} units "
        f"({params:,} parameters, {meta['layers'] * 2} variables), one "
        f"fixed synthetic batch of {meta['batch']} examples per worker, "
        f"SGD(0.01, momentum={meta['momentum']})"
    )


def _or_unknown(value) -> str:
    return "?" if value is None else str(value)


def to_markdown(meta, rows) -> str:
    dense = next((r for r in rows if r["config"] == "dense"), None)
    out = [
        "# Paper algorithms end to end on local CPU workers",
        "",
        f"Machine: {meta['machine']}; TensorFlow {meta['tensorflow']}; "
        f"custom ops loaded: {meta['custom_ops']}; 1-minute load average "
        f"{meta['load_average_before']} before, "
        f"{meta['load_average_after']} after.",
        "",
        f"{meta['workers']} worker processes started by `tfgc.launch.run` "
        "under `MultiWorkerMirroredStrategy`, custom training loop; model: "
        f"{_model_text(meta, rows)}; density {meta['density']:.2%}. "
        "Intra-op threads per worker: "
        f"{meta['intra_op_threads'] or 'TF default'}. Step time: median "
        f"and mean over {meta['steps']} steps after "
        f"{meta['warmup']} warm-up steps (the first traces), until the "
        "loss is on the host, median over workers (the mean counts SBC's "
        "communication rounds, which its local steps outnumber); speed-up "
        "against dense from the means. Bytes: per worker and "
        "step from `compression_stats()`, mean over the timed steps and "
        "workers, before the collective's own transport factor; "
        "overhead is the padding of unequal gathers; intra-host is what "
        "stayed inside a host (hierarchical only). Error feedback on "
        "everywhere; RedSync's momentum comes from the inner SGD, its cost "
        f"model is `{meta['redsync_cost_model']}`.",
        "",
        "**All workers share the machine's cores and talk over localhost "
        "(no real network), so step times show the compute overhead of "
        "selection and (de)compression, not communication savings; the "
        "bytes show what a network would carry.** The hierarchical run "
        f"starts the {meta['workers']} workers as "
        f"{meta['hosts_hierarchical']} hosts on loopback addresses "
        "127.0.0.1 and 127.0.0.2; they are still one machine.",
        "",
        "| configuration | compressor | communicator | hosts | "
        "compressed / variables | median step (s) | mean step (s) | "
        "vs dense (mean) | sent B/step | overhead B | intra-host B | "
        "dense B | ratio | worker sent min-max | loss first -> last | "
        "wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = (
            f"{r['step_seconds_mean'] / dense['step_seconds_mean']:.2f}x"
            if dense
            else "-"
        )
        out.append(
            f"| {r['config']} | {r['compressor']} | {r['communicator']} | "
            f"{r['hosts']} | {_or_unknown(r['compressed_variables'])} / "
            f"{r['variables']} | {r['step_seconds_median']:.3f} | "
            f"{r['step_seconds_mean']:.3f} | {vs} | "
            f"{r['sent_bytes']:,.0f} | {r['overhead_bytes']:,.0f} | "
            f"{r['intra_host_bytes']:,.0f} | {r['dense_bytes']:,.0f} | "
            f"{r['compression_ratio']:.1f}x | "
            f"{r['sent_bytes_min_worker']:,.0f}-"
            f"{r['sent_bytes_max_worker']:,.0f} | "
            f"{r['loss_first']:.3f} -> {r['loss_last']:.3f} | "
            f"{r['wall_seconds']:.0f} |"
        )
    out += [
        "",
        "Per-worker step medians (s): "
        + "; ".join(
            f"{r['config']} "
            + ", ".join(f"{s:.3f}" for s in r["step_seconds_worker_medians"])
            for r in rows
        )
        + ".",
        "",
    ]
    return "\n".join(out)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated, of {', '.join(CONFIGS)} (default all)",
    )
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--model", choices=MODELS, default="dense")
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--batch", type=int, default=32, help="examples per worker"
    )
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--hosts", type=int, default=2, help="hosts of hierarchical_mstopk"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--data-dir", default=PTB, help="for lstm_small")
    parser.add_argument(
        "--redsync-cost-model", choices=("none", "probe"), default="none"
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=None,
        help="per worker; default max(1, cores // workers), 0 = TF default",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds per config"
    )
    parser.add_argument(
        "--output", default=os.path.join(RESULTS, "paper_algorithms_cpu")
    )
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown --configs {unknown}; choose from {CONFIGS}")
    if not 0 < args.density <= 1:
        parser.error("--density must be in (0, 1]")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1 (the first traces)")
    if "hierarchical_mstopk" in args.configs and (
        args.hosts < 2 or args.workers % args.hosts
    ):
        parser.error("--hosts must be >= 2 and divide --workers")
    if args.intra_op_threads is None:
        args.intra_op_threads = max(1, (os.cpu_count() or 1) // args.workers)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    meta = machine_meta(args)
    rows = []
    t_all = time.perf_counter()
    for i, config in enumerate(args.configs):
        r = run_config(args, config, print)
        rows.append(r)
        dense = rows[0] if rows[0]["config"] == "dense" else None
        vs = (
            f" ({r['step_seconds_mean'] / dense['step_seconds_mean']:.2f}"
            "x dense)"
            if dense
            else ""
        )
        print(
            f"[{i + 1}/{len(args.configs)}] {config}: mean step "
            f"{r['step_seconds_mean']:.3f} s{vs}, sent "
            f"{r['sent_bytes']:,.0f} B + overhead {r['overhead_bytes']:,.0f}"
            f" B + intra-host {r['intra_host_bytes']:,.0f} B per worker and "
            f"step ({r['compression_ratio']:.1f}x less than dense "
            f"{r['dense_bytes']:,.0f} B), {r['wall_seconds']:.0f} s",
            flush=True,
        )
    meta["load_average_after"] = _load_average()
    meta["total_seconds"] = time.perf_counter() - t_all
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output + ".json", "w") as f:
        json.dump({"meta": meta, "runs": rows}, f, indent=1)
    with open(args.output + ".md", "w") as f:
        f.write(to_markdown(meta, rows))
    print(f"wrote {args.output}.md and .json ({meta['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
