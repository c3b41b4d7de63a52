"""The AVX2 and the portable kernel paths give identical results.

The compiled ops pick their AVX2 code at run time when the CPU has AVX2 and
F16C; `TFGC_DISABLE_AVX2=1` forces the portable code. The flag is read once
per process, so this test computes every case here and again in a child
process with the flag set, and compares the outputs bit for bit.

Run as a script (`python test_ops_simd_paths.py OUT.npz`) it writes the
outputs of every case to OUT.npz; the test uses that for the child.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfgc
import tfgc.ops

SIZES = [1, 15, 16, 17, 4097, 300_001, 1_000_003]
DTYPES = [tf.float32, tf.float16, tf.bfloat16]
MODES = ["mstopk", "threshold", "trimmed"]


def _input(n, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.integers(0, n, size=max(1, n // 1000))] = np.round(x[0], 1)  # ties
    if n > 20:
        x[[3, 7, 11]] = [np.nan, np.inf, -np.inf]
        # Subnormals of float32 and bfloat16, and of float16.
        x[[5, 9, 13, 17]] = [3e-39, -1e-40, 1e-7, -3e-6]
    return tf.cast(tf.constant(x), dtype)


def _zeros_and_subnormals(n, dtype, seed):
    """Zeros, with subnormals of dtype (both signs) at a few places: the
    selections hinge on subnormals ranking above zero."""
    rng = np.random.default_rng(seed)
    tiny = 1e-7 if dtype == tf.float16 else 3e-39
    x = np.zeros(n, np.float32)
    x[rng.integers(0, n, size=max(1, n // 500))] = tiny
    x[rng.integers(0, n, size=max(1, n // 700))] = -2 * tiny
    return tf.cast(tf.constant(x), dtype)


def _outlier(n, dtype, seed):
    """Normal data with one huge value: the bisection's grid is so coarse
    that mstopk's band and threshold's selection reach below the compacted
    candidates, and are counted and read from the input."""
    x = _input(n, dtype, seed).numpy().astype(np.float32)
    x[n // 2] = 6e4 if dtype == tf.float16 else 1e6
    return tf.cast(tf.constant(x), dtype)


def _bits(t):
    """The raw bits of a tensor (bfloat16 has no numpy equivalent)."""
    if t.dtype in (tf.float16, tf.bfloat16):
        return tf.bitcast(t, tf.int16).numpy()
    return t.numpy()


def _results():
    """Every case's outputs, by name."""
    out = {}
    for n in SIZES:
        for dtype in DTYPES:
            x = _input(n, dtype, seed=n)
            tiny = _zeros_and_subnormals(n, dtype, seed=n)
            outlier = _outlier(n, dtype, seed=n)
            residual = _input(n, dtype, seed=n + 1) * tf.cast(0.5, dtype)
            for k in sorted({1, max(1, n // 1000), n // 3 or 1}):
                for mode in MODES:
                    for name, data in (
                        ("", x),
                        ("subnormal_", tiny),
                        ("outlier_", outlier),
                    ):
                        v, i = tfgc.ops.top_k_sample(data, k, mode=mode, seed=5)
                        key = f"{name}{mode}_{dtype.name}_{n}_{k}"
                        out[key + "_values"] = _bits(v)
                        out[key + "_indices"] = i.numpy()
                v, i, r = tfgc.ops.top_k_sample(x, k, seed=5, residual=residual)
                key = f"residual_{dtype.name}_{n}_{k}"
                out[key + "_values"] = _bits(v)
                out[key + "_indices"] = i.numpy()
                out[key + "_residual"] = _bits(r)
                # Importance: the scores' vector arithmetic, with zeros,
                # subnormals and non-finite values in acc and the weights.
                v, i, r = tfgc.ops.top_k_ratio(x, k, tiny, 1e-30, residual)
                key = f"ratio_{dtype.name}_{n}_{k}"
                out[key + "_values"] = _bits(v)
                out[key + "_indices"] = i.numpy()
                out[key + "_residual"] = _bits(r)
                v, i, _ = tfgc.ops.top_k_ratio(tiny, k, outlier, 0.5, x)
                out[key + "_tiny_indices"] = i.numpy()
                # SBC's two sides: the magnitude filter of the AVX2 scan,
                # with NaN, Inf, subnormals of both signs and zeros.
                for name, data in (("", x), ("subnormal_", tiny)):
                    sides = tfgc.ops.top_k_two_sided(data, k)
                    key = f"{name}two_sided_{dtype.name}_{n}_{k}"
                    for j, t in enumerate(sides):
                        out[f"{key}_{j}"] = _bits(t)
        mask = tf.constant(np.random.default_rng(n).random(n) < 0.5)
        out[f"pack_{n}"] = tfgc.ops.pack_bits(mask).numpy()
    return out


def _avx2_capable():
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx2" in flags and " f16c" in flags


def test_avx2_and_portable_paths_agree(tmp_path):
    if not tfgc.ops.using_custom_ops():
        pytest.skip("custom ops not built")
    if os.environ.get("TFGC_DISABLE_AVX2", "0") not in ("", "0"):
        pytest.skip("TFGC_DISABLE_AVX2 is set: both runs would be portable")
    if not _avx2_capable():
        pytest.skip("this CPU has no AVX2/F16C: both runs would be portable")
    here = _results()
    path = tmp_path / "portable.npz"
    env = dict(os.environ, TFGC_DISABLE_AVX2="1", TF_CPP_MIN_LOG_LEVEL="2")
    root = os.path.dirname(os.path.dirname(os.path.abspath(tfgc.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    subprocess.run(
        [sys.executable, os.path.abspath(__file__), str(path)],
        env=env,
        check=True,
        timeout=600,
    )
    portable = np.load(path)
    assert sorted(portable.files) == sorted(here)
    for name, value in here.items():
        np.testing.assert_array_equal(value, portable[name], err_msg=name)


if __name__ == "__main__":
    np.savez(sys.argv[1], **_results())
