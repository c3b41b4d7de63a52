"""Compiles tfgc's custom ops into `tfgc/ops/_tfgc_ops.so`.

Usage (from the repository root):

    python -m custom_ops.build            # CPU, plus CUDA when possible
    python -m custom_ops.build --cuda=off
    python -m custom_ops.build --check-cuda  # nvcc-compile the .cu.cc only

The compile and link flags come from the TensorFlow importable in this
environment (`tf.sysconfig.get_compile_flags()` / `get_link_flags()`), so the
library matches the TensorFlow it will be loaded into. `.cu.cc` files are
compiled with nvcc when nvcc and the CUDA headers are present and that
TensorFlow is a CUDA build (tensorflow-cpu is not: then CPU only). setup.py
calls `build()`; a failure there leaves the pure-TF fallback.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CC_DIR = os.path.join(ROOT, "custom_ops", "cc")
DEFAULT_OUTPUT = os.path.join(ROOT, "tfgc", "ops", "_tfgc_ops.so")
OPT_FLAGS = ["-O3", "-fPIC", "-DNDEBUG"]


class BuildError(RuntimeError):
    """Raised when the custom ops cannot be built."""


def sources() -> tuple[list[str], list[str]]:
    """Returns the (C++, CUDA) source files of the ops."""
    ops = sorted(glob.glob(os.path.join(CC_DIR, "ops", "*.cc")))
    kernels = sorted(glob.glob(os.path.join(CC_DIR, "kernels", "*.cc")))
    cuda = [f for f in kernels if f.endswith(".cu.cc")]
    cpp = ops + [f for f in kernels if not f.endswith(".cu.cc")]
    return cpp, cuda


def _tf_flags() -> tuple[list[str], list[str], bool]:
    try:
        import tensorflow as tf  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise BuildError(
            "TensorFlow is not importable at build time, so the custom ops "
            "cannot be compiled against it. Install tensorflow-cpu or "
            "tensorflow first and build with "
            "`pip install --no-build-isolation .` (or run "
            f"`python -m custom_ops.build`). Import error: {e}"
        ) from e
    info = tf.sysconfig.get_build_info()
    return (
        list(tf.sysconfig.get_compile_flags()),
        list(tf.sysconfig.get_link_flags()),
        bool(info.get("is_cuda_build", False)),
    )


def find_cuda() -> tuple[str, str] | None:
    """Returns (nvcc, CUDA home) when nvcc and the CUDA headers exist."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    if shutil.which("nvcc"):
        candidates.append(shutil.which("nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for nvcc in candidates:
        if not os.path.isfile(nvcc):
            continue
        real = os.path.realpath(nvcc)
        homes = [os.path.dirname(os.path.dirname(real))]
        homes += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
        for home in homes:
            if os.path.isfile(os.path.join(home, "include", "cuda_runtime.h")):
                return nvcc, home
    return None


def _run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}"
        )


def _compile_all(jobs: list[list[str]], verbose: bool) -> None:
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(_run, j, verbose) for j in jobs]:
            future.result()


def nvcc_command(
    nvcc: str, src: str, obj: str, extra: list[str] | None = None
) -> list[str]:
    """The nvcc command compiling one TF-free `.cu.cc` to an object."""
    return [
        nvcc,
        "-x",
        "cu",
        "-c",
        src,
        "-o",
        obj,
        "-std=c++17",
        "-O3",
        "-DNDEBUG",
        "-Xcompiler",
        "-fPIC",
        f"-I{ROOT}",
        # Portable PTX plus SASS for common data-centre GPUs.
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
        *(extra or []),
    ]


def check_cuda(verbose: bool = False) -> list[str]:
    """Compiles every `.cu.cc` with nvcc alone (no TF); returns them."""
    found = find_cuda()
    if found is None:
        raise BuildError("nvcc and the CUDA headers were not found")
    nvcc, _ = found
    _, cuda = sources()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            nvcc_command(nvcc, s, os.path.join(tmp, f"{i}.o"))
            for i, s in enumerate(cuda)
        ]
        _compile_all(jobs, verbose)
    return cuda


def build(
    output: str = DEFAULT_OUTPUT, cuda: str = "auto", verbose: bool = False
) -> str:
    """Compiles the ops into `output`; returns its path.

    Args:
        output: path of the shared library to write.
        cuda: "auto" (CUDA when nvcc, headers and a CUDA TensorFlow are
            present), "on" (fail without them) or "off".
        verbose: print the commands.

    Raises:
        BuildError: TensorFlow is not importable, no compiler, or a compile
            or link step failed.
    """
    if cuda not in ("auto", "on", "off"):
        raise ValueError(
            f"`cuda` must be auto, on or off. Received: cuda={cuda}"
        )
    cflags, lflags, tf_cuda = _tf_flags()
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise BuildError("no C++ compiler (g++ or $CXX) was found")
    cpp, cu = sources()
    found = find_cuda() if cuda != "off" else None
    use_cuda = bool(found) and tf_cuda and cuda != "off"
    if cuda == "on" and not use_cuda:
        raise BuildError(
            "CUDA build requested but "
            + (
                "nvcc or the CUDA headers are missing"
                if not found
                else "the installed TensorFlow is not a CUDA build"
            )
        )
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    defines = []
    link_extra = []
    if use_cuda:
        nvcc, home = found
        defines = ["-DGOOGLE_CUDA=1", f"-I{os.path.join(home, 'include')}"]
        link_extra = [
            f"-L{os.path.join(home, 'lib64')}",
            "-lcudart",
        ]
    with tempfile.TemporaryDirectory() as tmp:
        jobs, objs = [], []
        for i, src in enumerate(cpp):
            obj = os.path.join(tmp, f"cc{i}.o")
            objs.append(obj)
            jobs.append(
                [
                    cxx,
                    "-c",
                    src,
                    "-o",
                    obj,
                    *OPT_FLAGS,
                    f"-I{ROOT}",
                    *cflags,
                    *defines,
                ]
            )
        if use_cuda:
            for i, src in enumerate(cu):
                obj = os.path.join(tmp, f"cu{i}.o")
                objs.append(obj)
                jobs.append(nvcc_command(nvcc, src, obj))
        _compile_all(jobs, verbose)
        tmp_out = os.path.join(tmp, "_tfgc_ops.so")
        _run(
            [cxx, "-shared", *objs, "-o", tmp_out, *lflags, *link_extra],
            verbose,
        )
        # Replace atomically so a process that loaded the old file keeps it.
        staged = output + ".tmp"
        shutil.copyfile(tmp_out, staged)
        os.replace(staged, output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    parser.add_argument("--cuda", choices=["auto", "on", "off"], default="auto")
    parser.add_argument(
        "--check-cuda",
        action="store_true",
        help="only nvcc-compile the CUDA kernels (no TensorFlow needed)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.check_cuda:
            done = check_cuda(args.verbose)
            print(f"nvcc compiled {len(done)} CUDA sources")
            return 0
        print(f"built {build(args.output, args.cuda, args.verbose)}")
    except BuildError as e:
        print(f"custom_ops.build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
