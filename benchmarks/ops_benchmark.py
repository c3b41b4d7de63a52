"""Benchmarks tfgc's custom ops against TensorFlow and numpy baselines.

Selection: `tfgc.ops.top_k_sample` (each mode, compiled op) against
`tf.math.top_k(|x|)` and against one `tf.reduce_max` over the same tensor
(the memory-read bound, same intra-op thread pool), plus the pure-TF
reference. Bit packing: `pack_bits` (compiled op) against the GRACE-style
TF arithmetic reference, `np.packbits` and a plain copy of the input.
Every ratio is measured in the same run. Writes
`benchmarks/results/ops_cpu.md` and `.json`.

    python benchmarks/ops_benchmark.py                   # 1M, 25M, 100M
    python benchmarks/ops_benchmark.py --sizes 1e6 --repeats 3
"""

from __future__ import annotations

import importlib
import math

import _common
import numpy as np
import tensorflow as tf

import tfgc.ops
from tfgc.ops import _library, bits

tks = importlib.import_module("tfgc.ops.top_k_sample")


def timeit(fn, repeats: int) -> float:
    """_common.timeit; results of 1M elements or more are not copied."""
    return _common.timeit(fn, repeats, fetch_below=1e6)


def bench_selection(n, densities, repeats, reference_max_n, rows, log):
    x = tf.random.stateless_normal([n], seed=[1, 2])
    zeros = tf.zeros_like(x)
    base = {"reduce_max": timeit(lambda: tf.reduce_max(x), repeats)}
    for density in densities:
        k = int(np.ceil(density * n))
        r = dict(n=n, density=density, k=k, **base)
        r["tf.math.top_k"] = timeit(
            lambda k=k: tf.math.top_k(tf.abs(x), k), repeats
        )
        for mode in tks.MODES:
            r[f"tfgc {mode}"] = timeit(
                lambda k=k, mode=mode: tfgc.ops.top_k_sample(
                    x, k, mode=mode, seed=3
                ),
                repeats,
            )
            if mode == "threshold":
                r["threshold size / k"] = (
                    tfgc.ops.top_k_sample(x, k, mode=mode)[1].shape[0] / k
                )
        r["tfgc mstopk + residual (fused)"] = timeit(
            lambda k=k: tfgc.ops.top_k_sample(x, k, seed=3, residual=zeros),
            repeats,
        )
        if n <= reference_max_n:
            r["pure-TF reference mstopk"] = timeit(
                lambda k=k: tks.top_k_sample_reference(x, k, seed=3), repeats
            )
        true = set(tf.math.top_k(tf.abs(x), k).indices.numpy().tolist())
        got = tfgc.ops.top_k_sample(x, k, seed=3)[1].numpy().tolist()
        r["mstopk recall"] = len(true & set(got)) / k
        rows.append(r)
        log(
            f"N={n:,} density={density:.1%}: top_k {r['tf.math.top_k']:.1f} "
            f"ms, mstopk {r['tfgc mstopk']:.1f} ms, reduce_max "
            f"{r['reduce_max']:.1f} ms"
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


def to_markdown(meta, sel, bit) -> str:
    out = [
        "# tfgc custom ops on CPU",
        "",
        f"Machine: {meta['machine']}; TensorFlow {meta['tensorflow']}; "
        f"intra-op threads {meta['intra_op_threads']}; custom ops "
        f"loaded: {meta['custom_ops']}. Median of {meta['repeats']} runs "
        "after a warm-up, milliseconds; float32, N(0, 1) data.",
        "",
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
    out += [
        "",
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
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = _common.parse_args(
        __doc__,
        argv,
        sizes="1e6,25e6,1e8",
        densities="0.001,0.01",
        repeats=5,
        reference_help=(
            "largest N for which the slow pure-TF reference is timed"
        ),
        output="ops_cpu",
    )
    meta = _common.machine_meta(args.repeats)
    sel, bit = [], []
    for n in args.sizes:
        bench_selection(
            n, args.densities, args.repeats, args.reference_max_n, sel, print
        )
        bench_bits(n, args.repeats, bit, print)
    _common.write_results(
        args.output,
        {"meta": meta, "top_k_sample": sel, "bits": bit},
        to_markdown(meta, sel, bit),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
