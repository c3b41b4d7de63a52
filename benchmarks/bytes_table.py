"""Bytes on the wire per worker and step, and collectives per step, for
every compressor on a ResNet-50-sized and an LSTM-LM-medium-sized model.

For each compressor the optimizer is built on the model's real variable
shapes (its rules decide what goes dense) and:

* analytic: the sum of each tensor's `payload_bytes` (the documented
  formula; for payloads of data-dependent size, their bound);
* measured: `compression_stats()` after real steps under MirroredStrategy
  on two logical CPUs, on heavy-tailed random gradients that differ per
  replica: payload bytes and overhead bytes (headers and padding of
  unequal-size gathers), each the mean over `--steps` steps (ACP-SGD
  alternates P and Q steps; SBC with a delay sends every `delay` steps);
* collectives per step: the collective ops one step issues (counted while
  tracing; a fused collective counts once, an unequal-size gather twice:
  lengths, then data).

Writes `benchmarks/results/bytes_per_step.md` and `.json`.

    python benchmarks/bytes_table.py                  # both models
    python benchmarks/bytes_table.py --models lstm_medium --steps 8
"""

from __future__ import annotations

import argparse
import os
import sys

import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import _common  # noqa: E402

_common.split_cpu(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfgc  # noqa: E402
from tfgc.communicators import collectives  # noqa: E402

C = tfgc.compressors
DENSITY = 0.001
#: name -> (compressor factory, its settings in words)
COMPRESSORS = {
    "identity": (C.Identity, "dense fp32"),
    "fp16": (C.FP16, ""),
    "bf16": (C.BF16, ""),
    "topk": (lambda: C.TopK(DENSITY), "density 0.1 %"),
    "mstopk": (lambda: C.MSTopK(DENSITY), "density 0.1 %"),
    "redsync": (
        lambda: C.RedSync(DENSITY, cost_model=None),
        "density 0.1 %, threshold",
    ),
    "redsync_trimmed": (
        lambda: C.RedSync(DENSITY, selection="trimmed", cost_model=None),
        "density 0.1 %, trimmed",
    ),
    "randomk": (lambda: C.RandomK(DENSITY), "density 0.1 %"),
    "signsgd": (C.SignSGD, "scaled"),
    "powersgd": (lambda: C.PowerSGD(rank=4), "rank 4"),
    "acpsgd": (lambda: C.ACPSGD(rank=4), "rank 4, 25 MiB buckets"),
    "sbc": (lambda: C.SBC(DENSITY), "density 0.1 %, delay 1"),
    "sbc_delay4": (lambda: C.SBC(DENSITY, delay=4), "density 0.1 %, delay 4"),
    "importance": (lambda: C.ImportancePruning(DENSITY), "density 0.1 %"),
}


def _model(name: str) -> keras.Model:
    if name == "resnet50":
        from models.resnet50_imagenet import resnet

        return resnet.resnet((224, 224, 3), 1000)
    from models.lstm_lm import model

    size = model.SIZES["medium"]
    return model.build_model(size, size.vocab_size, size.num_steps)


class _CountCollectives:
    """Counts `Group` collective calls while a step is traced."""

    NAMES = ("all_reduce", "all_gather", "all_gather_unequal", "broadcast")

    def __init__(self):
        self.calls = 0
        self._saved = {}

    def __enter__(self):
        for name in self.NAMES:
            original = getattr(collectives.Group, name)
            self._saved[name] = original

            def counted(group, *args, _original=original, _name=name):
                if group.size > 1 and group.rank == 0:
                    self.calls += 2 if _name == "all_gather_unequal" else 1
                return _original(group, *args)

            setattr(collectives.Group, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(collectives.Group, name, original)


def _measure(shapes, make, steps):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    compressor = make()
    with strategy.scope():
        variables = [keras.Variable(np.zeros(s, "float32")) for s in shapes]
        opt = tfgc.CompressedOptimizer(keras.optimizers.SGD(0.01), compressor)
        opt.build(variables)
    # Per step: phases (ACP-SGD's P and Q) in turn, a round every `delay`.
    analytic = (
        sum(
            np.mean(
                [
                    c.payload_bytes(
                        opt.communicator.compressed_shape(s), "float32"
                    )
                    for c in plan.phases
                ]
            )
            for plan, s in zip(opt._plans, shapes)
        )
        / compressor.spec.delay
    )
    dense = sum(int(np.prod(s)) * 4 for s in shapes)

    def gradient(shape, replica, step):
        seed = tf.stack([tf.cast(replica, tf.int32), step])
        u = tf.random.stateless_uniform(shape, seed=seed, minval=1e-3)
        sign = tf.sign(tf.random.stateless_uniform(shape, seed=seed + 7) - 0.5)
        return sign * (u ** (-1.0 / 3.0) - 1.0) * 1e-3  # heavy tailed

    @tf.function
    def step(s):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            grads = [gradient(v.shape, r, s) for v in variables]
            opt.apply(grads, variables)

        strategy.run(replica_fn)

    with _CountCollectives() as counter:
        step(tf.constant(0))
    branches = max(len(plan.phases) for plan in opt._plans)
    sent, overhead = [], []
    for s in range(1, steps + 1):
        step(tf.constant(s))
        stats = opt.compression_stats()
        sent.append(stats["sent_bytes"])
        overhead.append(stats["overhead_bytes"])
    return {
        "dense": dense,
        "analytic": float(analytic),
        "sent": float(np.mean(sent)),
        "overhead": float(np.mean(overhead)),
        "collectives": counter.calls / branches,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,lstm_medium")
    parser.add_argument("--compressors", default=",".join(COMPRESSORS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--output", default=os.path.join(HERE, "results", "bytes_per_step")
    )
    args = parser.parse_args(argv)

    results = {}
    for model_name in args.models.split(","):
        model = _model(model_name)
        shapes = [tuple(v.shape) for v in model.trainable_variables]
        params = sum(int(np.prod(s)) for s in shapes)
        results[model_name] = {"parameters": params, "tensors": len(shapes)}
        for name in args.compressors.split(","):
            print(f"[bytes] {model_name} {name} ...", flush=True)
            results[model_name][name] = _measure(
                shapes, COMPRESSORS[name][0], args.steps
            )
    meta = _common.machine_meta(args.steps)
    lines = [
        "# Bytes per worker and step, and collectives per step",
        "",
        "Before each collective's own transport factor (a ring all-reduce "
        "moves 2(p-1)/p of its buffer per worker, an all-gather (p-1) "
        "times it). Analytic: the documented payload formula summed over "
        "the tensors (for data-dependent sizes, the bound). Measured: "
        "`compression_stats()` under MirroredStrategy on 2 logical CPUs, "
        "heavy-tailed random gradients, default `min_compress_size` "
        f"(1024); means over {args.steps} steps (per step, so SBC's delay "
        "and ACP-SGD's alternation are included). Collectives: those one "
        "sending step issues. Command: `python benchmarks/bytes_table.py`.",
    ]
    for model_name, rows in results.items():
        lines += [
            "",
            f"## {model_name}: {rows['parameters']:,} parameters in "
            f"{rows['tensors']} tensors",
            "",
            "| compressor | settings | analytic bytes | measured payload "
            "| measured overhead | ratio vs dense | collectives in a "
            "sending step |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, (_, settings) in COMPRESSORS.items():
            row = rows.get(name)
            if row is None:
                continue
            total = row["sent"] + row["overhead"]
            # Nothing sent in the measured steps (e.g. fewer than a round).
            ratio = f"{row['dense'] / total:,.1f}x" if total else "-"
            lines.append(
                f"| {name} | {settings} | {row['analytic']:,.0f} | "
                f"{row['sent']:,.0f} | {row['overhead']:,.0f} | "
                f"{ratio} | {row['collectives']:g} |"
            )
    _common.write_results(
        args.output, {"meta": meta, "results": results}, "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
