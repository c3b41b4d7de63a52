"""Checks and times tfgc's CUDA kernels without TensorFlow.

Builds a library from the same kernel sources the TF op uses
(custom_ops/cc/kernels/*.cu.cc) plus harness_api.cu.cc, loads it with
ctypes and compares TopKSample, TopKTwoSided, AddResidual, NewResidual, the
bit-packing kernels, ScatterAddSum, Golomb coding and FusedUpdate against
numpy. With nvcc the library runs on a GPU, where TopKSample is also timed
against `torch.topk` when PyTorch is installed. With `--emulate` a C++
compiler builds the same sources against the CPU emulation of CUDA in
cuda_emulation.h, and the checks run there, on sizes suited to a CPU and on
several emulated devices and thread schedules.

    python custom_ops/cuda_harness/run_harness.py --build-only  # no GPU
    python custom_ops/cuda_harness/run_harness.py               # on a GPU
    python custom_ops/cuda_harness/run_harness.py --sizes 1e6,25e6,1e8
    python custom_ops/cuda_harness/run_harness.py --emulate     # on a CPU

Needs numpy, and nvcc with the CUDA runtime (`CUDA_HOME` or nvcc on PATH)
or, for --emulate, g++ (or $CXX). Exit status 0 when every check passed,
1 on a mismatch, 2 when no GPU is visible (after building).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIB = os.path.join(HERE, "libtfgc_cuda_harness.so")
EMULATION_LIB = os.path.join(HERE, "libtfgc_cuda_emulation.so")
HARNESS_API = os.path.join(HERE, "harness_api.cu.cc")
# The CPU emulation of CUDA, force-included into every source of the
# emulation build: the kernel sources include the CUDA headers only under
# nvcc, and no production header includes the emulation.
CUDA_EMULATION_H = os.path.join(HERE, "cuda_emulation.h")
MODES = ("mstopk", "threshold", "trimmed")
DTYPES = ("float32", "float16", "bfloat16")  # codes 0, 1, 2 of the C API
SCHEDULES = ("round-robin", "reverse", "random")

# Sizes of the checks: n = 0, 1, odd, 2^k +- 1, several tiles (2048
# elements) and stride rounds (256 threads per block).
GPU_SIZES = (0, 1, 31, 33, 1000, 4097, 100_003, 1_000_000)
EMULATION_SIZES = (0, 1, 2, 31, 33, 255, 257, 2047, 2049, 4097, 20_001)
# Emulated devices (multiprocessors, max grid size in x) with a thread
# schedule and its seed. The kernels size their grids from these, so one
# block walks every tile and stride step, or several blocks share them.
EMULATED_DEVICES = (
    (1, 1, "round-robin", 0),
    (2, 3, "reverse", 0),
    (2, 2**31 - 1, "random", 1),
    (3, 5, "random", 2),
)

sys.path.insert(0, ROOT)
from custom_ops import build as ops_build  # noqa: E402
from custom_ops.cuda_harness.numpy_oracle import (  # noqa: E402
    FUSED_UPDATE_RULES,
    FtzFloat,
    as_float32,
    flush_subnormals,
    from_bfloat16,
    np_flip_sign,
    np_fused_update,
    np_golomb_decode,
    np_golomb_encode,
    np_scatter_add_sum,
    np_select_ratio,
    np_select_segments,
    np_select_two_sided,
    np_selector,
    optimal_b,
    to_dtype,
)


def build_library(
    output: str = LIB, verbose: bool = False, targets: list[str] | None = None
) -> str:
    """Compiles the kernels and the C API into `output` with nvcc, with the
    real build's flags for `targets` (-gencode flags; default the real
    build's)."""
    found = ops_build.find_cuda()
    if found is None:
        raise ops_build.BuildError("nvcc and the CUDA headers were not found")
    nvcc, _ = found
    _, cuda_sources = ops_build.sources()
    srcs = [*cuda_sources, HARNESS_API]
    with tempfile.TemporaryDirectory() as tmp:
        objs = [os.path.join(tmp, f"{i}.o") for i in range(len(srcs))]
        ops_build._compile_all(
            [
                ops_build.nvcc_command(nvcc, s, o, targets=targets)
                for s, o in zip(srcs, objs)
            ],
            verbose,
        )
        # The CUDA runtime linked in statically: the library then loads
        # on a bare machine whose toolkit is not on the loader's path.
        cmd = [nvcc, "-shared", "--cudart=static", *objs, "-o", output]
        if verbose:
            print(" ".join(cmd))
        subprocess.run(cmd, check=True)
    return output


