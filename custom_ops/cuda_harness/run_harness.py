"""Checks and times tfgc's CUDA kernels without TensorFlow.

Builds `libtfgc_cuda_harness.so` from the same kernel sources the TF op
uses (custom_ops/cc/kernels/*.cu.cc) plus harness_api.cu.cc, with nvcc
alone, loads it with ctypes, compares TopKSample and the bit-packing
kernels against numpy, and times TopKSample against `torch.topk` when
PyTorch is installed.

    python custom_ops/cuda_harness/run_harness.py --build-only  # no GPU
    python custom_ops/cuda_harness/run_harness.py               # on a GPU
    python custom_ops/cuda_harness/run_harness.py --sizes 1e6,25e6,1e8

Needs numpy, nvcc and the CUDA runtime; exit status 0 when every check
passed, 1 on a mismatch, 2 when no GPU is visible (after building).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIB = os.path.join(HERE, "libtfgc_cuda_harness.so")
MODES = ("mstopk", "threshold", "trimmed")

sys.path.insert(0, ROOT)
from custom_ops import build as ops_build  # noqa: E402
from custom_ops.cuda_harness.numpy_oracle import np_select  # noqa: E402


def build_library(verbose: bool = False) -> str:
    """Compiles the kernels and the C API into LIB with nvcc."""
    found = ops_build.find_cuda()
    if found is None:
        raise ops_build.BuildError("nvcc and the CUDA headers were not found")
    nvcc, home = found
    _, cuda_sources = ops_build.sources()
    srcs = [*cuda_sources, os.path.join(HERE, "harness_api.cu.cc")]
    with tempfile.TemporaryDirectory() as tmp:
        objs = [os.path.join(tmp, f"{i}.o") for i in range(len(srcs))]
        ops_build._compile_all(
            [ops_build.nvcc_command(nvcc, s, o) for s, o in zip(srcs, objs)],
            verbose,
        )
        cmd = [
            nvcc,
            "-shared",
            *objs,
            "-o",
            LIB,
            f"-L{os.path.join(home, 'lib64')}",
            "-lcudart",
        ]
        if verbose:
            print(" ".join(cmd))
        subprocess.run(cmd, check=True)
    return LIB


class Harness:
    """ctypes wrapper with device buffers managed by the library."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        self.lib.tfgc_top_k_sample.argtypes = [
            ctypes.c_int, vp, i64, i64, ctypes.c_int, ctypes.c_int, i64,
            vp, vp, i64, ctypes.POINTER(i64), vp,
        ]  # fmt: skip
        self.lib.tfgc_malloc.argtypes = [ctypes.POINTER(vp), i64]
        self.lib.tfgc_free.argtypes = [vp]
        self.lib.tfgc_copy_to_device.argtypes = [vp, vp, i64]
        self.lib.tfgc_copy_to_host.argtypes = [vp, vp, i64]
        self.lib.tfgc_pack_bits.argtypes = [vp, i64, vp]
        self.lib.tfgc_unpack_bits_sum.argtypes = [
            ctypes.c_int, vp, vp, i64, i64, vp,
        ]  # fmt: skip
        self.lib.tfgc_time.argtypes = [
            ctypes.c_int, ctypes.c_int, vp, i64, i64, ctypes.c_int, vp, vp,
            i64, ctypes.c_int, ctypes.POINTER(ctypes.c_float),
        ]  # fmt: skip

    def check(self, err: int, what: str) -> None:
        if err != 0:
            raise RuntimeError(f"{what} failed with cudaError_t {err}")

    def devices(self) -> int:
        count = ctypes.c_int(0)
        err = self.lib.tfgc_device_count(ctypes.byref(count))
        return count.value if err == 0 else 0

    def alloc(self, nbytes: int) -> ctypes.c_void_p:
        p = ctypes.c_void_p()
        self.check(self.lib.tfgc_malloc(ctypes.byref(p), nbytes), "malloc")
        return p

    def to_device(self, a: np.ndarray) -> ctypes.c_void_p:
        a = np.ascontiguousarray(a)
        p = self.alloc(a.nbytes)
        self.check(
            self.lib.tfgc_copy_to_device(p, a.ctypes.data, a.nbytes), "copy"
        )
        return p

    def to_host(self, p, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        self.check(
            self.lib.tfgc_copy_to_host(out.ctypes.data, p, out.nbytes), "copy"
        )
        return out

    def top_k_sample(self, x: np.ndarray, k: int, mode: str, seed: int = 0):
        dtype = {np.float32: 0, np.float16: 1}[x.dtype.type]
        n = x.size
        cap = max(1, n)
        d_x = self.to_device(x)
        d_v = self.alloc(cap * x.itemsize)
        d_i = self.alloc(cap * 4)
        size = ctypes.c_int64(0)
        err = self.lib.tfgc_top_k_sample(
            dtype, d_x, n, k, MODES.index(mode), 20, seed, d_v, d_i, cap,
            ctypes.byref(size), None,
        )  # fmt: skip
        self.check(err, "top_k_sample")
        v = self.to_host(d_v, [size.value], x.dtype)
        i = self.to_host(d_i, [size.value], np.int32)
        for p in (d_x, d_v, d_i):
            self.lib.tfgc_free(p)
        return v, i


def check_correctness(h: Harness) -> int:
    failures = 0
    rng = np.random.default_rng(0)
    for n in [1, 31, 33, 1000, 4097, 100_003, 1_000_000]:
        for dtype in (np.float32, np.float16):
            x = rng.standard_normal(n).astype(dtype)
            if n > 100:
                x[rng.integers(0, n, 3)] = np.nan
                x[rng.integers(0, n, 2)] = np.inf
            for k in sorted({0, 1, max(1, n // 1000), n // 2, n}):
                for mode in MODES:
                    v, i = h.top_k_sample(x, k, mode, seed=n + k)
                    want = np_select(x, k, mode, seed=n + k)
                    ok = np.array_equal(i, want) and np.array_equal(
                        v.view(np.uint8), x[i].view(np.uint8)
                    )
                    if not ok:
                        failures += 1
                        print(f"MISMATCH top_k_sample {n=} {k=} {mode} {dtype}")
    for n in [1, 32, 33, 1000, 1_000_001]:
        mask = rng.random(n) < 0.5
        d_m = h.to_device(mask)
        words = (n + 31) // 32
        d_w = h.alloc(words * 4)
        h.check(h.lib.tfgc_pack_bits(d_m, n, d_w), "pack_bits")
        got = h.to_host(d_w, [words], np.int32)
        pad = np.zeros(words * 32, bool)
        pad[:n] = mask
        want = np.packbits(pad, bitorder="little").view("<i4")
        if not np.array_equal(got, want):
            failures += 1
            print(f"MISMATCH pack_bits {n=}")
        scales = np.array([0.5, 2.0], np.float32)
        both = np.stack([want, ~want])
        d_b, d_s = h.to_device(both), h.to_device(scales)
        d_o = h.alloc(n * 4)
        h.check(
            h.lib.tfgc_unpack_bits_sum(0, d_b, d_s, 2, n, d_o), "unpack_sum"
        )
        got = h.to_host(d_o, [n], np.float32)
        sign = np.where(mask, 1.0, -1.0)
        if not np.allclose(got, 0.5 * sign - 2.0 * sign):
            failures += 1
            print(f"MISMATCH unpack_bits_sum {n=}")
        for p in (d_m, d_w, d_b, d_s, d_o):
            h.lib.tfgc_free(p)
    print(f"correctness: {failures} failures")
    return failures


def benchmark(h: Harness, sizes: list[int], iters: int) -> None:
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        torch = None
    print("| N | density | mode | tfgc ms | torch.topk ms | speedup |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        d_x = h.to_device(x)
        for density in (0.001, 0.01):
            k = max(1, int(np.ceil(density * n)))
            cap = 4 * k + 64
            d_v, d_i = h.alloc(cap * 4), h.alloc(cap * 4)
            t_torch = float("nan")
            if torch is not None and torch.cuda.is_available():
                tx = torch.from_numpy(x).cuda()
                torch.topk(tx.abs(), k)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    torch.topk(tx.abs(), k)
                torch.cuda.synchronize()
                t_torch = (time.perf_counter() - t0) * 1e3 / iters
            for fn, mode in enumerate(MODES):
                ms = ctypes.c_float(0)
                err = h.lib.tfgc_time(
                    fn, 0, d_x, n, k, 20, d_v, d_i, cap, iters,
                    ctypes.byref(ms),
                )  # fmt: skip
                h.check(err, "time")
                print(
                    f"| {n:,} | {density:.1%} | {mode} | {ms.value:.3f} | "
                    f"{t_torch:.3f} | {t_torch / ms.value:.2f}x |"
                )
            h.lib.tfgc_free(d_v)
            h.lib.tfgc_free(d_i)
        h.lib.tfgc_free(d_x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--sizes", default="1e6,25e6,1e8")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_build or not os.path.exists(LIB):
        print(f"built {build_library(args.verbose)}")
    if args.build_only:
        return 0
    h = Harness(LIB)
    if h.devices() == 0:
        print("no CUDA device is visible; built only")
        return 2
    failures = check_correctness(h)
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    benchmark(h, sizes, args.iters)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
