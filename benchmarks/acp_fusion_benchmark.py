"""What ACP-SGD's fusion as its authors do it changes on the lab's models.

For ResNet-50 and the LSTM LM medium (the lab's `resnet50` and
`lstm-medium`, rank 4, the optimizer's default `min_compress_size` of
1024 elements), two ways to fuse ACP-SGD's tensors into all-reduces:

- `gradient`: buckets of 25 MiB of uncompressed gradient, one partition
  for both steps, matrices compressed only where the factors are smaller
  than the matrix (tfgc's former fusion);
- `authors`: buckets of 5 MiB of what each tensor sends in the step (P
  factors on P steps, Q factors on Q steps, dense tensors whole; P and Q
  partitions apart), every matrix compressed (tfgc's ACP-SGD now, as the
  authors' code fuses).

Counts the compressed tensors, the all-reduces of a P step and of a Q
step, their sizes and the bytes per step, and the buckets of the step
(the grouping whose exchange starts once all its gradients exist). Writes
`benchmarks/results/acp_fusion.md` and `.json`.

    python benchmarks/acp_fusion_benchmark.py
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.lab.worker import build  # noqa: E402
from tfgc import compressors  # noqa: E402
from tfgc.communicators import exchange  # noqa: E402
from tfgc.compressors.powersgd import low_rank_worthwhile  # noqa: E402

RANK = 4
MIN_COMPRESS_SIZE = 1024
RESULTS = os.path.join(ROOT, "benchmarks", "results", "acp_fusion")


def _phase_compressors(shapes, acp, compressed):
    """Per phase, each tensor's compressor: the phase's ACP-SGD where it
    is compressed, Identity (dense, whole) elsewhere."""
    dense = compressors.Identity()
    return [
        [phase if c else dense for c in compressed] for phase in acp.phases()
    ]


def _describe(groups, phase, tensors) -> dict:
    sizes = [
        sum(phase[i].payload_bytes(tensors[i].shape, tf.float32) for i in g)
        for g in groups
    ]
    return {
        "all_reduces": len(groups),
        "bytes": int(sum(sizes)),
        "largest": int(max(sizes)),
        "smallest": int(min(sizes)),
    }


def fusion(shapes, scheme: str) -> dict:
    tensors = [tf.zeros(s) for s in shapes]
    big = [int(np.prod(s)) >= MIN_COMPRESS_SIZE for s in shapes]
    if scheme == "gradient":
        compressed = [
            b and low_rank_worthwhile(s, RANK) for b, s in zip(big, shapes)
        ]
        acp = compressors.ACPSGD(rank=RANK, bucket_bytes=None)
        phases = _phase_compressors(shapes, acp, compressed)
        dense = [compressors.Identity()] * len(shapes)
        step = exchange.buckets(dense, tensors, 25 * 2**20)
        per_phase = [step, step]
    else:
        compressed = [b and len(s) >= 2 for b, s in zip(big, shapes)]
        acp = compressors.ACPSGD(rank=RANK)
        phases = _phase_compressors(shapes, acp, compressed)
        per_phase = [exchange.buckets(p, tensors) for p in phases]
        step = exchange.phase_buckets(phases, tensors)
    return {
        "compressed_tensors": int(sum(compressed)),
        "step_buckets": len(step),
        "p_step": _describe(per_phase[0], phases[0], tensors),
        "q_step": _describe(per_phase[1], phases[1], tensors),
    }


def to_markdown(rows) -> str:
    lines = [
        "# ACP-SGD's fusion: tfgc's former one and its authors'",
        "",
        f"Rank {RANK}, `min_compress_size` {MIN_COMPRESS_SIZE}, float32. "
        "Reproduce with `python benchmarks/acp_fusion_benchmark.py`.",
        "",
        "| model | tensors | fusion | compressed | step buckets | P step: "
        "all-reduces, KiB, largest KiB | Q step: all-reduces, KiB, "
        "largest KiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, q = r["p_step"], r["q_step"]
        lines.append(
            f"| {r['model']} | {r['tensors']} | {r['fusion']} | "
            f"{r['compressed_tensors']} | {r['step_buckets']} | "
            f"{p['all_reduces']}, {p['bytes'] / 1024:.0f}, "
            f"{p['largest'] / 1024:.0f} | {q['all_reduces']}, "
            f"{q['bytes'] / 1024:.0f}, {q['largest'] / 1024:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    rows = []
    rng = np.random.default_rng(0)
    for name in ("resnet50", "lstm-medium"):
        model = build(name, rng)[0]
        shapes = [tuple(v.shape) for v in model.trainable_variables]
        for scheme in ("gradient", "authors"):
            row = {"model": name, "tensors": len(shapes), "fusion": scheme}
            row.update(fusion(shapes, scheme))
            print(row, flush=True)
            rows.append(row)
    with open(RESULTS + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(RESULTS + ".md", "w") as f:
        f.write(to_markdown(rows))
    print(f"wrote {RESULTS}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
