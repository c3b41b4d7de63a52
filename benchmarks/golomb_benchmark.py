"""Benchmarks tfgc's Golomb-Rice position coding (SBC) on CPU.

For each N and density q: `tfgc.ops.golomb_encode` / `golomb_decode`
(compiled ops) and their pure-TF references on k = round(q * N) uniformly
random sorted positions, as throughput in positions per second and in
elements of the dense tensor (N) per second, and the measured bits per
position against the formula b* + 1 / (1 - (1 - q)^(2^b*)) of
docs/algorithms.md (goal: within 0.1 bit). Writes
`benchmarks/results/golomb_cpu.md` and `.json`.

    python benchmarks/golomb_benchmark.py                  # 1M, 25M
    python benchmarks/golomb_benchmark.py --sizes 1e6 --repeats 3
"""

from __future__ import annotations

import os

import _common
import numpy as np
import tensorflow as tf

from tfgc.ops import _library, golomb


def bench(
    n: int, q: float, repeats: int, reference_max_n: int, seed: int
) -> dict:
    k = round(q * n)
    rng = np.random.default_rng(seed)
    idx = tf.constant(np.sort(rng.choice(n, k, replace=False)).astype(np.int32))
    b = golomb.golomb_optimal_b(k, n)
    encoded, num_bits = golomb.golomb_encode(idx, n)
    decoded = golomb.golomb_decode(encoded, k, b, n)
    assert np.array_equal(decoded.numpy(), idx.numpy())
    r = {
        "n": n,
        "q": q,
        "k": k,
        "b": b,
        "bytes": int(encoded.shape[0]),
        "bits_per_position": int(num_bits) / k,
        "formula": golomb.golomb_expected_bits_per_position(k, n),
        "encode_ms": _common.timeit(
            lambda: golomb.golomb_encode(idx, n, b), repeats
        ),
        "decode_ms": _common.timeit(
            lambda: golomb.golomb_decode(encoded, k, b, n), repeats
        ),
    }
    lib = _library.custom_ops()
    if lib is not None:  # the kernels alone, without the Python wrapper
        n_t, b_t, k_t = tf.constant(n, tf.int64), tf.constant(b), tf.constant(k)
        r["op_encode_ms"] = _common.timeit(
            lambda: lib.tfgc_golomb_encode(idx, n_t, b_t), repeats
        )
        r["op_decode_ms"] = _common.timeit(
            lambda: lib.tfgc_golomb_decode(encoded, k_t, b_t, n_t), repeats
        )
    if n <= reference_max_n:
        ref_repeats = max(1, repeats // 3)
        r["ref_encode_ms"] = _common.timeit(
            lambda: golomb.golomb_encode_reference(idx, n, b), ref_repeats
        )
        r["ref_decode_ms"] = _common.timeit(
            lambda: golomb.golomb_decode_reference(encoded, k, b, n),
            ref_repeats,
        )
        ref, _ = golomb.golomb_encode_reference(idx, n, b)
        assert np.array_equal(ref.numpy(), encoded.numpy())
    return r


def _rate(count: int, ms: float) -> str:
    return f"{count / (ms * 1e-3):.3g}"


def to_markdown(meta: dict, rows: list[dict]) -> str:
    out = [
        "# tfgc Golomb-Rice position coding on CPU",
        "",
        f"Machine: {meta['machine']}; TensorFlow {meta['tensorflow']}; "
        f"intra-op threads {meta['intra_op_threads']}; custom ops loaded: "
        f"{meta['custom_ops']}. k = round(q N) uniformly random sorted int32 "
        f"positions, b = b*. Median of {meta['repeats']} eager calls after "
        "a warm-up (the pure-TF reference: a third as many). 1-minute load "
        f"average {meta['load_average_before']:.1f} before, "
        f"{meta['load_average_after']:.1f} after (other work on the "
        "machine inflates the times).",
        "",
        "## Bits per position",
        "",
        "| N | q | k | b* | bytes | measured bits/pos | formula | "
        "measured - formula |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = r["bits_per_position"] - r["formula"]
        out.append(
            f"| {r['n']:,} | {r['q']} | {r['k']:,} | {r['b']} | "
            f"{r['bytes']:,} | {r['bits_per_position']:.3f} | "
            f"{r['formula']:.3f} | {diff:+.3f} |"
        )
    out += [
        "",
        "## Throughput",
        "",
        "Positions/s counts coded positions (k); elements/s counts the "
        "dense tensor's N elements that the k positions index. encode and "
        "decode time `tfgc.ops.golomb_encode` / `golomb_decode` (Python "
        "wrapper included); op-only calls the compiled ops directly with "
        "prepared tensors; at small k both are dominated by eager dispatch.",
        "",
        "| N | q | encode ms | encode positions/s | encode elements/s | "
        "decode ms | decode positions/s | decode elements/s | "
        "op-only encode / decode ms | pure-TF encode ms | "
        "pure-TF decode ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        enc, dec = r["encode_ms"], r["decode_ms"]
        ref_e = r.get("ref_encode_ms")
        ref_d = r.get("ref_decode_ms")
        op = (
            f"{r['op_encode_ms']:.3f} / {r['op_decode_ms']:.3f}"
            if "op_encode_ms" in r
            else "-"
        )
        out.append(
            f"| {r['n']:,} | {r['q']} | {enc:.3f} | {_rate(r['k'], enc)} | "
            f"{_rate(r['n'], enc)} | {dec:.3f} | {_rate(r['k'], dec)} | "
            f"{_rate(r['n'], dec)} | {op} | "
            f"{'-' if ref_e is None else f'{ref_e:.1f}'} | "
            f"{'-' if ref_d is None else f'{ref_d:.1f}'} |"
        )
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = _common.parse_args(
        __doc__,
        argv,
        sizes="1e6,25e6",
        densities="0.01,0.001",
        repeats=9,
        reference_help="largest N for which the pure-TF references are timed",
        output="golomb_cpu",
    )
    meta = _common.machine_meta(args.repeats)
    meta["load_average_before"] = os.getloadavg()[0]
    rows = []
    for n in args.sizes:
        for q in args.densities:
            r = bench(n, q, args.repeats, int(args.reference_max_n), seed=n)
            print(r, flush=True)
            rows.append(r)
    meta["load_average_after"] = os.getloadavg()[0]
    _common.write_results(
        args.output, {"meta": meta, "golomb": rows}, to_markdown(meta, rows)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
