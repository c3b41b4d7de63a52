"""Benchmarks the fused optimizer update on ResNet-50's 161 variables (CPU).

One step of the inner optimizer on ResNet-50's trainable tensors (25.5 M
float32 elements; `resnet50_sizes` of the CUDA harness: no conv biases),
timed in the same run, interleaved, each inside a `tf.function`:

- `keras`: Keras's own `optimizer.apply` (a few element-wise ops per
  variable, each a pass over it with a new buffer);
- `fused`: `tfgc.optimizers.fused_apply.apply`, what `CompressedOptimizer`
  runs: the same scalars, one `Tfgc>FusedUpdate` op over every variable
  (bit for bit Keras's result: tests/ops/test_fused_update.py);
- `pass`: one memory-bound pass over the bytes the fused update reads and
  writes: an in-place `assign_add` over one buffer (reads 8 and writes 4
  bytes per element), its time scaled to the update's bytes per element
  (SGD with momentum reads w, m, g and writes w, m: 20; Adam 28).

for SGD with momentum, Adam and AdamW. Writes
`benchmarks/results/fused_update_cpu.md` and `.json`.

    python benchmarks/fused_update_benchmark.py
    python benchmarks/fused_update_benchmark.py --repeats 5
"""

from __future__ import annotations

import os
import sys

import _common
import keras
import numpy as np
import tensorflow as tf

# The repository root, for the CUDA harness's table of ResNet-50's sizes.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from custom_ops.cuda_harness.run_harness import resnet50_sizes  # noqa: E402
from tfgc.ops import fused_update as fused_update_op  # noqa: E402
from tfgc.optimizers import fused_apply  # noqa: E402

# name: (make the optimizer, bytes read and written per element)
OPTIMIZERS = {
    "SGD momentum 0.9": (
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        20,
    ),
    "Adam": (lambda: keras.optimizers.Adam(1e-3), 28),
    "AdamW (weight decay 0.004)": (
        lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.004),
        28,
    ),
}


def _variables(sizes, seed):
    rng = np.random.default_rng(seed)
    return [
        keras.Variable(rng.normal(0, 0.05, n).astype(np.float32)) for n in sizes
    ]


def _steps(make, sizes, grads):
    """(Keras's step, the fused step, their variables): `tf.function`s
    over twin variables and optimizers."""
    keras_vars, fused_vars = _variables(sizes, 0), _variables(sizes, 0)
    keras_opt, fused_opt = make(), make()
    keras_opt.build(keras_vars)
    fused_opt.build(fused_vars)
    fusion = fused_apply.Fusion.of(fused_opt, fused_vars)
    everything = [list(range(len(sizes)))]

    @tf.function
    def keras_step():
        keras_opt.apply(grads, keras_vars)

    @tf.function
    def fused_step():
        fused_apply.apply(fused_opt, fusion.rule, grads, fused_vars, everything)

    return keras_step, fused_step, keras_vars, fused_vars


def _equal(a, b) -> bool:
    return all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b))


def equal_in_written_order(make, sizes, grads) -> bool:
    """Whether two steps give Keras's weights bit for bit when Grappler's
    arithmetic optimizer leaves Keras's graph in the order its code
    writes (it may reassociate the weight decay's product)."""
    keras_step, fused_step, keras_vars, fused_vars = _steps(make, sizes, grads)
    tf.config.optimizer.set_experimental_options(
        {"arithmetic_optimization": False}
    )
    try:
        for _ in range(2):
            keras_step()
            fused_step()
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": True}
        )
    return _equal(keras_vars, fused_vars)


