"""Benchmarks tfgc's custom ops against TensorFlow and numpy baselines.

Selection: `tfgc.ops.top_k_sample` (each mode, compiled op) against
`tf.math.top_k(|x|)` and against one `tf.reduce_max` over the same tensor
(a memory-read yardstick, same intra-op thread pool), plus the pure-TF
reference. Bit packing: `pack_bits` (compiled op) against the GRACE-style
TF arithmetic reference, `np.packbits` and a plain copy of the input.
Every ratio is measured in the same run; `reduce_max` and the modes are
timed in turn, repeat by repeat, so that a slow spell of a shared machine
slows them alike. Writes
`benchmarks/results/ops_cpu.md` and `.json`.

Selection is also timed on other data (`--distributions`, default all):
Student-t with 2 degrees of freedom, N(0, 1) with one outlier of 1e6, 98 %
zeros (2 % N(0, 1) entries), and real gradients captured from the training
mains by `capture_gradients.py` (LSTM LM, `--lstm-config`, on the PTB
subset, and ResNet-50 on synthetic data; each concatenated into one flat
float32 vector), captured first into `--cache-dir` if missing. For every
distribution the table gives each mode's time against `reduce_max` and
`tf.math.top_k(|x|)`, the recall of the true top-k of mstopk and threshold
and threshold's selected count / k. N(0, 1) runs at `--sizes` (with the
pure-TF reference, the fused residual and PackBits), the other synthetic
data at `--distribution-sizes`, the captured gradients at their own size.

    python benchmarks/ops_benchmark.py                   # 1M, 25M, 100M
    python benchmarks/ops_benchmark.py --sizes 1e6 --repeats 3
    python benchmarks/ops_benchmark.py --distributions student_t2,lstm \
        --distribution-sizes 1e6 --lstm-config small --repeats 3
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import subprocess
import sys

import _common
import capture_gradients
import numpy as np
import tensorflow as tf

import tfgc.ops
from tfgc.ops import _library, bits

tks = importlib.import_module("tfgc.ops.top_k_sample")

SYNTHETIC = ("normal", "student_t2", "outlier", "sparse98")
CAPTURED = ("lstm", "resnet50")
DISTRIBUTIONS = SYNTHETIC + CAPTURED
OUTLIER = 1e6
NONZERO = 0.02
DESCRIPTIONS = {
    "normal": "N(0, 1) (`tf.random.stateless_normal`)",
    "student_t2": "Student-t with 2 degrees of freedom (heavy tails, "
    "infinite variance)",
    "outlier": f"N(0, 1) with x[N // 2] = {OUTLIER:g}",
    "sparse98": f"{1 - NONZERO:.0%} exact zeros, {NONZERO:.0%} N(0, 1) "
    "entries at random positions",
}


def timeit(fn, repeats: int) -> float:
    """_common.timeit; results of 1M elements or more are not copied."""
    return _common.timeit(fn, repeats, fetch_below=1e6)


def synthetic(name: str, n: int) -> tf.Tensor:
    """`n` float32 values of the synthetic distribution `name`."""
    x = tf.random.stateless_normal([n], seed=[1, 2])
    if name == "normal":
        return x
    if name == "outlier":
        return tf.tensor_scatter_nd_update(x, [[n // 2]], [OUTLIER])
    rng = np.random.default_rng(n)
    if name == "student_t2":
        return tf.constant(rng.standard_t(2, n).astype(np.float32))
    if name == "sparse98":
        keep = tf.constant(rng.random(n, dtype=np.float32) < NONZERO)
        return tf.where(keep, x, 0.0)
    raise ValueError(f"unknown distribution {name!r}")


def recall(selected: tf.Tensor, true_mask: np.ndarray, k: int) -> float:
    """|selected & true top-k| / k."""
    return float(np.count_nonzero(true_mask[selected.numpy()])) / k


def bench_selection(
    n,
    densities,
    repeats,
    reference_max_n,
    rows,
    log,
    x=None,
    distribution="normal",
):
    """Times selection on `x` (N(0, 1) of size n if None) at each density.

    N(0, 1) rows also time the fused residual and (up to
    `reference_max_n`) the pure-TF reference, as they always did.
    """
    if x is None:
        x = synthetic(distribution, n)
    gaussian = distribution == "normal"
    keys = tf.abs(x)
    ratio = float(tf.reduce_max(keys) / tf.reduce_mean(keys))
    del keys
    zeros = tf.zeros_like(x) if gaussian else None
    for density in densities:
        k = int(np.ceil(density * n))
        r = dict(distribution=distribution, n=n, density=density, k=k)
        r["max / mean |x|"] = ratio
        r["tf.math.top_k"] = timeit(
            lambda k=k: tf.math.top_k(tf.abs(x), k), repeats
        )
        true_mask = np.zeros(n, bool)
        true_mask[tf.math.top_k(tf.abs(x), k).indices.numpy()] = True
        # reduce_max, the yardstick the modes are read against, is timed in
        # turn with them.
        fns = {"reduce_max": lambda: tf.reduce_max(x)}
        for mode in tks.MODES:
            fns[f"tfgc {mode}"] = lambda k=k, mode=mode: tfgc.ops.top_k_sample(
                x, k, mode=mode, seed=3
            )
        r.update(_common.timeit_interleaved(fns, repeats, fetch_below=1e6))
        for mode in tks.MODES:
            got = tfgc.ops.top_k_sample(x, k, mode=mode, seed=3)[1]
            r[f"{mode} size / k"] = got.shape[0] / k
            r[f"{mode} recall"] = recall(got, true_mask, k)
        if gaussian:
            r["tfgc mstopk + residual (fused)"] = timeit(
                lambda k=k: tfgc.ops.top_k_sample(x, k, seed=3, residual=zeros),
                repeats,
            )
            if n <= reference_max_n:
                r["pure-TF reference mstopk"] = timeit(
                    lambda k=k: tks.top_k_sample_reference(x, k, seed=3),
                    repeats,
                )
        rows.append(r)
        log(
            f"{distribution} N={n:,} density={density:.1%}: reduce_max "
            f"{r['reduce_max']:.1f} ms, top_k {r['tf.math.top_k']:.1f} ms, "
            + ", ".join(f"{m} {r[f'tfgc {m}']:.1f} ms" for m in tks.MODES)
            + f"; recall mstopk {r['mstopk recall']:.4f}, threshold "
            f"{r['threshold recall']:.4f}, threshold size / k "
            f"{r['threshold size / k']:.3f}"
        )


def bench_bits(n, repeats, rows, log):
    x = tf.random.stateless_normal([n], seed=[3, 4])
    mask = x >= 0
    mask_np = mask.numpy()
    r = {"n": n}
    r["tfgc pack_bits"] = timeit(lambda: tfgc.ops.pack_bits(mask), repeats)
    # The compiled op alone: no Python wrapper, no copy of the result.
    lib = _library.custom_ops()
    r["tfgc pack_bits (op only)"] = (
        _common.timeit(lambda: lib.tfgc_pack_bits(mask), repeats)
        if lib is not None
        else math.nan
    )
    r["TF arithmetic reference"] = timeit(
        lambda: bits.pack_bits_reference(mask), repeats
    )
    r["np.packbits"] = timeit(
        lambda: np.packbits(mask_np, bitorder="little"), repeats
    )
    r["plain copy of the mask (np.copy)"] = timeit(
        lambda: np.copy(mask_np), repeats
    )
    r["tfgc pack_bits(x >= 0)"] = timeit(
        lambda: tfgc.ops.pack_bits(x >= 0), repeats
    )
    words = tfgc.ops.pack_bits(mask)
    four = tf.stack([words] * 4)
    scales = tf.ones([4])
    r["tfgc unpack_bits"] = timeit(
        lambda: tfgc.ops.unpack_bits(words, n), repeats
    )
    r["TF unpack_bits reference"] = timeit(
        lambda: bits.unpack_bits_reference(words, n), repeats
    )
    r["tfgc unpack_bits_sum p=4"] = timeit(
        lambda: tfgc.ops.unpack_bits_sum(four, scales, n), repeats
    )
    r["TF unpack_bits_sum reference p=4"] = timeit(
        lambda: bits.unpack_bits_sum_reference(four, scales, n), repeats
    )
    rows.append(r)
    log(
        f"N={n:,}: pack_bits {r['tfgc pack_bits']:.2f} ms, reference "
        f"{r['TF arithmetic reference']:.2f} ms"
    )


def _distribution_table(meta, rows) -> list[str]:
    out = [
        "## TopKSample by distribution",
        "",
        "The same ops on other data, seed 3 for mstopk's band slice. "
        "mode / rmax: the mode's time over one `reduce_max` of the same "
        "tensor (a memory-read yardstick); top_k / mode: how much faster the "
        "mode is than `tf.math.top_k(|x|)`. Recall: the fraction of the "
        "true top-k (`tf.math.top_k`, ties to the lower index) that the "
        "mode selects; threshold size / k: how many entries threshold "
        "selects (RedSync accepts k < size < 2k; more when no bisection "
        "round was accepted). mstopk and trimmed select exactly k; trimmed "
        "is exact. max/mean: max |x| / mean |x|; the bisection of mstopk "
        "and threshold searches thr = mean + ratio (max - mean) from ratio "
        "0.5, so a large ratio puts its first thresholds far in the tail.",
        "",
    ]
    for name in dict.fromkeys(r["distribution"] for r in rows):
        out.append(f"* **{name}**: {_describe(meta, name)}")
    out += [
        "",
        "| data | N | max/mean | density | reduce_max | top_k(abs) | "
        "mstopk | "
        "threshold | trimmed | mstopk / rmax | threshold / rmax | "
        "trimmed / rmax | top_k / mstopk | top_k / threshold | "
        "top_k / trimmed | mstopk recall | threshold recall | "
        "threshold size / k |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        "---|---|",
    ]
    for r in rows:
        times = [r[f"tfgc {m}"] for m in tks.MODES]
        out.append(
            f"| {r['distribution']} | {r['n']:,} | "
            f"{r['max / mean |x|']:,.0f} | {r['density']:.1%} | "
            f"{r['reduce_max']:.2f} | {r['tf.math.top_k']:.1f} | "
            + " | ".join(f"{t:.2f}" for t in times)
            + " | "
            + " | ".join(f"{t / r['reduce_max']:.2f}x" for t in times)
            + " | "
            + " | ".join(f"{r['tf.math.top_k'] / t:.1f}x" for t in times)
            + f" | {r['mstopk recall']:.4f} | {r['threshold recall']:.4f} | "
            f"{r['threshold size / k']:.3f} |"
        )
    out.append("")
    return out


def _describe(meta, name) -> str:
    if name in DESCRIPTIONS:
        return DESCRIPTIONS[name]
    g = meta.get("captured", {}).get(name, {})
    return (
        f"real gradient of {g.get('model', name)} "
        f"({g.get('parameters', 0):,} parameters, "
        f"{g.get('nonzero_fraction', math.nan):.1%} nonzero; data "
        f"{g.get('data', '?')}, batch {g.get('batch', '?')}) after "
        f"{g.get('training_steps_before', '?')} training steps with "
        f"{g.get('optimizer', '?')}, all variables concatenated in "
        "`trainable_variables` order; captured by "
        "`benchmarks/capture_gradients.py`"
    )


def to_markdown(meta, sel, bit) -> str:
    out = [
        "# tfgc custom ops on CPU",
        "",
        f"Machine: {meta['machine']}; TensorFlow {meta['tensorflow']}; "
        f"intra-op threads {meta['intra_op_threads']}; custom ops "
        f"loaded: {meta['custom_ops']}. Median of {meta['repeats']} runs "
        "after a warm-up, milliseconds; float32, N(0, 1) data unless "
        "stated. `reduce_max` and the three modes are timed in turn in "
        "every repeat (so `reduce_max` is timed again for each density).",
        "",
    ]
    gaussian = [r for r in sel if r["distribution"] == "normal"]
    if gaussian:
        out += _gaussian_table(gaussian)
    if any(r["distribution"] != "normal" for r in sel):
        out += _distribution_table(meta, sel)
    if bit:
        out += _bits_table(bit)
    return "\n".join(out)


def _gaussian_table(sel) -> list[str]:
    out = [
        "## TopKSample",
        "",
        "| N | density | reduce_max | tf.math.top_k(abs) | mstopk | "
        "threshold | trimmed | mstopk+residual | pure-TF ref | "
        "top_k / mstopk | mstopk / reduce_max | mstopk recall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sel:
        ref = r.get("pure-TF reference mstopk")
        out.append(
            f"| {r['n']:,} | {r['density']:.1%} | {r['reduce_max']:.2f} | "
            f"{r['tf.math.top_k']:.1f} | {r['tfgc mstopk']:.2f} | "
            f"{r['tfgc threshold']:.2f} | {r['tfgc trimmed']:.2f} | "
            f"{r['tfgc mstopk + residual (fused)']:.2f} | "
            f"{'-' if ref is None else f'{ref:.1f}'} | "
            f"{r['tf.math.top_k'] / r['tfgc mstopk']:.1f}x | "
            f"{r['tfgc mstopk'] / r['reduce_max']:.2f}x | "
            f"{r['mstopk recall']:.4f} |"
        )
    out.append("")
    return out


def _bits_table(bit) -> list[str]:
    out = [
        "## PackBits",
        "",
        "pack_bits times the Python function (eager dispatch and a copy of "
        "results under 1M elements to numpy included); op only calls the "
        "compiled op directly, which is what a `tf.function` pays. At 1M "
        "elements the dispatch dominates.",
        "",
        "| N | pack_bits | op only | TF arithmetic | np.packbits | "
        "copy of mask | TF / pack_bits | pack_bits / copy | op only / copy | "
        "pack_bits(x>=0) | unpack | TF unpack | unpack_sum p=4 | "
        "TF unpack_sum p=4 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bit:
        p = r["tfgc pack_bits"]
        op = r["tfgc pack_bits (op only)"]
        copy = r["plain copy of the mask (np.copy)"]
        out.append(
            f"| {r['n']:,} | {p:.3f} | {op:.3f} | "
            f"{r['TF arithmetic reference']:.2f} | "
            f"{r['np.packbits']:.3f} | {copy:.3f} | "
            f"{r['TF arithmetic reference'] / p:.1f}x | "
            f"{p / copy:.2f}x | {op / copy:.2f}x | "
            f"{r['tfgc pack_bits(x >= 0)']:.2f} | "
            f"{r['tfgc unpack_bits']:.2f} | "
            f"{r['TF unpack_bits reference']:.2f} | "
            f"{r['tfgc unpack_bits_sum p=4']:.2f} | "
            f"{r['TF unpack_bits_sum reference p=4']:.2f} |"
        )
    out.append("")
    return out


def parse_extra(argv):
    """This script's own options; the rest go to `_common.parse_args`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--distributions",
        default="all",
        help=f"comma-separated, of {', '.join(DISTRIBUTIONS)} (default all)",
    )
    parser.add_argument(
        "--distribution-sizes",
        default="1e6,25e6",
        help="sizes for the synthetic data other than normal",
    )
    parser.add_argument(
        "--lstm-config",
        default="medium",
        choices=("small", "medium", "large"),
        help="which LSTM LM's gradient the `lstm` data is",
    )
    parser.add_argument(
        "--cache-dir",
        default=capture_gradients.CACHE,
        help="where captured gradients are kept (captured if missing)",
    )
    if argv is None:
        argv = sys.argv[1:]
    if "-h" in argv or "--help" in argv:
        parser.print_help()
        print("\nand the common options:")
    extra, rest = parser.parse_known_args(argv)
    names = (
        DISTRIBUTIONS
        if extra.distributions == "all"
        else [d for d in extra.distributions.split(",") if d]
    )
    unknown = sorted(set(names) - set(DISTRIBUTIONS))
    if unknown:
        parser.error(
            f"unknown --distributions {unknown}; choose from "
            f"{', '.join(DISTRIBUTIONS)} or all"
        )
    extra.distributions = list(names)
    extra.distribution_sizes = [
        int(float(v)) for v in extra.distribution_sizes.split(",") if v
    ]
    return extra, rest


