"""Kernels used by the compressors.

Each function runs a compiled custom op (`Tfgc>...`, built from
`custom_ops/`) when the library `tfgc/ops/_tfgc_ops.so` loads, and its
pure-TensorFlow reference otherwise; `using_custom_ops()` tells which.
`TFGC_DISABLE_CUSTOM_OPS=1` forces the references. Importing this package
never fails because the library is missing or broken.
"""

from tfgc.ops._library import using_custom_ops
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
from tfgc.ops.scatter import scatter_add_sum
from tfgc.ops.top_k_sample import top_k_abs, top_k_sample

__all__ = [
    "golomb_decode",
    "golomb_encode",
    "golomb_expected_bits_per_position",
    "golomb_max_encoded_bytes",
    "golomb_optimal_b",
    "pack_bits",
    "scatter_add_sum",
    "top_k_abs",
    "top_k_sample",
    "unpack_bits",
    "unpack_bits_sum",
    "unpack_bits_vote",
    "using_custom_ops",
]