def bench(name: str, sizes, repeats: int) -> dict:
    make, bytes_per_element = OPTIMIZERS[name]
    rng = np.random.default_rng(1)
    grads = [
        tf.constant(rng.normal(0, 1e-3, n).astype(np.float32)) for n in sizes
    ]
    keras_step, fused_step, keras_vars, fused_vars = _steps(make, sizes, grads)
    total = int(sum(sizes))
    buffer = tf.Variable(tf.zeros([total]))
    addend = tf.ones([total])

    @tf.function
    def one_pass():
        buffer.assign_add(addend)

    times = _common.timeit_interleaved(
        {"keras": keras_step, "fused": fused_step, "pass": one_pass}, repeats
    )
    same = _equal(keras_vars, fused_vars)
    bound = times["pass"] * bytes_per_element / 12
    return {
        "optimizer": name,
        "tensors": len(sizes),
        "elements": total,
        "bytes_per_element": bytes_per_element,
        "keras_ms": times["keras"],
        "fused_ms": times["fused"],
        "pass_12_bytes_ms": times["pass"],
        "memory_bound_ms": bound,
        "speedup_over_keras": times["keras"] / times["fused"],
        "fused_over_memory_bound": times["fused"] / bound,
        "bandwidth_gb_s": total * 12 / times["pass"] / 1e6,
        "weights_equal_keras": same,
        "weights_equal_keras_written_order": equal_in_written_order(
            make, sizes, grads
        ),
    }


def to_markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        "# Fused optimizer update on ResNet-50's variables (CPU)",
        "",
        f"{meta['machine']}, TensorFlow {meta['tensorflow']}, "
        f"{meta['intra_op_threads']} intra-op threads; median of "
        f"{meta['repeats']} interleaved repeats after one warm-up, each "
        "inside `tf.function`. Reproduce with "
        "`python benchmarks/fused_update_benchmark.py`.",
        "",
        "| optimizer | tensors | elements | Keras's loop (ms) | fused (ms) "
        "| speed-up | memory-bound pass (ms) | fused / pass | weights "
        "equal | in written order |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['optimizer']} | {r['tensors']} | {r['elements']:,} | "
            f"{r['keras_ms']:.1f} | {r['fused_ms']:.1f} | "
            f"{r['speedup_over_keras']:.2f}x | {r['memory_bound_ms']:.1f} | "
            f"{r['fused_over_memory_bound']:.2f}x | "
            f"{'yes' if r['weights_equal_keras'] else 'no'} | "
            f"{'yes' if r['weights_equal_keras_written_order'] else 'NO'} |"
        )
    bandwidth = np.median([r["bandwidth_gb_s"] for r in rows])
    lines += [
        "",
        "The memory-bound pass is an in-place `assign_add` over one buffer "
        f"of the same element count (about {bandwidth:.1f} GB/s here), its "
        "time scaled to the bytes the update reads and writes per element "
        "(SGD with momentum 20, Adam 28). Goals: the fused update no "
        "slower than Keras's loop, and within 1.5x of the pass. \"weights "
        'equal": after the timed steps the fused weights are those of '
        'Keras\'s compiled step bit for bit; "in written order": the '
        "same after two steps with Grappler's arithmetic optimizer off, "
        "which otherwise may reassociate Keras's weight decay `w * wd * "
        'lr` into `w * (wd * lr)` (docs/algorithms.md, "The fused '
        "update\": the fused op computes in the order Keras's code "
        "writes).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _common.parse_args(
        __doc__,
        argv,
        sizes="",
        densities="",
        repeats=9,
        reference_help="unused",
        output="fused_update_cpu",
    )
    if not fused_update_op.available():
        print("error: the compiled Tfgc>FusedUpdate op is not available")
        return 1
    meta = _common.machine_meta(args.repeats)
    meta["load_average_before"] = os.getloadavg()[0]
    sizes = resnet50_sizes()
    rows = []
    for name in OPTIMIZERS:
        row = bench(name, sizes, args.repeats)
        print(row, flush=True)
        rows.append(row)
    meta["load_average_after"] = os.getloadavg()[0]
    _common.write_results(
        args.output,
        {"meta": meta, "fused_update": rows},
        to_markdown(meta, rows),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