def captured_gradient(name, extra, log) -> tuple[np.ndarray, dict, str]:
    """(flat gradient, its metadata, label); captured in a child if missing."""
    model = f"lstm_{extra.lstm_config}" if name == "lstm" else name
    path = capture_gradients.path_for(model, extra.cache_dir)
    if not os.path.exists(path):
        log(f"capturing {model} into {extra.cache_dir} (a few minutes)")
        script = os.path.join(os.path.dirname(__file__), "capture_gradients.py")
        subprocess.run(
            [
                sys.executable,
                script,
                "--models",
                model,
                "--out",
                extra.cache_dir,
            ],
            check=True,
        )
    g = capture_gradients.load(model, extra.cache_dir)
    return g["grad"], g["meta"], model


def main(argv: list[str] | None = None) -> int:
    extra, rest = parse_extra(argv)
    args = _common.parse_args(
        __doc__,
        rest,
        sizes="1e6,25e6,1e8",
        densities="0.001,0.01",
        repeats=5,
        reference_help=(
            "largest N for which the slow pure-TF reference is timed"
        ),
        output="ops_cpu",
    )
    meta = _common.machine_meta(args.repeats)
    meta["distributions"] = extra.distributions
    meta["captured"] = {}
    sel, bit = [], []
    for name in extra.distributions:
        if name == "normal":
            for n in args.sizes:
                bench_selection(
                    n,
                    args.densities,
                    args.repeats,
                    args.reference_max_n,
                    sel,
                    print,
                )
                bench_bits(n, args.repeats, bit, print)
        elif name in SYNTHETIC:
            for n in extra.distribution_sizes:
                bench_selection(
                    n,
                    args.densities,
                    args.repeats,
                    0,
                    sel,
                    print,
                    distribution=name,
                )
        else:
            flat, info, label = captured_gradient(name, extra, print)
            meta["captured"][label] = info
            bench_selection(
                flat.size,
                args.densities,
                args.repeats,
                0,
                sel,
                print,
                x=tf.constant(flat),
                distribution=label,
            )
            del flat
    _common.write_results(
        args.output,
        {"meta": meta, "top_k_sample": sel, "bits": bit},
        to_markdown(meta, sel, bit),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
