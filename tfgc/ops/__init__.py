"""Kernels used by the compressors.

Each function runs a compiled custom op (`Tfgc>...`, built from
`custom_ops/`) when the library `tfgc/ops/_tfgc_ops.so` loads, and its
pure-TensorFlow reference otherwise; `using_custom_ops()` tells which.
`TFGC_DISABLE_CUSTOM_OPS=1` forces the references, and so does tracing a
graph that XLA compiles (`compiling_with_xla()`: the compiled ops have no
XLA kernels); what XLA cannot compile at all is refused while tracing
(`refuse_xla`). Importing this package never fails because the library is
missing or broken.
"""

from tfgc.ops._library import (
    compiling_with_xla,
    refuse_xla,
    selects_segments_on_gpu,
    using_custom_ops,
)
from tfgc.ops.bits import (
    pack_bits,
    unpack_bits,
    unpack_bits_sum,
    unpack_bits_vote,
)
from tfgc.ops.golomb import (
    golomb_decode,
    golomb_encode,
    golomb_expected_bits_per_position,
    golomb_optimal_b,
)
from tfgc.ops.golomb import max_encoded_bytes as golomb_max_encoded_bytes
from tfgc.ops.residual import new_residual
from tfgc.ops.scatter import scatter_add_sum
from tfgc.ops.shuffle import index_shuffle
from tfgc.ops.sparse_write import subtract_at, zero_at
from tfgc.ops.top_k_sample import (
    TwoSidedSelection,
    ratio_scores,
    top_k_abs,
    top_k_ratio,
    top_k_sample,
    top_k_two_sided,
)
from tfgc.ops.top_k_sample_segments import (
    SegmentSelection,
    SegmentSelectionWithResidual,
    top_k_sample_segments,
)

__all__ = [
    "compiling_with_xla",
    "golomb_decode",
    "golomb_encode",
    "golomb_expected_bits_per_position",
    "golomb_max_encoded_bytes",
    "golomb_optimal_b",
    "index_shuffle",
    "new_residual",
    "pack_bits",
    "ratio_scores",
    "refuse_xla",
    "SegmentSelection",
    "SegmentSelectionWithResidual",
    "scatter_add_sum",
    "selects_segments_on_gpu",
    "subtract_at",
    "top_k_abs",
    "top_k_ratio",
    "top_k_sample",
    "top_k_sample_segments",
    "top_k_two_sided",
    "TwoSidedSelection",
    "unpack_bits",
    "unpack_bits_sum",
    "unpack_bits_vote",
    "using_custom_ops",
    "zero_at",
]
