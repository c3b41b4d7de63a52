"""Inputs that push the selection kernels through their hard cases,
shared by the TopKSample test files (Bazel gives each test file only the
non-test files of tests/ops)."""

import numpy as np
import tensorflow as tf

# The smallest subnormal exponent of each dtype: m * 2^e, m in [1, 2^p).
SUBNORMAL_BITS = {
    tf.float32: (-149, 23),
    tf.bfloat16: (-133, 7),
    tf.float16: (-24, 10),
}


def as_float32(x):
    return tf.cast(x, tf.float32).numpy()


def mixed_subnormals(kinds, dtype, seed):
    """float32 values exact in `dtype`: kinds 0 +0, 1 -0, 2 and 3 a
    subnormal of dtype (positive, negative), 4 a normal, 5 a value near
    the smallest normal (of float32 for float32 and bfloat16)."""
    rng = np.random.default_rng(seed)
    kinds = np.asarray(kinds)
    exp, bits = SUBNORMAL_BITS[dtype]
    top = 8 if seed % 2 else 2**bits  # few distinct mantissas: ties
    m = rng.integers(1, top, kinds.size).astype(np.float64)
    x = np.zeros(kinds.size)
    x[kinds == 1] = -0.0
    x[kinds >= 2] = (m * 2.0**exp)[kinds >= 2]
    x[kinds == 3] *= -1
    normal = rng.standard_normal(kinds.size) * 2.0 ** rng.integers(-4, 4)
    x[kinds == 4] = normal[kinds == 4]
    near = 2.0 ** (exp + bits) * (1 + m % 16 / 16) * np.sign(normal)
    x[kinds == 5] = near[kinds == 5]
    return as_float32(tf.constant(x.astype(np.float32), dtype))


def sampled_runs(n):
    """Mask of the 256 runs of 256 keys the CPU kernel samples (n >= 256 Ki):
    its floor for the compaction comes from them."""
    stride = n // 256
    mask = np.zeros(n, bool)
    for r in range(256):
        begin = r * stride + (stride - 256) // 2
        mask[begin : begin + 256] = True
    return mask


# The names `hostile` takes.
HOSTILE = (
    "outlier",
    "student_t2",
    "sample_too_high",
    "sample_too_low",
    "mostly_zero",
    "two_values",
)


def hostile(name, n):
    """Data that sends the CPU kernel's compaction through each of its
    retries (see PlanSelection in top_k_sample_cpu.cc), and heavy tails."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal(n).astype(np.float32)
    if name == "outlier":  # the bisection grid is coarse: lo far below
        x[n // 3] = 1e6
    elif name == "student_t2":
        x = rng.standard_t(2, n).astype(np.float32)
    elif name == "sample_too_high":  # the sample sees only the large values
        x = np.where(sampled_runs(n), x * 100, x)
    elif name == "sample_too_low":  # the sample sees only zeros
        x = np.where(sampled_runs(n), 0, x).astype(np.float32)
    elif name == "mostly_zero":  # k above the nonzeros: zeros selected
        x = np.where(rng.random(n) < 0.005, x, 0).astype(np.float32)
    elif name == "two_values":  # every key in one histogram bucket
        x = np.where(rng.random(n) < 0.5, 1.0, -1.0000001).astype(np.float32)
    return x