def find_cxx() -> str | None:
    """The C++ compiler of the emulation: $CXX, g++ or c++ (None if none)."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])
    return shutil.which("g++") or shutil.which("c++")


def emulation_flags() -> list[str]:
    """The C++ flags that compile a CUDA source on the emulation. Floating
    point contraction is off: the _rn intrinsics, which nvcc never fuses
    into a multiply-add, must stay separate roundings on the host too."""
    return [
        "-x",
        "c++",
        "-ffp-contract=off",
        "-DTFGC_CUDA_EMULATION",
        "-include",
        CUDA_EMULATION_H,
        f"-I{ROOT}",
    ]


def build_emulation(output: str = EMULATION_LIB, verbose: bool = False) -> str:
    """Compiles the kernels and the C API as C++ on the CUDA emulation."""
    cxx = find_cxx()
    if cxx is None:
        raise ops_build.BuildError("no C++ compiler (g++ or $CXX) was found")
    _, cuda_sources = ops_build.sources()
    srcs = [*cuda_sources, HARNESS_API]
    # -O1: the fibers switch often, so the kernels need not be fast; it
    # compiles quicker than -O3 and keeps the float arithmetic IEEE.
    flags = ["-std=c++17", "-O1", "-fPIC", "-pthread", "-Wall", "-Wextra"]
    with tempfile.TemporaryDirectory() as tmp:
        objs = [os.path.join(tmp, f"{i}.o") for i in range(len(srcs))]
        ops_build._compile_all(
            [
                [cxx, *emulation_flags(), "-c", s, "-o", o, *flags]
                for s, o in zip(srcs, objs)
            ],
            verbose,
        )
        staged = os.path.join(tmp, "lib.so")
        ops_build._run(
            [cxx, "-shared", "-pthread", *objs, "-o", staged], verbose
        )
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        shutil.copyfile(staged, output + ".tmp")
        os.replace(output + ".tmp", output)
    return output


class Sizes(NamedTuple):
    """The input sizes of the checks. `small` ones get every case; `large`
    ones (25 M and 100 M on a GPU) the cases of training: Gaussian and
    heavy-tailed inputs, k at 0.1 % and 1 %, payloads of top-k size. The
    special sets run at the small sizes, where they cost less."""

    small: tuple[int, ...]
    large: tuple[int, ...] = ()

    def each(self) -> Iterator[tuple[int, bool]]:
        """(n, whether n is a large size) for every size, small first."""
        yield from ((n, False) for n in self.small)
        yield from ((n, True) for n in self.large)


class CheckResult(NamedTuple):
    """One check's counts: cases run, mismatches among them, and inputs
    skipped for being larger than --max-case-size."""

    cases: int
    failures: int
    skipped_inputs: int


class Tally:
    """Counts one check's cases and prints each as ok or MISMATCH (only the
    mismatches unless `verbose`). Inputs of more than `max_case_size`
    elements are skipped and counted (the sanitizers' quick runs)."""

    def __init__(self, verbose: bool = False, max_case_size: int | None = None):
        self.verbose = verbose
        self.max_case_size = max_case_size
        self.cases = self.failures = self.skipped_inputs = 0

    def __call__(self, ok: bool, what: str) -> None:
        self.cases += 1
        self.failures += not ok
        if self.verbose or not ok:
            print(f"{'ok' if ok else 'MISMATCH'} {what}", flush=True)

    def skip(self, n: int) -> bool:
        """Whether an input of n elements is skipped (and counts it)."""
        if self.max_case_size is None or n <= self.max_case_size:
            return False
        self.skipped_inputs += 1
        return True

    def result(self) -> CheckResult:
        return CheckResult(self.cases, self.failures, self.skipped_inputs)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(
        a.view(np.uint8), b.view(np.uint8)
    )


class Harness:
    """ctypes wrapper with device buffers managed by the library."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        i32, i64, vp = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
        self.lib.tfgc_top_k_sample.argtypes = [
            i32, vp, i64, i64, i32, i32, i64, vp, vp, i64,
            ctypes.POINTER(i64), vp, i32,
        ]  # fmt: skip
        self.lib.tfgc_top_k_sample_segments.argtypes = [
            i32, vp, vp, i32, i32, i32, vp, vp, i64, vp, vp, i32, vp,
        ]  # fmt: skip
        self.lib.tfgc_top_k_sample_segments_scratch_bytes.argtypes = [vp, i32]
        self.lib.tfgc_top_k_sample_segments_scratch_bytes.restype = i64
        self.lib.tfgc_malloc.argtypes = [ctypes.POINTER(vp), i64]
        self.lib.tfgc_free.argtypes = [vp]
        self.lib.tfgc_copy_to_device.argtypes = [vp, vp, i64]
        self.lib.tfgc_copy_to_host.argtypes = [vp, vp, i64]
        self.lib.tfgc_add_residual.argtypes = [i32, vp, vp, vp, i64]
        self.lib.tfgc_new_residual.argtypes = [i32, vp, vp, vp, i64]
        self.lib.tfgc_top_k_ratio.argtypes = [
            i32, vp, vp, vp, ctypes.c_float, i64, i64, vp, vp, vp, i32,
        ]  # fmt: skip
        self.lib.tfgc_top_k_two_sided.argtypes = [
            i32, vp, i64, i64, vp, vp, vp, vp, vp, i32,
        ]  # fmt: skip
        self.lib.tfgc_pack_bits.argtypes = [vp, i64, vp]
        self.lib.tfgc_unpack_bits.argtypes = [vp, i64, i64, vp]
        self.lib.tfgc_unpack_bits_sum.argtypes = [i32, vp, vp, i64, i64, vp]
        self.lib.tfgc_unpack_bits_vote.argtypes = [i32, vp, i64, i64, vp]
        self.lib.tfgc_scatter_add_sum_scratch_bytes.argtypes = [i64]
        self.lib.tfgc_scatter_add_sum_scratch_bytes.restype = i64
        self.lib.tfgc_scatter_add_sum.argtypes = [
            i32, vp, vp, i64, i64, vp, vp, ctypes.POINTER(i64),
            ctypes.POINTER(ctypes.c_int32),
        ]  # fmt: skip
        self.lib.tfgc_golomb_encode_scratch_bytes.argtypes = [i64]
        self.lib.tfgc_golomb_encode_scratch_bytes.restype = i64
        p64 = ctypes.POINTER(i64)
        self.lib.tfgc_golomb_encode.argtypes = [
            i32, vp, i64, i64, i32, vp, vp, i64, vp, i64, p64, p64, p64, p64,
        ]  # fmt: skip
        self.lib.tfgc_golomb_decode_scratch_bytes.argtypes = [i64, i32]
        self.lib.tfgc_golomb_decode_scratch_bytes.restype = i64
        self.lib.tfgc_golomb_decode.argtypes = [
            vp, i64, i64, i32, i64, vp, vp, vp,
        ]  # fmt: skip
        self.lib.tfgc_fused_update.argtypes = [i32, i32, vp, vp, i64, vp, i32]
        self.lib.tfgc_copy_buffer.argtypes = [vp, vp, i64]
        self.lib.tfgc_timer_stop.argtypes = [ctypes.POINTER(ctypes.c_float)]
        self.lib.tfgc_copy_device.argtypes = [vp, vp, i64]
        # Whether TopKSample can run with the host thread flushing
        # denormals (FTZ and DAZ, as TensorFlow's threads do).
        self.can_flush = bool(self.lib.tfgc_can_flush_denormals())
        self.emulated = hasattr(self.lib, "tfgc_emulation_configure")
        if self.emulated:
            self.lib.tfgc_emulation_configure.argtypes = [
                i32, i32, i32, ctypes.c_uint64,
            ]  # fmt: skip
            self.lib.tfgc_emulation_convert.argtypes = [i32, vp, i64, vp, vp]
            self.lib.tfgc_emulation_top_k_sample_traffic.argtypes = [vp]
            self.lib.tfgc_emulation_fused_update_traffic.argtypes = [vp]

    def check(self, err: int, what: str) -> None:
        if err != 0:
            raise RuntimeError(f"{what} failed with cudaError_t {err}")

    def devices(self) -> int:
        count = ctypes.c_int(0)
        err = self.lib.tfgc_device_count(ctypes.byref(count))
        return count.value if err == 0 else 0

    def configure(self, sms: int, max_grid: int, schedule: str, seed: int):
        """Sets the emulated device and thread schedule."""
        err = self.lib.tfgc_emulation_configure(
            sms, max_grid, SCHEDULES.index(schedule), seed
        )
        self.check(err, "emulation_configure")

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

    def free(self, *ptrs) -> None:
        for p in ptrs:
            self.check(self.lib.tfgc_free(p), "free")

    def _record_top_k_traffic(self) -> None:
        """Under the emulation, `top_k_traffic` gets what the last top-k
        launchers asked of the host: (waits, copies to the host, copies
        from the host)."""
        if self.emulated:
            traffic = np.zeros(3, np.int64)
            self.lib.tfgc_emulation_top_k_sample_traffic(traffic.ctypes.data)
            self.top_k_traffic = tuple(int(t) for t in traffic)

    def top_k_sample(
        self,
        x: np.ndarray,
        dtype: str,
        k: int,
        mode: str,
        seed: int = 0,
        zero: bool = False,
        flush: bool = False,
    ):
        """(values, indices, x with the selection zeroed or None); `flush`
        runs it with the calling thread flushing denormals. Under the
        emulation, `top_k_traffic` then holds the launchers' (host waits,
        copies to the host, copies from the host)."""
        n = x.size
        cap = max(1, n)
        d_x = self.to_device(x)
        d_v = self.alloc(cap * x.itemsize)
        d_i = self.alloc(cap * 4)
        d_z = self.to_device(x) if zero else None
        size = ctypes.c_int64(0)
        err = self.lib.tfgc_top_k_sample(
            DTYPES.index(dtype), d_x, n, k, MODES.index(mode), 20, seed,
            d_v, d_i, cap, ctypes.byref(size), d_z, int(flush),
        )  # fmt: skip
        self.check(err, "top_k_sample")
        self._record_top_k_traffic()
        v = self.to_host(d_v, [size.value], x.dtype)
        i = self.to_host(d_i, [size.value], np.int32)
        z = self.to_host(d_z, [n], x.dtype) if zero else None
        self.free(d_x, d_v, d_i, *([d_z] if zero else []))
        return v, i, z

    def top_k_sample_segments(
        self,
        x: np.ndarray,
        dtype: str,
        table: np.ndarray,
        mode: str,
        zero: bool = False,
        flush: bool = False,
        allow_error: bool = False,
    ):
        """The segmented TopKSample over the fused `x`; `table` has rows
        (offset, n, k, seed). Returns (values, indices, sizes, x with the
        selections zeroed or None): values and indices of all segments one
        after another, sizes[s] the length of segment s's part. With
        `allow_error`, a failure leaves its cudaError_t in
        `segments_error` instead of raising. Under the emulation
        `top_k_traffic` then holds the launchers' host traffic."""
        table = np.ascontiguousarray(table, np.int64).reshape(-1, 4)
        count = table.shape[0]
        cap = max(1, x.size)  # disjoint segments select at most x.size
        d_x = self.to_device(x)
        d_v = self.alloc(cap * x.itemsize)
        d_i = self.alloc(cap * 4)
        d_z = self.to_device(x) if zero else None
        sizes = np.full(max(1, count), -1, np.int64)
        err = self.lib.tfgc_top_k_sample_segments(
            DTYPES.index(dtype), d_x, table.ctypes.data, count,
            MODES.index(mode), 20, d_v, d_i, cap, sizes.ctypes.data, d_z,
            int(flush), None,
        )  # fmt: skip
        self.segments_error = err
        if err != 0 and not allow_error:
            self.check(err, "top_k_sample_segments")
        self._record_top_k_traffic()
        sizes = sizes[:count] if err == 0 else np.zeros(count, np.int64)
        total = int(sizes.sum())
        v = self.to_host(d_v, [total], x.dtype)
        i = self.to_host(d_i, [total], np.int32)
        z = self.to_host(d_z, [x.size], x.dtype) if zero else None
        self.free(d_x, d_v, d_i, *([d_z] if zero else []))
        return v, i, sizes, z

    def top_k_ratio(self, g, r, w, floor, k: int, dtype: str, flush=False):
        """(values, indices, new residual) of TopKRatio; the residual's
        buffer is written in place, as the op forwards it."""
        n = g.size
        d_g, d_r, d_w = self.to_device(g), self.to_device(r), self.to_device(w)
        d_v = self.alloc(max(1, k) * g.itemsize)
        d_i = self.alloc(max(1, k) * 4)
        err = self.lib.tfgc_top_k_ratio(
            DTYPES.index(dtype), d_g, d_r, d_w, floor, n, k, d_r, d_v, d_i,
            int(flush),
        )  # fmt: skip
        self.check(err, "top_k_ratio")
        v = self.to_host(d_v, [k], g.dtype)
        i = self.to_host(d_i, [k], np.int32)
        acc = self.to_host(d_r, [n], g.dtype)
        self.free(d_g, d_r, d_w, d_v, d_i)
        return v, i, acc

    def top_k_two_sided(self, x: np.ndarray, dtype: str, k: int, flush=False):
        """(positive values, positive indices, negative values, negative
        indices) of TopKTwoSided; `flush` as in `top_k_sample`. Under the
        emulation, `top_k_traffic` then holds the launchers' host traffic."""
        n = x.size
        cap = max(1, k)
        d_x = self.to_device(x)
        d_pv, d_nv = self.alloc(cap * x.itemsize), self.alloc(cap * x.itemsize)
        d_pi, d_ni = self.alloc(cap * 4), self.alloc(cap * 4)
        sizes = np.full(2, -1, np.int64)
        err = self.lib.tfgc_top_k_two_sided(
            DTYPES.index(dtype), d_x, n, k, d_pv, d_pi, d_nv, d_ni,
            sizes.ctypes.data, int(flush),
        )  # fmt: skip
        self.check(err, "top_k_two_sided")
        self._record_top_k_traffic()
        out = (
            self.to_host(d_pv, [sizes[0]], x.dtype),
            self.to_host(d_pi, [sizes[0]], np.int32),
            self.to_host(d_nv, [sizes[1]], x.dtype),
            self.to_host(d_ni, [sizes[1]], np.int32),
        )
        self.free(d_x, d_pv, d_nv, d_pi, d_ni)
        return out

    def elementwise(self, op: str, a: np.ndarray, b: np.ndarray, dtype: str):
        """`tfgc_<op>` (add_residual, new_residual) of a and b, as a new
        array of their shape and type."""
        d_a, d_b = self.to_device(a), self.to_device(b)
        d_out = self.alloc(max(1, a.nbytes))
        launch = getattr(self.lib, f"tfgc_{op}")
        self.check(launch(DTYPES.index(dtype), d_a, d_b, d_out, a.size), op)
        out = self.to_host(d_out, a.shape, a.dtype)
        self.free(d_a, d_b, d_out)
        return out

    def pack_bits(self, mask: np.ndarray) -> np.ndarray:
        words = (mask.size + 31) // 32
        d_m, d_w = self.to_device(mask), self.alloc(max(1, words * 4))
        self.check(self.lib.tfgc_pack_bits(d_m, mask.size, d_w), "pack_bits")
        out = self.to_host(d_w, [words], np.int32)
        self.free(d_m, d_w)
        return out

    def unpack_bits(self, words: np.ndarray, n: int) -> np.ndarray:
        rows = words.shape[0]
        d_w, d_m = self.to_device(words), self.alloc(max(1, rows * n))
        err = self.lib.tfgc_unpack_bits(d_w, rows, n, d_m)
        self.check(err, "unpack_bits")
        out = self.to_host(d_m, [rows, n], np.bool_)
        self.free(d_w, d_m)
        return out

    def unpack_bits_reduce(self, words, n, scales, dtype, vote: bool):
        """unpack_bits_vote when `vote`, else unpack_bits_sum."""
        p = words.shape[0]
        itemsize = 4 if dtype == "float32" else 2
        d_w, d_o = self.to_device(words), self.alloc(max(1, n * itemsize))
        code = DTYPES.index(dtype)
        if vote:
            err = self.lib.tfgc_unpack_bits_vote(code, d_w, p, n, d_o)
            d_s = None
        else:
            d_s = self.to_device(scales)
            err = self.lib.tfgc_unpack_bits_sum(code, d_w, d_s, p, n, d_o)
        self.check(err, "unpack_bits_vote" if vote else "unpack_bits_sum")
        out = self.to_host(d_o, [n], np.float32 if itemsize == 4 else np.uint16)
        self.free(d_w, d_o, *([d_s] if d_s is not None else []))
        return out

    def scatter_add_sum(self, values, indices, n: int, dtype: str):
        """(out [n] of values' dtype, first bad position or -1, its index).

        The scratch is a buffer of its own, so that the guard page catches
        accesses past it.
        """
        m = indices.size
        d_v, d_i = self.to_device(values), self.to_device(indices)
        d_o = self.alloc(n * values.itemsize)
        d_s = self.alloc(self.lib.tfgc_scatter_add_sum_scratch_bytes(m))
        pos, index = ctypes.c_int64(-2), ctypes.c_int32(0)
        err = self.lib.tfgc_scatter_add_sum(
            DTYPES.index(dtype), d_v, d_i, m, n, d_o, d_s,
            ctypes.byref(pos), ctypes.byref(index),
        )  # fmt: skip
        self.check(err, "scatter_add_sum")
        out = self.to_host(d_o, [n], values.dtype)
        self.free(d_v, d_i, d_o, d_s)
        return out, pos.value, index.value

    def fused_update(
        self,
        rule: str | int,
        weight_decay: bool,
        scalars,
        tensors: list,
        flush: bool = False,
        sizes: list[int] | None = None,
        count: int | None = None,
    ):
        """FusedUpdate of `tensors`, a list of float32 (w, m, v, g) (None
        for a slot the rule does not have), with `scalars` in a device
        array of exactly their number. Returns (cudaError_t, each tensor's
        [w, m, v] afterwards, whether every gradient and every buffer's
        guard words were left alone). Each buffer is a device allocation
        of its own with FUSED_UPDATE_GUARD random words before the tensor,
        and after it on a GPU (under the emulation the guard page follows
        it). `sizes` and `count` override the table's (invalid tables);
        `rule` may be a code. Under the emulation, `fused_update_traffic`
        then holds the launcher's (waits, copies to the host, copies from
        the host, launches)."""
        pad = FUSED_UPDATE_GUARD
        after = 0 if self.emulated else pad
        rng = np.random.default_rng(len(tensors))
        pointers = np.zeros((max(1, len(tensors)), 4), np.uint64)
        buffers = []  # (tensor, slot, device pointer, host copy with guards)
        for j, arrays in enumerate(tensors):
            for slot, a in enumerate(arrays):
                if a is None:
                    continue
                guard = rng.integers(0, 2**32, pad + after, dtype=np.uint32)
                guard = guard.view(np.float32)
                full = np.concatenate([guard[:pad], a, guard[pad:]])
                d = self.to_device(full.astype(np.float32))
                pointers[j, slot] = d.value + 4 * pad
                buffers.append((j, slot, d, full))
        table_sizes = np.array(
            [t[0].size for t in tensors] if sizes is None else sizes, np.int64
        ).reshape(-1)
        d_s = self.to_device(np.asarray(scalars, np.float32))
        code = rule if isinstance(rule, int) else FUSED_UPDATE_RULES.index(rule)
        err = self.lib.tfgc_fused_update(
            code, int(weight_decay), pointers.ctypes.data,
            table_sizes.ctypes.data, len(tensors) if count is None else count,
            d_s, int(flush),
        )  # fmt: skip
        if self.emulated:
            traffic = np.zeros(4, np.int64)
            self.lib.tfgc_emulation_fused_update_traffic(traffic.ctypes.data)
            self.fused_update_traffic = tuple(int(t) for t in traffic)
        out = [list(t[:3]) for t in tensors]
        intact = True
        for j, slot, d, full in buffers:
            got = self.to_host(d, full.shape, np.float32)
            end = full.size - after
            intact = intact and same_bits(got[:pad], full[:pad])
            intact = intact and same_bits(got[end:], full[end:])
            if slot == 3:
                intact = intact and same_bits(got, full)
            else:
                out[j][slot] = got[pad:end]
        self.free(d_s, *(d for _, _, d, _ in buffers))
        return err, out, intact

    def copy_buffer(self, x: np.ndarray) -> np.ndarray:
        """x copied on the device by FusedUpdate's CopyBuffer."""
        d_x, d_y = self.to_device(x), self.alloc(x.nbytes)
        self.check(self.lib.tfgc_copy_buffer(d_y, d_x, x.size), "copy_buffer")
        out = self.to_host(d_y, x.shape, x.dtype)
        self.free(d_x, d_y)
        return out

    def golomb_encode(self, indices: np.ndarray, n: int, b: int, bits: int):
        """(bytes, num_bits, (first bad position or -1, its index, the one
        before)); `bits` bounds the stream (the buffers' sizes)."""
        k = indices.size
        d_i = self.to_device(indices)
        d_s = self.alloc(self.lib.tfgc_golomb_encode_scratch_bytes(k))
        cap, words = (bits + 7) // 8, (bits + 31) // 32
        d_w, d_o = self.alloc(words * 4), self.alloc(cap)
        num, pos, val, prev = (ctypes.c_int64(-2) for _ in range(4))
        err = self.lib.tfgc_golomb_encode(
            int(indices.dtype == np.int64), d_i, k, n, b, d_s, d_w, words,
            d_o, cap, *(ctypes.byref(v) for v in (num, pos, val, prev)),
        )  # fmt: skip
        self.check(err, "golomb_encode")
        size = (num.value + 7) // 8 if pos.value < 0 else 0
        out = self.to_host(d_o, [size], np.uint8)
        self.free(d_i, d_s, d_w, d_o)
        return out, num.value, (pos.value, val.value, prev.value)

    def golomb_decode(self, data: np.ndarray, k: int, b: int, limit: int):
        """(positions [k], (error kind, code, value))."""
        d_e, d_o = self.to_device(data), self.alloc(k * 4)
        d_s = self.alloc(
            self.lib.tfgc_golomb_decode_scratch_bytes(data.size, b)
        )
        error = np.full(3, -2, np.int64)
        err = self.lib.tfgc_golomb_decode(
            d_e, data.size, k, b, limit, d_o, d_s, error.ctypes.data
        )
        self.check(err, "golomb_decode")
        out = self.to_host(d_o, [k], np.int32)
        self.free(d_e, d_o, d_s)
        return out, tuple(int(v) for v in error)


def first_bad(idx: np.ndarray, n: int) -> int:
    """The first j with idx[j] <= idx[j - 1] or outside [0, n); -1."""
    i = idx.astype(np.int64)
    prev = np.concatenate([[-1], i[:-1]])
    bad = np.flatnonzero((i <= prev) | (i >= n))
    return int(bad[0]) if bad.size else -1


def golomb_inputs(sizes, rng):
    """(description, indices, n, b) of valid and invalid encodings; the
    large sizes only with SBC's densities (k = n/1000 and n/100) and two
    invalid inputs."""
    for case, (n, large) in enumerate(sizes.each()):
        if n == 0:
            yield "empty n=0", np.zeros(0, np.int32), 0, 0
            continue
        dtype = np.int64 if case % 2 else np.int32
        if large:
            ks = {n // 1000, n // 100}
        else:
            ks = {0, 1, max(1, n // 100), n // 2, n}
        for k in sorted(ks):
            idx = np.sort(rng.choice(n, k, replace=False)).astype(dtype)
            bs = {0, optimal_b(k, n), 31} | (set() if large else {1})
            for b in sorted(bs):
                yield f"{k=} {n=} {b=} {dtype.__name__}", idx, n, b
        # Invalid: a duplicate, an unsorted pair, n, -1, several bad.
        k = max(2, n // 100 if large else n // 3)
        invalid = [
            ("duplicate", k - 1, None),
            ("unsorted", k // 2, None),
            ("index n", k - 1, n),
            ("negative first", 0, -1),
            ("negative", k // 2, -5),
        ]
        if large:
            invalid = [invalid[0], invalid[3]]
        if n >= k + 1:
            idx = np.sort(rng.choice(n, k, replace=False)).astype(dtype)
            for what, at, value in invalid:
                bad = idx.copy()
                if what == "duplicate":
                    bad[at] = bad[at - 1]
                elif what == "unsorted":
                    bad[at], bad[at - 1] = bad[at - 1], bad[at]
                    bad[-1] = n  # a later violation too
                else:
                    bad[at] = value
                yield f"{what} {k=} {n=}", bad, n, optimal_b(k, n)
    # Long unary runs (q up to 1.5e6 ones, words of ones end to end), and
    # int64 positions far above 2^31 with b = 31 and 20.
    big = np.array([0, 1_500_000, 1_500_001, 3_000_000], np.int32)
    yield "long gaps b=0", big, 3_000_001, 0
    yield "long gaps b=1", big, 3_000_001, 1
    huge = np.array([5, 2**39, 2**40 - 1], np.int64)
    yield "int64 b=31", huge, 2**40, 31
    yield "int64 b=20", huge, 2**40, 20
    yield "n=0 k=1", np.zeros(1, np.int32), 0, 0


def decode_inputs(rng):
    """(description, bytes, k, b, limit) of invalid or odd streams."""
    idx = np.sort(rng.choice(5000, 300, replace=False))
    for b in (0, 3, 31):
        data, bits = np_golomb_encode(idx, b)
        yield f"k+1 codes {b=}", data, idx.size + 1, b, 5000
        yield f"last byte cut {b=}", data[:-1], idx.size, b, 5000
        yield f"limit below the last {b=}", data, idx.size, b, int(idx[-1])
        tail = np.concatenate([data, np.full(9, 0xFF, np.uint8)])
        yield f"trailing bytes {b=}", tail, idx.size, b, 5000
    data, _ = np_golomb_encode(np.array([3, 400]), 0)
    yield "unary above limit", data, 2, 0, 100
    for b in (0, 2):  # q = (limit >> b) + 1 exactly, and q = limit >> b
        for last in (100 << b, 101 << b):
            data, _ = np_golomb_encode(np.array([last]), b)
            yield f"unary edge {last=} {b=}", data, 1, b, 100 << b
    # Over many chunks (512 bits) and groups (256 chunks) of the CUDA
    # decoder: errors deep in the stream, unary parts across chunks, bytes
    # that are no stream at all.
    idx = np.sort(rng.choice(2_000_000, 20_000, replace=False))
    for b in (0, 6, 31):
        data, _ = np_golomb_encode(idx, b)
        yield f"many chunks k+1 codes {b=}", data, idx.size + 1, b, 2_000_000
        limit = int(idx[12_345])
        yield f"many chunks limit {limit} {b=}", data, idx.size, b, limit
    for b, last, limit in ((0, 5010, 3000), (0, 2000, 1990), (3, 40_000, 8000)):
        data, _ = np_golomb_encode(np.array([10, last]), b)
        yield f"long unary {last=} {limit=} {b=}", data, 2, b, limit
    for b in (0, 3, 31):
        noise = rng.integers(0, 256, 20_000).astype(np.uint8)
        k = noise.size * 8 // (b + 2)
        yield f"random bytes {b=}", noise, k, b, 2**31
        yield f"random bytes {b=} limit 10^5", noise, k, b, 100_000
    yield "all ones", np.full(40, 0xFF, np.uint8), 1, 2, 2**31
    yield "empty stream", np.zeros(0, np.uint8), 1, 0, 10
    top, _ = np_golomb_encode(np.array([2**31 - 1]), 31)
    yield "int32 limit", top, 1, 31, 2**31


def check_golomb(h: Harness, sizes, setup, report: Tally) -> None:
    rng = np.random.default_rng(5)
    case = 0
    for name, idx, n, b in golomb_inputs(sizes, rng):
        if report.skip(idx.size):
            continue
        where = setup(case)
        case += 1
        bad = first_bad(idx, n)
        if bad >= 0:
            want_bits = 0
        else:
            want, want_bits = np_golomb_encode(idx, b)
        got, bits, (pos, val, prev) = h.golomb_encode(idx, n, b, want_bits)
        if bad >= 0:
            before = int(idx[bad - 1]) if bad > 0 else -1
            ok = (pos, val, prev) == (bad, int(idx[bad]), before)
            report(ok, f"golomb_encode {name} bad at {pos}{where}")
            continue
        ok = pos == -1 and bits == want_bits and np.array_equal(got, want)
        report(ok, f"golomb_encode {name} {bits=}{where}")
        if n > 2**31:
            continue  # positions are int32 in decoding
        where = setup(case)
        case += 1
        out, error = h.golomb_decode(got, idx.size, b, n)
        ok = error == (0, 0, 0) and np.array_equal(out, idx.astype(np.int32))
        report(ok, f"golomb_decode {name} {error=}{where}")
    for name, data, k, b, limit in decode_inputs(rng):
        if report.skip(data.size):
            continue
        where = setup(case)
        case += 1
        want, want_error = np_golomb_decode(data, k, b, limit)
        out, error = h.golomb_decode(data.astype(np.uint8), k, b, limit)
        ok = data.dtype == np.uint8 and error == want_error
        ok = ok and np.array_equal(out[: want.size], want)
        report(ok, f"golomb_decode {name} {error=} want {want_error}{where}")


# Subnormals of float32 and bfloat16 (m 2^-149, m 2^-133) and of float16
# (m 2^-24, normal in float32).
SUBNORMAL_BITS = {
    "float32": (-149, 23),
    "bfloat16": (-133, 7),
    "float16": (-24, 10),
}


def top_k_inputs(
    sizes, rng
) -> Iterator[tuple[str, np.ndarray, tuple[str, ...], list[int] | None]]:
    """(description, float32 values, dtypes, k values or None for the
    default ones) with NaN, Inf, ties, subnormals and special sets; the
    large sizes get Gaussian and Student-t inputs with k = 1, n/1000 and
    n/100 only."""
    for n, large in sizes.each():
        x = rng.standard_normal(n).astype(np.float32)
        if n > 100:
            x[rng.integers(0, n, 3)] = np.nan
            x[rng.integers(0, n, 2)] = np.inf
            x[rng.integers(0, n, 2)] = -np.inf
        if not large:
            yield f"gaussian {n=}", x, DTYPES, None
            continue
        ks = [1, n // 1000, n // 100]
        yield f"gaussian {n=}", x, DTYPES, ks
        del x
        x = rng.standard_t(2, n).astype(np.float32)
        yield f"student-t df 2 {n=}", x, DTYPES, ks
    small = sizes.small
    if not small:
        return
    n = max([s for s in small if s < 5000] or small)
    ties = np.round(rng.standard_normal(n) * 2).astype(np.float32)
    yield f"ties {n=}", ties, DTYPES, None
    yield f"equal {n=}", np.full(n, -1.5, np.float32), DTYPES, None
    yield f"zeros {n=}", np.zeros(n, np.float32), DTYPES, None
    yield f"nan {n=}", np.full(n, np.nan, np.float32), DTYPES, None
    inf = np.where(rng.random(n) < 0.5, np.inf, np.nan).astype(np.float32)
    yield f"inf and nan {n=}", inf, DTYPES, None
    tiny = (rng.integers(-8, 8, n) * 2.0**-140).astype(np.float32)
    yield f"subnormal {n=}", tiny, DTYPES, None
    # Zeros and one subnormal, which must rank above them (the
    # float comparisons of a flushing thread took it for zero).
    for dtype in DTYPES:
        exp, bits = SUBNORMAL_BITS[dtype]
        tiny = np.float32(3 * 2.0**exp)
        six = np.float32([1, tiny, 0, 0, 0, 0])
        yield f"one subnormal [1, {tiny:.3g}, 0, 0, 0, 0]", six, (dtype,), [3]
        x = np.zeros(1_000_000, np.float32)
        x[123_456] = tiny
        yield "zeros and one subnormal n=1000000", x, (dtype,), [2000]
        # Zeros, subnormals of both signs (few distinct ones: ties),
        # normals and values near the smallest normal.
        kind = rng.integers(0, 6, n)
        m = rng.integers(1, 2**bits if dtype == "float32" else 8, n)
        near = 2.0 ** (exp + bits) * (1 + rng.integers(0, 16, n) / 16)
        x = np.select(
            [kind == 0, kind == 1, kind == 2, kind == 3, kind == 4],
            [0.0, -0.0, m * 2.0**exp, -m * 2.0**exp, near],
            rng.standard_normal(n),
        ).astype(np.float32)
        yield f"zeros, subnormals and normals {n=}", x, (dtype,), None
    # Inputs that stress the GPU plan (radix select, bisection from order
    # statistics, counts at its final thresholds): heavy tails, a huge
    # outlier (a coarse bisection grid: every threshold but the last few
    # is above all other keys), mostly zeros and equal keys (ties across
    # every digit of the radix select), with k = 1, n, and 2k > n.
    ks = [1, 2, max(1, n // 50), n // 2 + 1, max(1, n - 1), n]
    big = max(small)
    x = rng.standard_t(2, big).astype(np.float32)
    big_ks = [1, max(1, big // 1000), big // 2 + 1, big]
    yield f"student-t df 2 n={big}", x, DTYPES, big_ks
    # Over more than one chunk (256 tiles of 2048 elements) of the GPU's
    # tile scan.
    many = 700_001
    x = rng.standard_t(2, many).astype(np.float32)
    yield f"student-t df 2 n={many}", x, DTYPES, [700, many // 2 + 1]
    for dtype in DTYPES:
        x = rng.standard_normal(n).astype(np.float32)
        x[n // 3] = 6e4 if dtype == "float16" else -1e30
        yield f"one huge outlier {n=}", x, (dtype,), ks
    x = np.zeros(n, np.float32)
    live = rng.random(n) < 0.02
    x[live] = rng.standard_normal(int(live.sum()))
    yield f"98% zeros {n=}", x, DTYPES, ks
    x = np.where(rng.random(n) < 0.5, -0.75, 0.75).astype(np.float32)
    yield f"equal magnitudes {n=}", x, DTYPES, ks


def expected_traffic(mode: str, n: int, k: int) -> tuple[int, int, int]:
    """What TopKSample's launchers may ask of the host: (waits, copies to
    the host, copies from the host). Nothing in the exact-k modes; one copy
    of the output size and one wait in threshold mode."""
    return (1, 1, 0) if mode == "threshold" and n > 0 and k > 0 else (0, 0, 0)


def check_top_k_sample(h: Harness, sizes, setup, report: Tally) -> None:
    """TopKSample against numpy. Every other pair of cases runs with the
    host thread flushing denormals (FTZ and DAZ, as TensorFlow's threads
    do; under the emulation the device code too, as with nvcc -ftz=true),
    and the subnormal cases always do: keys compared as integers give the
    same selection in either mode. Under the emulation the launchers' host
    synchronisations and copies must also be `expected_traffic`'s."""
    rng = np.random.default_rng(0)
    case = 0
    for name, x32, dtypes, k_values in top_k_inputs(sizes, rng):
        n = x32.size
        if report.skip(n):
            continue
        subnormal = "subnormal" in name
        for dtype in dtypes:
            x = to_dtype(x32, dtype)
            select = np_selector(as_float32(x, dtype))
            ks = k_values or {0, 1, max(1, n // 1000), n // 2, n}
            for k in sorted(k for k in ks if k <= n):
                for mode in MODES:
                    where = setup(case)
                    zero = case % 2 == 1
                    flush = h.can_flush and (subnormal or case % 4 >= 2)
                    case += 1
                    seed = n + k
                    v, i, z = h.top_k_sample(
                        x, dtype, k, mode, seed, zero, flush
                    )
                    want = select(k, mode, seed)
                    ok = np.array_equal(i, want) and same_bits(v, x[want])
                    traffic = ""
                    if h.emulated:
                        ok = ok and h.top_k_traffic == expected_traffic(
                            mode, n, k
                        )
                        traffic = f" host traffic {h.top_k_traffic}"
                    if zero:
                        z_want = x.copy()
                        z_want[want] = 0
                        ok = ok and same_bits(z, z_want)
                    report(
                        ok,
                        f"top_k_sample {name} {k=} {mode} {dtype} {zero=} "
                        f"flush_denormals={flush}{traffic}{where}",
                    )


def resnet50_sizes() -> list[int]:
    """Element counts of ResNet-50's 161 trainable tensors (Keras
    ResNet50 without conv biases): the 7x7 stem, 16 bottleneck blocks of
    stages (3, 4, 6, 3) with a projection shortcut in each stage's first,
    batch norm gamma and beta after every conv, and the 2048 x 1000 dense
    layer with its bias: 64 to 2,359,296 elements, 25.5 M in all."""
    sizes = [7 * 7 * 3 * 64, 64, 64]
    c_in = 64
    for blocks, f in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for b in range(blocks):
            sizes += [c_in * f, f, f, 9 * f * f, f, f, f * 4 * f, 4 * f, 4 * f]
            if b == 0:
                sizes += [c_in * 4 * f, 4 * f, 4 * f]
            c_in = 4 * f
    return sizes + [2048 * 1000, 1000]


def resnet50_segments(scale: int, rng):
    """(float32 fused buffer, table rows (offset, n, k, seed)) of
    ResNet-50's tensors, each above 4096 elements divided by `scale`:
    weights Gaussian at a per-tensor scale, batch norm gammas near 1 with
    ties, betas mostly zero; k at 1 % (at least 1)."""
    parts, rows, offset = [], [], 0
    for s, size in enumerate(resnet50_sizes()):
        n = size if size <= 4096 else max(4097, size // scale)
        if size <= 4096 and s % 3 == 1:  # gamma
            x = 1 + np.round(rng.standard_normal(n) * 8) / 64
        elif size <= 4096 and s % 3 == 2:  # beta
            x = np.where(rng.random(n) < 0.9, 0, rng.standard_normal(n))
        else:
            x = rng.standard_normal(n) * 2.0 ** rng.integers(-12, 2)
        parts.append(x.astype(np.float32))
        rows.append((offset, n, max(1, -(-n // 100)), 1000 + s))
        offset += n
    return np.concatenate(parts), np.array(rows, np.int64)


def segment_part(rng, n: int, which: int) -> np.ndarray:
    """One segment's float32 values of kind `which` (top_k_inputs's
    special sets: Gaussian with NaN and Inf, ties, equal, zeros,
    subnormals, a huge outlier, 98 % zeros, heavy tails)."""
    kind = which % 8
    if kind == 0:
        x = rng.standard_normal(n)
        if n > 100:
            x[rng.integers(0, n, 2)] = np.nan
            x[rng.integers(0, n, 2)] = -np.inf
    elif kind == 1:
        x = np.round(rng.standard_normal(n) * 2)
    elif kind == 2:
        x = np.full(n, -1.5)
    elif kind == 3:
        x = np.zeros(n)
    elif kind == 4:
        x = rng.integers(-8, 8, n) * 2.0**-140
    elif kind == 5:
        x = rng.standard_normal(n)
        x[n // 3 if n else 0 : n // 3 + 1] = -1e30
    elif kind == 6:
        x = np.where(rng.random(n) < 0.02, rng.standard_normal(n), 0)
    else:
        x = rng.standard_t(2, n)
    return np.asarray(x, np.float32)


def segment_inputs(sizes, rng, scale: int):
    """(description, float32 fused buffer, table rows (offset, n, k, seed),
    dtypes) of segmented selections: mixed sizes and kinds with k = 0, 1,
    2, n/1000, n/2, n - 1 and n, segments with n = 0, gaps between
    segments and offsets out of order; k = n everywhere; every segment
    inactive; no segment; one segment; ResNet-50's 161 tensors (with small
    sizes only: a run of large sizes alone leaves it out)."""
    ks = (
        lambda n: 0, lambda n: 1, lambda n: n // 2, lambda n: n,
        lambda n: max(1, n // 1000), lambda n: n - 1, lambda n: 2,
    )  # fmt: skip

    def fuse(lengths, k_of, order=None, gap=0):
        order = range(len(lengths)) if order is None else order
        x = np.full(sum(lengths) + gap * (len(lengths) + 1), 7.0, np.float32)
        rows = [None] * len(lengths)
        offset = gap
        for j in order:  # segment j lies at the j-th place in `order`
            n = lengths[j]
            x[offset : offset + n] = segment_part(rng, n, j)
            k = min(n, max(0, k_of(j, n)))
            rows[j] = (offset, n, k, 17 * j + n)
            offset += n + gap
        return x, np.array(rows, np.int64).reshape(-1, 4)

    lengths = [*sizes.small, *sizes.large, 0, 3, 0]
    mixed = [lengths[j] for j in rng.permutation(len(lengths))]
    x, rows = fuse(mixed, lambda j, n: ks[j % len(ks)](n))
    yield f"mixed sizes count={len(rows)}", x, rows, DTYPES
    x, rows = fuse(
        mixed, lambda j, n: ks[(j + 3) % len(ks)](n),
        order=list(reversed(range(len(mixed)))), gap=5,
    )  # fmt: skip
    yield f"gaps, offsets reversed count={len(rows)}", x, rows, DTYPES
    x, rows = fuse(mixed, lambda j, n: n)
    yield "k = n everywhere", x, rows, ("float32",)
    x, rows = fuse([0, 5, 0, 9], lambda j, n: 0)
    yield "every segment inactive", x, rows, ("float32",)
    yield "no segment", np.zeros(4, np.float32), np.zeros((0, 4)), ("float32",)
    big = max(lengths)
    x, rows = fuse([big], lambda j, n: max(1, n // 100))
    yield f"one segment n={big}", x, rows, ("float16",)
    if sizes.small:
        x, rows = resnet50_segments(scale, rng)
        yield f"ResNet-50 {len(rows)} tensors /{scale}", x, rows, DTYPES


def expected_segment_traffic(mode: str, table) -> tuple[int, int, int]:
    """The segmented launchers' host traffic: the segment table copied to
    the device once, and expected_traffic's wait and copy of the sizes in
    threshold mode, whatever the number of segments."""
    active = any(n > 0 and k > 0 for _, n, k, _ in table)
    return (*expected_traffic(mode, int(active), int(active))[:2], int(active))


def check_top_k_segments(h: Harness, sizes, setup, report: Tally) -> None:
    """The segmented TopKSample: every segment's values, indices and zeroed
    entries bit for bit those of the single-tensor launchers on the segment
    alone (and its indices numpy's); entries outside every segment left
    alone; under the emulation, the host traffic of
    expected_segment_traffic."""
    rng = np.random.default_rng(6)
    scale = 64 if h.emulated else 1
    case = 0
    for name, x32, table, dtypes in segment_inputs(sizes, rng, scale):
        if report.skip(x32.size):
            continue
        for dtype in dtypes:
            x = to_dtype(x32, dtype)
            keys_of = as_float32(x, dtype)
            for mode in MODES:
                where = setup(case)
                zero = case % 2 == 0
                flush = h.can_flush and case % 4 >= 2
                case += 1
                v, i, got_sizes, z = h.top_k_sample_segments(
                    x, dtype, table, mode, zero, flush
                )
                traffic = ""
                ok = True
                if h.emulated:
                    traffic = f" host traffic {h.top_k_traffic}"
                    ok = h.top_k_traffic == expected_segment_traffic(
                        mode, table
                    )
                wants = np_select_segments(keys_of, table, mode)
                z_want = x.copy()
                bad = []
                start = 0
                for s, (off, n, k, seed) in enumerate(table):
                    size = int(got_sizes[s])
                    part = slice(start, start + size)
                    seg_v, seg_i = v[part], i[part]
                    start += size
                    one_v, one_i, one_z = h.top_k_sample(
                        x[off : off + n], dtype, int(k), mode, int(seed),
                        zero, flush,
                    )  # fmt: skip
                    seg_ok = (
                        same_bits(seg_v, one_v)
                        and np.array_equal(seg_i, one_i)
                        and np.array_equal(seg_i, wants[s])
                    )
                    if zero:
                        z_want[off : off + n] = one_z
                    if not seg_ok:
                        bad.append(s)
                ok = ok and not bad
                if zero:
                    ok = ok and same_bits(z, z_want)
                report(
                    ok,
                    f"top_k_sample_segments {name} {mode} {dtype} {zero=} "
                    f"flush_denormals={flush}{traffic} bad segments "
                    f"{bad[:10]}{where}",
                )
    # Invalid tables: the launchers refuse them (cudaErrorInvalidValue)
    # before touching the device.
    x = np.ones(8, np.float32)
    for what, row in (
        ("k > n", (0, 4, 5, 0)),
        ("k < 0", (0, 4, -1, 0)),
        ("offset < 0", (-1, 4, 1, 0)),
        ("n >= 2^31", (0, 2**31, 1, 0)),
    ):
        setup(case)
        case += 1
        table = np.array([(4, 4, 2, 0), row], np.int64)
        h.top_k_sample_segments(x, "float32", table, "mstopk", False,
                                False, allow_error=True)  # fmt: skip
        ok = h.segments_error == 1  # cudaErrorInvalidValue
        if h.emulated:
            ok = ok and h.top_k_traffic == (0, 0, 0)
        report(
            ok,
            f"top_k_sample_segments invalid table {what}: error "
            f"{h.segments_error}",
        )


def _check_elementwise(op, oracle, special, h, sizes, setup, report):
    """`op` (Harness.elementwise) against `oracle(a, b)` on float32 values
    (the CPU's flushes included), bit for bit but for NaN payloads: random
    values of many magnitudes, after `special` (pairs) where they fit."""
    rng = np.random.default_rng(len(op))
    for case, (n, dtype) in enumerate(
        (n, dtype) for n, _ in sizes.each() for dtype in DTYPES
    ):
        if report.skip(n):
            continue
        where = setup(case)
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) * 2.0 ** rng.integers(
            -12, 12, n
        )
        if n > len(special):
            a[: len(special)] = [x for x, _ in special]
            b[: len(special)] = [y for _, y in special]
        x, y = to_dtype(a, dtype), to_dtype(b, dtype)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf
            total = oracle(as_float32(x, dtype), as_float32(y, dtype))
        want = to_dtype(total, dtype)
        got = h.elementwise(op, x, y, dtype)
        # The device writes NaN as 0x7fff; numpy keeps the payload.
        nan = np.isnan(total)
        ok = same_bits(got[~nan], want[~nan]) and bool(
            np.all(np.isnan(as_float32(got, dtype)[nan]))
        )
        report(ok, f"{op} {n=} {dtype}{where}")


_TINY = float(np.float32(2.0**-126))


def check_add_residual(h: Harness, sizes, setup, report: Tally) -> None:
    """g + r with the CPU's flushes: float32 subnormal addends and sums
    count as zeros."""

    def oracle(g, r):
        return flush_subnormals(flush_subnormals(g) + flush_subnormals(r))

    special = [(np.inf, -np.inf), (np.inf, 1), (np.nan, 2), (0.5, 0.25)]
    special += [(1e-39, 0.0), (-3e-39, 1e-39), (_TINY, -_TINY / 2)]
    special += [(1.5 * _TINY, -1.25 * _TINY), (1.0, -3e-39)]
    _check_elementwise("add_residual", oracle, special, h, sizes, setup, report)


def check_new_residual(h: Harness, sizes, setup, report: Tally) -> None:
    """corrected - sent, +0 where sent is not finite, with the CPU's
    flushes: float32 subnormal operands and differences count as zeros."""

    def oracle(c, s):
        diff = flush_subnormals(flush_subnormals(c) - flush_subnormals(s))
        return np.where(np.isfinite(s), diff, np.float32(0.0))

    # Kept, zeroed, zeroed, kept NaN, zeroed, zeroed, then subnormals.
    special = [(np.inf, 1), (1, np.inf), (1, -np.inf), (np.nan, 1)]
    special += [(1, np.nan), (np.inf, np.inf), (1e-39, 0.0), (-3e-39, -1e-39)]
    special += [(_TINY, _TINY / 2), (1.5 * _TINY, 1.25 * _TINY), (1.0, 3e-39)]
    _check_elementwise("new_residual", oracle, special, h, sizes, setup, report)


def same_or_nan(got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    """Bit for bit, but where `want` is NaN any NaN (the device writes
    NaN as its own bits)."""
    nan = np.isnan(as_float32(want, dtype))
    return same_bits(got[~nan], want[~nan]) and bool(
        np.all(np.isnan(as_float32(got, dtype)[nan]))
    )


def check_top_k_ratio(h: Harness, sizes, setup, report: Tally) -> None:
    """TopKRatio against np_select_ratio: indices, acc's values there and
    the new residual bit for bit (NaN: any NaN), for each dtype, with zero,
    subnormal and infinite weights, non-finite and tied acc, floors 0, a
    subnormal, 1e-3 and huge, k = 0, 1, n / 100, n; half the cases with the
    host thread flushing denormals."""
    rng = np.random.default_rng(2)
    case = 0
    for n, _ in sizes.each():
        if report.skip(n):
            continue
        for dtype in DTYPES:
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32) * 0.5
            w = rng.standard_normal(n).astype(np.float32) * 0.05
            w[::5] = 0
            if n > 12:
                a[:4] = [np.nan, np.inf, -np.inf, 1e-39]
                w[4:8] = [np.inf, 1e-39, -0.0, -3e-39]
                a[8:12] = b[8:12] = 0.25  # ties
            g, r, wd = (to_dtype(v, dtype) for v in (a, b, w))
            acc = to_dtype(
                flush_subnormals(
                    flush_subnormals(as_float32(g, dtype))
                    + flush_subnormals(as_float32(r, dtype))
                ),
                dtype,
            )
            acc32, w32 = as_float32(acc, dtype), as_float32(wd, dtype)
            # Above a million elements (numpy takes seconds a case) only
            # the case of training: 0.1 %, a normal floor.
            big = n > 1_000_000
            for floor in (1e-3,) if big else (0.0, 1e-40, 1e-3, 1e30):
                ks = {n // 1000} if big else {0, min(1, n), n // 100, n}
                for k in sorted(ks):
                    where = setup(case)
                    flush = h.can_flush and case % 2 == 1
                    case += 1
                    v, i, res = h.top_k_ratio(g, r, wd, floor, k, dtype, flush)
                    want = np_select_ratio(acc32, w32, np.float32(floor), k)
                    kept = acc.copy()
                    kept[want] = 0
                    ok = (
                        np.array_equal(i, want)
                        and same_or_nan(v, acc[want], dtype)
                        and same_or_nan(res, kept, dtype)
                    )
                    report(
                        ok,
                        f"top_k_ratio {n=} {k=} {floor=} {dtype}"
                        f"{' flush' if flush else ''}{where}",
                    )


# NaN bit patterns of both signs, quiet and signalling, with payloads, in
# each dtype's own bits: both sides select them, and the values must keep
# them (the negative side's with the sign bit flipped).
NAN_BITS = {
    "float32": (np.uint32, [0xFFC00000, 0x7FC00123, 0xFF800001, 0x7F800001]),
    "float16": (np.uint16, [0xFE00, 0x7E12, 0xFC01, 0x7C01]),
    "bfloat16": (np.uint16, [0xFFC0, 0x7FC1, 0xFF81, 0x7F81]),
}


def two_sided_inputs(sizes, rng):
    """TopKSample's inputs (`top_k_inputs`: NaN, Inf, ties, zeros,
    subnormals, outliers, heavy tails) and the two-sided cases: one sign
    only, few positive entries (k above their number), and signs with
    zeros of both signs, subnormals and NaN patterns of both signs."""
    yield from top_k_inputs(sizes, rng)
    small = [s for s in sizes.small if s > 0]
    if not small:
        return
    n = max([s for s in small if s < 5000] or small)
    ks = [1, max(1, n // 50), n // 10, n // 2 + 1, n]
    x = np.abs(rng.standard_normal(n)).astype(np.float32) + np.float32(0.5)
    yield f"all positive {n=}", x, DTYPES, ks
    yield f"all negative {n=}", -x, DTYPES, ks
    x = -np.abs(rng.standard_normal(n)).astype(np.float32)
    few = rng.random(n) < 0.05
    x[few] = -x[few]
    yield f"5% positive {n=}", x, DTYPES, ks
    x = rng.standard_normal(n).astype(np.float32)
    x[::7] = 0.0
    x[3::7] = -0.0
    x[5::11] = np.float32(2.0**-140)
    x[6::11] = np.float32(-(2.0**-140))
    x[2::13] = np.float32(3 * 2.0**-24)  # a float16 subnormal
    x[4::13] = np.float32(-3 * 2.0**-24)
    x[9::17] = np.inf
    x[10::17] = -np.inf
    yield f"signs, zeros, subnormals and infinities {n=}", x, DTYPES, ks


def check_top_k_two_sided(h: Harness, sizes, setup, report: Tally) -> None:
    """TopKTwoSided against np_select_two_sided: both sides' indices and
    values bit for bit (x's, and x with its sign bit flipped on the
    negative side, NaN payloads included), on `two_sided_inputs` with NaN
    patterns of both signs written into every input of more than 100
    elements but the one-sign ones, k = 0, 1, n/1000, n/2 and n by default;
    every other pair of cases with the host thread flushing denormals.
    Under the emulation the launchers must wait for the device and copy to
    the host once each (the two sizes) when n and k are positive, and
    never otherwise."""
    rng = np.random.default_rng(3)
    case = 0
    for name, x32, dtypes, k_values in two_sided_inputs(sizes, rng):
        n = x32.size
        if report.skip(n):
            continue
        for dtype in dtypes:
            x = to_dtype(x32, dtype)
            if n > 100 and not name.startswith("all "):  # one sign only
                ints, patterns = NAN_BITS[dtype]
                at = rng.choice(n, len(patterns), replace=False)
                x.view(ints)[at] = np.array(patterns, ints)
            x_32 = as_float32(x, dtype)
            ks = k_values or {0, 1, max(1, n // 1000), n // 2, n}
            for k in sorted(k for k in ks if k <= n):
                where = setup(case)
                flush = h.can_flush and case % 4 >= 2
                case += 1
                pv, pi, nv, ni = h.top_k_two_sided(x, dtype, k, flush)
                pos, neg = np_select_two_sided(x_32, k)
                ok = (
                    np.array_equal(pi, pos)
                    and np.array_equal(ni, neg)
                    and same_bits(pv, x[pos])
                    and same_bits(nv, np_flip_sign(x[neg]))
                )
                traffic = ""
                if h.emulated:
                    want = (1, 1, 0) if n > 0 and k > 0 else (0, 0, 0)
                    ok = ok and h.top_k_traffic == want
                    traffic = f" host traffic {h.top_k_traffic}"
                report(
                    ok,
                    f"top_k_two_sided {name} {k=} {dtype} sizes "
                    f"{pos.size}, {neg.size} flush_denormals={flush}"
                    f"{traffic}{where}",
                )


def check_bits(h: Harness, sizes, setup, report: Tally) -> None:
    rng = np.random.default_rng(2)
    for case, (n, _) in enumerate(sizes.each()):
        if report.skip(n):
            continue
        where = setup(case)
        p = case % 4 + 1  # rows: 1..4, even counts give vote ties
        masks = rng.random((p, n)) < 0.5
        words = np.zeros((p, (n + 31) // 32), np.int32)
        for row in range(p):
            pad = np.zeros(words.shape[1] * 32, bool)
            pad[:n] = masks[row]
            words[row] = np.packbits(pad, bitorder="little").view("<i4")
        if n > 0:
            report(
                np.array_equal(h.pack_bits(masks[0]), words[0]),
                f"pack_bits {n=}{where}",
            )
            report(
                np.array_equal(h.unpack_bits(words, n), masks),
                f"unpack_bits {p=} {n=}{where}",
            )
        for dtype in DTYPES:
            scales32 = rng.standard_normal(p).astype(np.float32)
            if case % 2:  # subnormal scales and partial sums: flushed
                scales32 *= np.float32(2.0**-126)
            scales = to_dtype(scales32, dtype)
            acc = np.zeros(n, np.float32)
            for row in range(p):  # the kernel's order, in float32
                s = as_float32(scales[row : row + 1], dtype)[0]
                s = flush_subnormals(np.where(masks[row], s, -s))
                acc = flush_subnormals(acc + s)
            got = h.unpack_bits_reduce(words, n, scales, dtype, vote=False)
            want = to_dtype(acc, dtype)
            if dtype == "float16":
                got = got.view(np.float16)
            report(same_bits(got, want), f"unpack_bits_sum {p=} {n=} {dtype}")
            votes = masks.sum(axis=0)
            vote = np.where(2 * votes >= p, 1.0, -1.0).astype(np.float32)
            got = h.unpack_bits_reduce(words, n, None, dtype, vote=True)
            want = to_dtype(vote, dtype)
            if dtype == "float16":
                got = got.view(np.float16)
            report(same_bits(got, want), f"unpack_bits_vote {p=} {n=} {dtype}")


def scatter_matches(got, values, indices, n: int, dtype: str) -> bool:
    """Whether the kernel's output has the oracle's bits (any NaN where the
    oracle's is NaN: the CPU kernel and the device round NaN differently)."""
    want = np_scatter_add_sum(values, indices, n, dtype)
    nan = np.isnan(as_float32(want, dtype))
    return bool(
        same_bits(got[~nan], want[~nan])
        and np.all(np.isnan(as_float32(got[nan], dtype)))
    )


def gathered_payloads(n: int, workers: int, rng, k: int | None = None):
    """(float32 values, int32 indices) of `workers` top-k style payloads
    concatenated in worker order: each part k (default n/4) distinct
    sorted indices out of 2k (every element sent by several workers), one
    part shuffled with its first index sent twice, magnitudes from 2^-20 to
    2^20 so that the order of the additions shows in the sums; and element
    0 gets 2^24, 1 and -2^24 from the first three workers (0 in that order,
    1 after 2^24 - 2^24)."""
    k = max(1, n // 4) if k is None else k
    parts, values = [], []
    for w in range(workers):
        part = np.sort(rng.choice(min(n, 2 * k), min(n, k), replace=False))
        if w == 1:
            part = np.append(rng.permutation(part), part[0])
        v = rng.standard_normal(part.size) * 2.0 ** rng.integers(
            -20, 21, part.size
        )
        if w < 3:
            part = np.append(part, 0)
            v = np.append(v, (2.0**24, 1.0, -(2.0**24))[w])
        parts.append(part)
        values.append(v)
    idx = np.concatenate(parts).astype(np.int32)
    return np.concatenate(values).astype(np.float32), idx


def scatter_inputs(sizes, rng):
    """(description, float32 values, int32 indices, n, expected first bad
    position or -1); the large sizes get all-gathered payloads of 1 % per
    worker (as top-k sends) and one out-of-range index."""
    i32 = np.iinfo(np.int32)
    for case, (n, large) in enumerate(sizes.each()):
        if large:
            v, idx = gathered_payloads(n, 4, rng, k=n // 100)
            yield f"4 workers 1 % {n=} m={idx.size}", v, idx, n, -1
            bad = idx.size // 2
            idx = idx.copy()
            idx[bad] = n
            yield f"bad index {n=} m={idx.size} at {bad}", v, idx, n, bad
            continue
        # Duplicates (2 values per element on average, some none), the
        # first value at element 0 and the last at element n - 1.
        m = 2 * n + 1 if n > 0 else 0
        idx = rng.integers(0, max(n, 1), m).astype(np.int32)
        if n > 0:
            idx[0], idx[-1] = 0, n - 1
        v = rng.standard_normal(m) * 2.0 ** rng.integers(-8, 8, m)
        yield f"random {n=} {m=}", v.astype(np.float32), idx, n, -1
        if n > 0:
            yield f"empty values {n=}", np.zeros(0, np.float32), idx[:0], n, -1
            # Many values on a few elements: 1 plus a thousand 2^-12 at
            # n - 1 (alone there for n > 3) sum to 1.244, which float16
            # rounds once (rounding each addition it stays at 1).
            m = 1001 + n
            idx = rng.integers(0, min(n, 3), m).astype(np.int32)
            v = rng.standard_normal(m).astype(np.float32)
            idx[:1001], v[:1001] = n - 1, 2.0**-12
            v[0] = 1
            yield f"duplicates {n=} {m=}", v, idx, n, -1
            v, idx = gathered_payloads(n, 3 + case % 3, rng)
            yield f"{3 + case % 3} workers {n=} m={idx.size}", v, idx, n, -1
        # An index outside [0, n): the kernel reports the first one.
        m = max(n // 2, 3)
        idx = rng.integers(0, max(n, 1), m).astype(np.int32)
        v = rng.standard_normal(m).astype(np.float32)
        if n == 0:
            bad = 0
        elif case % 3 == 0:
            bad = m - 1
            idx[bad] = n  # only the last one
        elif case % 3 == 1:
            bad = 0
            idx[[0, m - 1]] = [-1, n]
        else:
            bad = m // 2
            idx[bad], idx[-1] = i32.min, i32.max
        yield f"bad index {n=} {m=} at {bad}", v, idx, n, bad
    # Infinities, NaN, overflow of the float32 sum (or only of the float16
    # rounding), float32 and bfloat16 subnormals, cancellation.
    big, tiny = 3e38, 2.0**-140
    groups = [
        [np.inf, 1], [np.inf, -np.inf], [np.nan, 2], [-np.inf, -5],
        [big, big], [-big, -big], [60000, 60000], [tiny, tiny, tiny],
        [1, 2.0**-30, -1], [2.0**-126, -(2.0**-127)],
    ]  # fmt: skip
    v = np.array([x for g in groups for x in g], np.float32)
    idx = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    perm = rng.permutation(v.size)
    n = len(groups) + 1
    yield f"special {n=}", v[perm], idx[perm].astype(np.int32), n, -1


def check_scatter_add_sum(h: Harness, sizes, setup, report: Tally) -> None:
    rng = np.random.default_rng(4)
    case = 0
    for name, v32, idx, n, bad in scatter_inputs(sizes, rng):
        if report.skip(max(n, idx.size)):
            continue
        for dtype in DTYPES:
            where = setup(case)
            case += 1
            v = to_dtype(v32, dtype)
            got, pos, index = h.scatter_add_sum(v, idx, n, dtype)
            if bad >= 0:
                ok = pos == bad and index == idx[bad]
            else:
                ok = pos == -1 and scatter_matches(got, v, idx, n, dtype)
            report(
                ok,
                f"scatter_add_sum {name} {dtype} (bad position {pos}){where}",
            )


# FusedUpdate: guard words around each tensor's buffers, and the tensors of
# one launch (kTensorsPerLaunch of fused_update_kernels.cu.cc), which gives
# the number of launches a table takes.
FUSED_UPDATE_GUARD = 8
FUSED_UPDATE_CHUNK = 48
WEIGHT_DECAY = 0.004


def keras_scalars(
    rule: str, decay: bool, lr: float, step: int = 1, momentum: float = 0.9
) -> list:
    """The scalars of `rule` as Keras computes them in float32 (Adam's
    alpha at `step`, 1-based, with Keras's default betas and epsilon),
    then weight_decay and the learning rate when `decay`."""
    f32 = np.float32
    lr32 = f32(lr)
    if rule == "sgd":
        c = [lr32]
    elif rule == "adam":
        beta_1_power = np.power(f32(0.9), f32(step))
        beta_2_power = np.power(f32(0.999), f32(step))
        alpha = lr32 * np.sqrt(f32(1) - beta_2_power) / (f32(1) - beta_1_power)
        c = [alpha, f32(1 - 0.9), f32(1 - 0.999), f32(1e-7)]
    else:
        c = [lr32, f32(momentum)]
    return c + ([f32(WEIGHT_DECAY), lr32] if decay else [])


def fused_update_scalar_sets(rule: str, decay: bool):
    """(description, scalars): SGD's learning rates 0.1 and 1e-3 with
    momentum 0.9, and 3e-3 with momentum 0.99 (whose products can land in
    the x86 band: x86_band_operand); Adam's alpha (learning rate 1e-3) at
    steps 1 and 1000."""
    if rule == "adam":
        for step in (1, 1000):
            yield f"step {step}", keras_scalars(rule, decay, 1e-3, step)
    else:
        for lr, mu in ((0.1, 0.9), (1e-3, 0.9), (3e-3, 0.99)):
            what = f"lr {lr}" + ("" if rule == "sgd" else f" momentum {mu}")
            yield what, keras_scalars(rule, decay, lr, momentum=mu)


def training_tensor(rng, rule: str, n: int, scalars) -> tuple:
    """(w, m, v, g) of training's scales: gradients ~1e-3, weights ~0.1,
    the slots after three earlier steps of the rule (so v >= 0); None for
    the slots the rule does not have."""
    f32 = np.float32
    w = (rng.standard_normal(n) * 0.1).astype(f32)
    m = v = None
    if rule != "sgd":
        m = np.zeros(n, f32)
        v = np.zeros(n, f32) if rule == "adam" else None
        for _ in range(3):
            g = (rng.standard_normal(n) * 1e-3).astype(f32)
            if rule == "adam":
                m = m + (g - m) * scalars[1]
                v = v + (g * g - v) * scalars[2]
            else:
                m = m * scalars[1] - g * scalars[0]
    g = (rng.standard_normal(n) * 1e-3).astype(f32)
    return w, m, v, g


def first_float_near(pred, x0: float) -> np.float32 | None:
    """The first of the thousand or so float32 values around x0, upwards,
    for which pred holds; None if none."""
    x, end = np.float32(x0 * (1 - 2.0**-15)), x0 * (1 + 2.0**-15)
    while x <= end:
        if pred(x):
            return x
        x = np.nextafter(x, np.float32(np.inf))
    return None


def x86_band_operand(exact_of, x0: float) -> np.float32 | None:
    """A float32 x near x0 for which exact_of(x), the exact value of an
    operation the update does with x, lies in [2^-126 - 2^-150, 2^-126 -
    2^-151): rounded into the subnormal range (numpy, the device) it is
    2^-126, rounded with an unbounded exponent (x86, whose FTZ then makes
    it zero) it is tiny. None when no x does: x * c can land there only if
    some integer lies in [(2^47 - 2^23) / C, (2^47 - 2^22) / C), C the
    24-bit significand of c, which holds for none of 0.1f, 0.9f, 1e-3f and
    0.004f; x / y only if y is a power of two."""
    low, high = 2.0**-126 - 2.0**-150, 2.0**-126 - 2.0**-151
    return first_float_near(lambda x: low <= abs(exact_of(x)) < high, x0)


def fused_update_specials(rule: str, c) -> list[tuple]:
    """(description, {slot: value}) of special elements: NaN, infinities,
    signed zeros, subnormal operands, products that underflow into the
    subnormal range (flushed), overflow, and operations whose exact result
    lies just below 2^-126 where x86 (FTZ) gives zero but rounding into
    the subnormal range gives 2^-126. Slots not named keep their values."""
    f32 = np.float32
    sub = f32(1e-39)  # subnormal
    specials = [
        ("nan gradient", {"g": np.nan}),
        ("inf gradient", {"g": np.inf}),
        ("-inf gradient", {"g": -np.inf}),
        ("nan weight", {"w": np.nan}),
        ("inf weight", {"w": np.inf}),
        ("zeros", {"w": 0.0, "m": 0.0, "v": 0.0, "g": 0.0}),
        ("negative zeros", {"w": -0.0, "m": -0.0, "v": 0.0, "g": -0.0}),
        ("subnormal weight", {"w": sub}),
        ("subnormal gradient", {"g": -3 * sub, "w": 0.0}),
        ("subnormal slots", {"m": -sub, "v": 2 * sub}),
        # g * lr (and for Adam g * c1) underflows: flushed before w - it.
        ("product underflows", {"g": f32(1e-37), "w": 0.0, "m": 0.0}),
        # g * g underflows (Adam's v); the rest of them are normal.
        ("square underflows", {"g": f32(1e-20), "v": 0.0, "m": 0.0}),
        # w * weight_decay underflows.
        ("decay underflows", {"w": f32(1e-36)}),
        # m * momentum underflows.
        ("momentum underflows", {"m": f32(1.25e-38), "w": 0.0}),
        ("overflow", {"w": f32(3.4e38), "g": f32(-3.4e38), "m": 0.0}),
        ("huge gradient", {"g": f32(1e20)}),
    ]
    return specials + x86_band_specials(rule, c)


def x86_band_specials(rule: str, c) -> list[tuple]:
    """The specials (as fused_update_specials's) whose product or quotient
    lands in the x86 band (x86_band_operand), for the operations of the
    rule where these scalars let one land, each arranged so that the
    flushed result shows in the outputs. (Weight decay's w * 0.004f * lr
    reaches no float32 that lands there with the learning rates here.)"""
    f32, f64, f = np.float32, np.float64, FtzFloat
    found = []

    def add(name, exact_of, x0, slot, values):
        """The special with x86_band_operand's x in `slot`; a value "g"
        in `values` stands for that x too."""
        x = x86_band_operand(exact_of, x0)
        if x is not None:
            values = {
                k: x if isinstance(v, str) else v for k, v in values.items()
            }
            found.append((f"x86 band: {name}", {slot: x, **values}))

    if rule == "adam":
        alpha, c2 = f32(c[0]), f32(c[2])
        # m * alpha, with m = g (m stays) and v = 0 (the denominator is
        # eps). Adam's other products are by 1 - beta_1, 1 - beta_2 or a
        # square, none of which can land in the band.
        add(
            "m * alpha", lambda x: f64(x) * f64(alpha), 2.0**-126 / alpha,
            "g", {"m": "g", "v": 0.0},
        )  # fmt: skip

        # (m * alpha) / (sqrt(v) + eps) with a denominator of exactly 2
        # (v near 4) and m * alpha = 2^-125 - 2^-149.
        def denominator(v):
            v = f.add(v, f.mul(f.sub(f.mul(g, g), v), c2))
            return f.add(f.sqrt(v), f32(c[3]))

        g = f32(2.0**-125 / float(alpha))
        v = first_float_near(lambda v: denominator(v) == 2, 4 / (1 - c2))
        if v is not None:
            den = f64(denominator(v))
            add(
                "quotient", lambda x: f64(f.mul(x, alpha)) / den,
                2.0**-125 / alpha, "g", {"m": "g", "v": v},
            )  # fmt: skip
    else:
        # g * lr (w = 0, m = 0: nothing else moves), m * momentum.
        lr = f32(c[0])
        add(
            "g * lr", lambda x: f64(x) * f64(lr), 2.0**-126 / lr, "g",
            {"w": 0.0, "m": 0.0},
        )  # fmt: skip
        if rule != "sgd":
            mu = f32(c[1])
            add(
                "m * momentum", lambda x: f64(x) * f64(mu), 2.0**-126 / mu,
                "m", {"g": 0.0, "w": 0.0},
            )  # fmt: skip
    return found


def with_specials(tensor: tuple, specials, at_end: bool) -> tuple:
    """`tensor` with the specials in its first (or last) elements."""
    w, m, v, g = (None if a is None else a.copy() for a in tensor)
    n = w.size
    for i, (_, values) in enumerate(specials):
        j = n - len(specials) + i if at_end else i
        for slot, a in (("w", w), ("m", m), ("v", v), ("g", g)):
            if a is not None and slot in values:
                a[j] = values[slot]
    return w, m, v, g


def fused_update_tables(sizes, rng, scale: int):
    """(description, lengths, whether only the cases of training run: one
    set of scalars, no special elements, no weight decay for a large
    size): no tensor, one, three, 100 of mixed sizes (three launches: each
    check size once, then sizes up to 4097), ResNet-50's 161 tensors
    (above 4096 elements divided by `scale`), and each large size with two
    small tensors."""
    if sizes.small:
        biggest = max(sizes.small)
        yield "no tensor", [], False
        yield f"one tensor n={biggest}", [biggest], False
        yield "3 tensors", [257, 0, biggest], False
        mixed = [0, 1, 31, 257, *sizes.small]
        fill = [n for n in mixed if n <= 4097]
        lengths = mixed + [fill[j % len(fill)] for j in range(100 - len(mixed))]
        yield "100 tensors", [int(n) for n in rng.permutation(lengths)], False
        resnet = [
            n if n <= 4096 else max(4097, n // scale) for n in resnet50_sizes()
        ]
        yield f"ResNet-50 161 tensors /{scale}", resnet, True
    for n in sizes.large:
        yield f"large n={n}", [n, 1000, 0], True


def fused_update_launches(lengths) -> int:
    """Launches of a table: one per chunk holding a non-empty tensor."""
    chunks = range(0, len(lengths), FUSED_UPDATE_CHUNK)
    return sum(any(lengths[c : c + FUSED_UPDATE_CHUNK]) for c in chunks)


def fused_update_matches(got, want) -> bool:
    """Bits equal; where the oracle has a NaN, any NaN (the CPU and the
    device make NaNs of other bits)."""
    nan = np.isnan(want)
    return bool(same_bits(got[~nan], want[~nan]) and np.all(np.isnan(got[nan])))


def check_fused_update(h: Harness, sizes, setup, report: Tally) -> None:
    """FusedUpdate against np_fused_update, bit for bit: every rule with
    and without weight decay, Keras's scalars, tables of 0, 1, 3, 100 and
    ResNet-50's 161 tensors, training-like values and special ones (every
    other case with the host thread flushing denormals; under the
    emulation the device code then runs with x86's FTZ and DAZ, the CPU
    threads' arithmetic, which the oracle must match too). Gradients and
    the words around every buffer must be left alone; under the emulation
    the launcher may neither wait nor copy to or from the host, and
    launches once per chunk. Then invalid tables and CopyBuffer."""
    rng = np.random.default_rng(8)
    # ResNet-50's larger tensors scaled down: numpy takes 15 s per update
    # of all 25.5 M elements; the large sizes cover tensors that size.
    scale = 64 if h.emulated else 8
    tables = list(fused_update_tables(sizes, rng, scale))
    case = 0
    for rule in FUSED_UPDATE_RULES:
        for decay in (False, True):
            sets = [
                (what, c, fused_update_specials(rule, c))
                for what, c in fused_update_scalar_sets(rule, decay)
            ]
            for name, lengths, training_only in tables:
                if report.skip(max(lengths, default=0)) or (
                    decay and name.startswith("large")
                ):
                    continue
                for what, scalars, specials in (
                    sets[-1:] if training_only else sets
                ):
                    where = setup(case)
                    flush = h.can_flush and case % 2 == 1
                    case += 1
                    tensors = []
                    for j, n in enumerate(lengths):
                        t = training_tensor(rng, rule, n, scalars)
                        if (
                            not training_only
                            and n >= len(specials)
                            and (j % 2 == 0)
                        ):
                            t = with_specials(t, specials, j % 4 == 2)
                        tensors.append(t)
                    err, out, intact = h.fused_update(
                        rule, decay, scalars, tensors, flush
                    )
                    bad = []
                    for j, (w, m, v, g) in enumerate(tensors):
                        want = np_fused_update(rule, decay, scalars, w, m, v, g)
                        for slot in range(3):
                            if want[slot] is None:
                                continue
                            if not fused_update_matches(
                                out[j][slot], want[slot]
                            ):
                                bad.append((j, "wmv"[slot]))
                    ok = err == 0 and intact and not bad
                    traffic = ""
                    if h.emulated:
                        expected = (0, 0, 0, fused_update_launches(lengths))
                        ok = ok and h.fused_update_traffic == expected
                        traffic = f" host traffic {h.fused_update_traffic}"
                    report(
                        ok,
                        f"fused_update {rule} weight_decay={decay} {what} "
                        f"{name} flush_denormals={flush} error {err} "
                        f"guards intact {intact} bad (tensor, slot) "
                        f"{bad[:6]}{traffic}{where}",
                    )
    # Invalid tables: refused (cudaErrorInvalidValue) before any launch.
    c = keras_scalars("sgd", False, 0.1)
    one = training_tensor(rng, "sgd", 5, c)
    for what, kwargs in (
        ("count -1", {"count": -1}),
        ("size -1 after a valid tensor", {"sizes": [5, -1]}),
        ("rule 7", {"rule": 7}),
    ):
        setup(case)
        case += 1
        tensors = [one, one] if "sizes" in kwargs else [one]
        args = {"rule": "sgd", **kwargs}
        err, out, intact = h.fused_update(
            args.pop("rule"), False, c, tensors, **args
        )
        ok = err == 1 and intact and same_bits(out[0][0], one[0])
        if h.emulated:
            ok = ok and h.fused_update_traffic == (0, 0, 0, 0)
        report(ok, f"fused_update invalid: {what}: error {err}")
    for n in (0, 1, *sizes.small[-1:]):
        setup(case)
        case += 1
        x = rng.standard_normal(n).astype(np.float32)
        report(same_bits(h.copy_buffer(x), x), f"copy_buffer {n=}")


def check_conversions(h: Harness, report: Tally) -> None:
    """The emulation's float16/bfloat16 conversions against numpy."""
    rng = np.random.default_rng(3)
    halves = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    # Random float32 patterns, and the neighbours of the float16 rounding
    # edges: overflow to inf, smallest normal, half of the smallest
    # subnormal and the subnormal range, largest finite float.
    edges = np.array([0x477FF000, 0x38800000, 0x33000000, 0x33800000])
    near = (np.arange(-64, 64)[:, None] + np.append(edges, 0x7F7FFFFF)).ravel()
    patterns = rng.integers(0, 2**32, 2**20, dtype=np.uint64)
    bits = np.concatenate([patterns, near]).astype(np.uint32)
    arbitrary = bits.view(np.float32)
    inputs = {
        "float16": np.concatenate([halves.view(np.float16), arbitrary]),
        "bfloat16": np.concatenate([from_bfloat16(halves), arbitrary]),
    }
    for code, dtype in ((1, "float16"), (2, "bfloat16")):
        x = np.ascontiguousarray(inputs[dtype], np.float32)
        out_bits = np.empty(x.size, np.uint16)
        back = np.empty(x.size, np.float32)
        err = h.lib.tfgc_emulation_convert(
            code, x.ctypes.data, x.size, out_bits.ctypes.data, back.ctypes.data
        )
        h.check(err, "emulation_convert")
        want = to_dtype(x, dtype)
        got = out_bits.view(want.dtype)
        nan = np.isnan(x)
        ok = (
            same_bits(got[~nan], want[~nan])
            and np.all(out_bits[nan] == 0x7FFF)
            and same_bits(back, as_float32(got, dtype))
        )
        report(ok, f"emulated {dtype} conversions")


CHECKS = {
    "top_k_sample": check_top_k_sample,
    "top_k_segments": check_top_k_segments,
    "top_k_ratio": check_top_k_ratio,
    "top_k_two_sided": check_top_k_two_sided,
    "add_residual": check_add_residual,
    "new_residual": check_new_residual,
    "bits": check_bits,
    "scatter_add_sum": check_scatter_add_sum,
    "golomb": check_golomb,
    "fused_update": check_fused_update,
}


def check_correctness(
    h: Harness,
    sizes: Sizes,
    setup: Callable[[int], str] = lambda case: "",
    verbose: bool = False,
    checks: list[str] | None = None,
    max_case_size: int | None = None,
) -> dict[str, CheckResult]:
    """Runs the `checks` (names of CHECKS; all by default) and returns each
    one's counts; `setup(case)` may reconfigure the emulated device before
    a case and returns a note for the messages."""
    results = {}
    for name in checks or CHECKS:
        report = Tally(verbose, max_case_size)
        CHECKS[name](h, sizes, setup, report)
        results[name] = report.result()
        print(f"{name}: {describe(results[name])}", flush=True)
    failures = sum(r.failures for r in results.values())
    print(f"correctness: {failures} failures")
    return results


def describe(result: CheckResult) -> str:
    skipped = result.skipped_inputs
    return f"{result.cases} cases, {result.failures} failures" + (
        f", {skipped} inputs over --max-case-size skipped" if skipped else ""
    )


def check_emulation(
    h: Harness,
    sizes: Sizes,
    verbose: bool = False,
    checks: list[str] | None = None,
    max_case_size: int | None = None,
) -> dict[str, CheckResult]:
    """check_correctness with the cases spread over EMULATED_DEVICES, after
    the emulation's own conversions ("conversions")."""

    def setup(case: int) -> str:
        sms, grid, schedule, seed = EMULATED_DEVICES[
            case % len(EMULATED_DEVICES)
        ]
        h.configure(sms, grid, schedule, seed)
        return f" [emulated {sms=} max_grid={grid} {schedule} {seed=}]"

    report = Tally(verbose)
    check_conversions(h, report)
    print(f"conversions: {report.failures} failures")
    return {"conversions": report.result()} | check_correctness(
        h, sizes, setup, verbose, checks, max_case_size
    )


def parse_sizes(text: str) -> list[int]:
    return [int(float(s)) for s in text.split(",") if s]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument(
        "--emulate",
        action="store_true",
        help="build with a C++ compiler and run the checks on the CPU "
        "emulation of CUDA (no GPU needed)",
    )
    parser.add_argument(
        "--library", help="path of the library to build and load"
    )
    parser.add_argument(
        "--arch",
        help="nvcc target, e.g. sm_90: machine code for it and its PTX "
        "(default: the targets of the real build)",
    )
    parser.add_argument(
        "--check-sizes",
        help="sizes of the correctness checks (n,n,...; may be empty)",
    )
    parser.add_argument(
        "--large-sizes",
        default="",
        help="sizes checked with the cases of training only (25e6,1e8)",
    )
    parser.add_argument(
        "--checks",
        help=f"correctness checks to run (comma-separated; default all: "
        f"{','.join(CHECKS)})",
    )
    parser.add_argument(
        "--max-case-size",
        type=int,
        help="skip (and count) inputs of more elements than this",
    )
    parser.add_argument(
        "--results", help="write each check's counts to this JSON file"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    checks = args.checks.split(",") if args.checks else None
    unknown = sorted(set(checks or ()) - set(CHECKS))
    if unknown:
        parser.error(f"unknown checks {unknown}; valid: {','.join(CHECKS)}")
    lib = args.library or (EMULATION_LIB if args.emulate else LIB)
    if not args.no_build or not os.path.exists(lib):
        if args.emulate:
            built = build_emulation(lib, args.verbose)
        else:
            targets = ops_build.gencodes([args.arch]) if args.arch else None
            built = build_library(lib, args.verbose, targets)
        print(f"built {built}", flush=True)
    if args.build_only:
        return 0
    h = Harness(lib)
    if args.check_sizes is not None:
        small = parse_sizes(args.check_sizes)
    else:
        small = EMULATION_SIZES if h.emulated else GPU_SIZES
    sizes = Sizes(tuple(small), tuple(parse_sizes(args.large_sizes)))
    if h.emulated:
        results = check_emulation(
            h, sizes, args.verbose, checks, args.max_case_size
        )
    elif h.devices() == 0:
        print("no CUDA device is visible; built only")
        return 2
    else:
        results = check_correctness(
            h, sizes, verbose=args.verbose, checks=checks,
            max_case_size=args.max_case_size,
        )  # fmt: skip
    if args.results:
        with open(args.results, "w") as f:
            json.dump(
                {
                    "emulated": h.emulated,
                    "sizes": sizes._asdict(),
                    "checks": {k: r._asdict() for k, r in results.items()},
                },
                f,
                indent=1,
            )
    return 1 if any(r.failures for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
