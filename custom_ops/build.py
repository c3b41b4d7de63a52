"""Compiles tfgc's custom ops into `tfgc/ops/_tfgc_ops.so`.

Usage (from the repository root):

    python -m custom_ops.build            # CPU, plus CUDA when possible
    python -m custom_ops.build --cuda=off
    python -m custom_ops.build --cuda=on  # fail unless the CUDA kernels build
    python -m custom_ops.build --check-glue  # compile the GOOGLE_CUDA glue
    python -m custom_ops.build --check-cuda  # nvcc-compile the .cu.cc only
    python -m custom_ops.build --check-glue --check-cuda  # both, and check
                                          # that they link to each other

The compile and link flags come from the TensorFlow importable in this
environment (`tf.sysconfig.get_compile_flags()` / `get_link_flags()`), so the
library matches the TensorFlow it will be loaded into. The CUDA kernels are
built only for a CUDA build of TensorFlow (tensorflow-cpu is not one: then
CPU only), and only with an nvcc of the CUDA major version that TensorFlow
was built against (`tf.sysconfig.get_build_info()["cuda_version"]`): objects
of another major version would need another CUDA runtime than the one
TensorFlow loads. nvcc is looked for in $CUDA_HOME / $CUDA_PATH, on PATH, in
the `nvidia` packages of site-packages and in /usr/local/cuda*. The library
links the CUDA runtime by its soname (`libcudart.so.12`), so it shares the
one TensorFlow loads, and finds it where TensorFlow's wheel does (the
nvidia-cuda-runtime-cu12 package beside it). setup.py calls `build()`; a
failure there leaves the pure-TF fallback.

`--check-glue` compiles the TensorFlow glue of the CUDA kernels (the
`#if GOOGLE_CUDA` parts of `kernels/*.cc`) with -DGOOGLE_CUDA=1 against
TensorFlow's headers and CUDA headers, which need neither a GPU nor a CUDA
build of TensorFlow: `pip install nvidia-cuda-runtime-cu12
nvidia-cuda-nvcc-cu12` provides the headers (the second for `crt/`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CC_DIR = os.path.join(ROOT, "custom_ops", "cc")
DEFAULT_OUTPUT = os.path.join(ROOT, "tfgc", "ops", "_tfgc_ops.so")
# No contraction into fused multiply-adds, and a sqrt without errno (so that
# loops vectorise into sqrtps): the fused update must compute with Keras's
# own float operations, one rounding each.
OPT_FLAGS = ["-O3", "-fPIC", "-DNDEBUG", "-ffp-contract=off", "-fno-math-errno"]
# Portable PTX plus SASS for common data-centre GPUs, when TensorFlow does
# not say which GPUs it was built for.
GENCODES = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]


def gencodes(capabilities: Sequence[str] | None) -> list[str]:
    """nvcc's -gencode flags for TensorFlow's `cuda_compute_capabilities`.

    TensorFlow lists SASS targets as `sm_XY` and PTX as `compute_XY`; the
    kernels are built for the same GPUs, plus PTX of the newest one (so a
    newer GPU can JIT them). Without the list, GENCODES.
    """
    if not capabilities:
        return list(GENCODES)
    flags, newest = [], None
    for cap in capabilities:
        match = re.fullmatch(r"(sm|compute)_(\d+[a-z]?)", cap)
        if not match:
            raise BuildError(
                "unexpected entry in TensorFlow's cuda_compute_capabilities: "
                f"{cap!r} (expected sm_XY or compute_XY)"
            )
        kind, arch = match.groups()
        flags.append(f"-gencode=arch=compute_{arch},code={kind}_{arch}")
        newest = arch
    ptx = f"-gencode=arch=compute_{newest},code=compute_{newest}"
    return list(dict.fromkeys([*flags, ptx]))


# One architecture is enough to check that the device code compiles.
CHECK_GENCODES = ["-gencode=arch=compute_80,code=sm_80"]
# Where TensorFlow's pip dependencies put the CUDA runtime in site-packages
# (`tensorflow[and-cuda]` installs nvidia-cuda-runtime-cu12 there; CUDA 13
# wheels use nvidia/cu13/lib). TensorFlow's own libraries carry these
# directories in their RUNPATH.
CUDART_PIP_DIRS = ("nvidia/cuda_runtime/lib", "nvidia/cu{major}/lib")

NO_NVCC = (
    "no nvcc was found (looked in $CUDA_HOME, $CUDA_PATH, PATH, "
    "site-packages/nvidia and /usr/local/cuda*)"
)


class BuildError(RuntimeError):
    """Raised when the custom ops cannot be built."""


def sources() -> tuple[list[str], list[str]]:
    """Returns the (C++, CUDA) source files of the ops."""
    ops = sorted(glob.glob(os.path.join(CC_DIR, "ops", "*.cc")))
    kernels = sorted(glob.glob(os.path.join(CC_DIR, "kernels", "*.cc")))
    cuda = [f for f in kernels if f.endswith(".cu.cc")]
    cpp = ops + [f for f in kernels if not f.endswith(".cu.cc")]
    return cpp, cuda


def glue_sources() -> list[str]:
    """The C++ kernel files with a `GOOGLE_CUDA` part (the GPU glue)."""
    cpp, _ = sources()
    glue = []
    for path in cpp:
        with open(path, encoding="utf-8") as f:
            if "GOOGLE_CUDA" in f.read():
                glue.append(path)
    return glue


@dataclasses.dataclass(frozen=True)
class TfConfig:
    """What the build needs to know of the importable TensorFlow."""

    compile_flags: list[str]
    link_flags: list[str]
    build_info: dict
    package_dir: str  # .../site-packages/tensorflow

    @property
    def include_dir(self) -> str | None:
        for flag in self.compile_flags:
            if flag.startswith("-I"):
                return flag[2:]
        return None


def _tf_config() -> TfConfig:
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
    return TfConfig(
        list(tf.sysconfig.get_compile_flags()),
        list(tf.sysconfig.get_link_flags()),
        dict(tf.sysconfig.get_build_info()),
        os.path.dirname(os.path.abspath(tf.__file__)),
    )


def tf_cuda_version(info: Mapping) -> str | None:
    """The CUDA version TensorFlow was built with ("12.5.1"), or None.

    None for builds without CUDA (tensorflow-cpu) and for CUDA builds that
    do not say which version.
    """
    if not info.get("is_cuda_build", False):
        return None
    version = info.get("cuda_version")
    return str(version) if version else None


def _major(version: str) -> int:
    return int(str(version).split(".")[0])


# ---------------------------------------------------------------------------
# Finding nvcc, the CUDA headers and the CUDA runtime.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Nvcc:
    """An nvcc found here: its path, release (major, minor) and toolkit."""

    path: str
    version: tuple[int, int]
    home: str

    def __str__(self) -> str:
        return f"nvcc {self.version[0]}.{self.version[1]} at {self.path}"


@dataclasses.dataclass(frozen=True)
class CudaHeaders:
    """Directories to -I for cuda_runtime.h (and crt/), and their version."""

    include_dirs: tuple[str, ...]
    version: tuple[int, int]

    def __str__(self) -> str:
        dirs = ", ".join(self.include_dirs)
        return f"CUDA {self.version[0]}.{self.version[1]} headers in {dirs}"


def _nvidia_dirs() -> list[str]:
    """`site-packages/nvidia` directories on sys.path (NVIDIA's wheels)."""
    found = []
    for entry in sys.path:
        path = os.path.join(os.path.abspath(entry or "."), "nvidia")
        if os.path.isdir(path) and path not in found:
            found.append(path)
    return found


def _by_version_desc(paths: list[str]) -> list[str]:
    def key(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    return sorted(paths, key=key, reverse=True)


def nvcc_candidates() -> list[str]:
    """Existing nvcc paths, most wanted first, one per real file."""
    paths = [
        os.path.join(os.environ[var], "bin", "nvcc")
        for var in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(var)
    ]
    if shutil.which("nvcc"):
        paths.append(shutil.which("nvcc"))
    for nvidia in _nvidia_dirs():
        # nvidia-cuda-nvcc (CUDA 13+) installs nvidia/cu13/bin/nvcc;
        # nvidia-cuda-nvcc-cu12 has ptxas only, but look there too.
        paths.append(os.path.join(nvidia, "cuda_nvcc", "bin", "nvcc"))
        paths += _by_version_desc(
            glob.glob(os.path.join(nvidia, "cu*/bin/nvcc"))
        )
    paths.append("/usr/local/cuda/bin/nvcc")
    paths += _by_version_desc(glob.glob("/usr/local/cuda-*/bin/nvcc"))
    found, seen = [], set()
    for path in paths:
        real = os.path.realpath(path)
        if (
            os.path.isfile(path)
            and os.access(path, os.X_OK)
            and real not in seen
        ):
            seen.add(real)
            found.append(path)
    return found


def parse_nvcc_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from `nvcc --version` ("... release 12.5, V12.5.82")."""
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def probe_nvcc(path: str) -> Nvcc | None:
    """Runs `path` to learn its release and toolkit; None if it fails."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60
        ).stdout
        version = parse_nvcc_version(out)
        # nvcc prints its toolkit root (TOP) when asked for a dry run; this
        # also works for wrapper scripts such as /usr/local/bin/nvcc.
        dry = subprocess.run(
            [path, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if version is None:
        return None
    top = re.search(r"^#\$ TOP=(.*)$", dry.stdout + dry.stderr, re.MULTILINE)
    if top:
        home = os.path.normpath(top[1].strip())
    else:
        home = os.path.dirname(os.path.dirname(os.path.realpath(path)))
    return Nvcc(path, version, home)


def find_nvccs() -> list[Nvcc]:
    """Every working nvcc found here, most wanted first, one per toolkit."""
    found = {}
    for nvcc in map(probe_nvcc, nvcc_candidates()):
        if nvcc is not None:
            found.setdefault(os.path.realpath(nvcc.home), nvcc)
    return list(found.values())


def nvcc_install_hint(major: int) -> str:
    """How to get an nvcc of CUDA `major`."""
    if major >= 13:
        return (
            f'`pip install "nvidia-cuda-nvcc=={major}.*"` (its nvcc lands in '
            f"site-packages/nvidia/cu{major}/bin, where the build looks), or "
            f"install NVIDIA's CUDA {major} toolkit and set CUDA_HOME to it"
        )
    return (
        f"install NVIDIA's CUDA {major} toolkit (e.g. the "
        f"cuda-nvcc-{major}-* package of NVIDIA's apt repository, or "
        f"conda's cuda-nvcc={major}) and set CUDA_HOME to it; PyPI's "
        f"nvidia-cuda-nvcc-cu{major} ships ptxas but no nvcc"
    )


def select_nvcc(found: Sequence[Nvcc], tf_cuda: str | None) -> Nvcc:
    """The first nvcc of TensorFlow's CUDA major version.

    Args:
        found: the nvccs found, most wanted first (`find_nvccs()`).
        tf_cuda: TensorFlow's `cuda_version` ("12.5.1"); None accepts any.

    Raises:
        BuildError: none found, or none of the major version TensorFlow
            needs; the message says what was found and how to fix it.
    """
    if tf_cuda is None:
        if found:
            return found[0]
        raise BuildError(NO_NVCC)
    major = _major(tf_cuda)
    for nvcc in found:
        if nvcc.version[0] == major:
            return nvcc
    seen = (
        "found only " + ", ".join(str(n) for n in found) if found else NO_NVCC
    )
    raise BuildError(
        f"TensorFlow was built against CUDA {tf_cuda}, so its CUDA kernels "
        f"need nvcc {major}.x (objects of another major version need "
        f"another CUDA runtime than TensorFlow's), but {seen}. To fix: "
        f"{nvcc_install_hint(major)}; or build CPU-only kernels with "
        "`--cuda=off`."
    )


def _cuda_runtime_version(include_dir: str) -> tuple[int, int] | None:
    try:
        with open(os.path.join(include_dir, "cuda_runtime_api.h")) as f:
            match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    if not match:
        return None
    number = int(match[1])
    return number // 1000, number % 1000 // 10


def headers_in(dirs: Sequence[str]) -> CudaHeaders | None:
    """The CUDA headers in `dirs` (cuda_runtime.h, crt/), or None."""
    real = {}  # the existing dirs, one per real directory, in order
    for d in dirs:
        if os.path.isdir(d):
            real.setdefault(os.path.realpath(d), d)
    dirs = list(real.values())
    runtime = [d for d in dirs if os.path.isfile(f"{d}/cuda_runtime.h")]
    has_crt = any(os.path.isfile(f"{d}/crt/host_config.h") for d in dirs)
    if not runtime or not has_crt:
        return None
    version = _cuda_runtime_version(runtime[0])
    return CudaHeaders(tuple(dirs), version) if version else None


def cuda_header_candidates(tf_include: str | None = None) -> list[list[str]]:
    """Include-dir sets that may hold CUDA headers, most wanted first."""
    sets = []
    if tf_include:  # TensorFlow's GPU wheel ships the CUDA it was built with
        sets.append([os.path.join(tf_include, "third_party/gpus/cuda/include")])
    for nvidia in _nvidia_dirs():
        sets.append(
            [f"{nvidia}/cuda_runtime/include", f"{nvidia}/cuda_nvcc/include"]
        )
        sets += [
            [d] for d in _by_version_desc(glob.glob(f"{nvidia}/cu*/include"))
        ]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            sets.append([os.path.join(os.environ[var], "include")])
    sets.append(["/usr/local/cuda/include"])
    sets += [
        [d] for d in _by_version_desc(glob.glob("/usr/local/cuda-*/include"))
    ]
    return sets


def find_cuda_headers(
    major: int | None = None, tf_include: str | None = None
) -> CudaHeaders | None:
    """The first CUDA headers found (of CUDA `major` if given), or None."""
    for dirs in cuda_header_candidates(tf_include):
        headers = headers_in(dirs)
        if headers and (major is None or headers.version[0] == major):
            return headers
    return None


def toolkit_headers(nvcc: Nvcc) -> CudaHeaders | None:
    """The CUDA headers of nvcc's own toolkit."""
    return headers_in(
        [
            os.path.join(nvcc.home, "include"),
            os.path.join(nvcc.home, "targets", "x86_64-linux", "include"),
        ]
    )


def find_cuda() -> tuple[str, str] | None:
    """Returns (nvcc, CUDA home) for the first nvcc with its headers."""
    for nvcc in find_nvccs():
        if toolkit_headers(nvcc):
            return nvcc.path, nvcc.home
    return None


def find_cudart(major: int, dirs: Sequence[str]) -> str | None:
    """The first of `dirs` holding `libcudart.so.<major>`, or None."""
    for d in dirs:
        if os.path.isfile(os.path.join(d, f"libcudart.so.{major}")):
            return d
    return None


def _site_of(tf_dir: str) -> str:
    return os.path.dirname(os.path.abspath(tf_dir))


def _pip_cudart_dirs(major: int, site: str = "") -> list[str]:
    return [os.path.join(site, d.format(major=major)) for d in CUDART_PIP_DIRS]


def cudart_link_flags(major: int, link_dir: str, tf_dir: str) -> list[str]:
    """Links the CUDA runtime by soname, found where TensorFlow finds it.

    The library records `libcudart.so.<major>` (not a path), so in a process
    where TensorFlow has loaded its CUDA runtime, that one is used. Its
    RUNPATH lists only the places TensorFlow's own libraries look (the
    nvidia-cuda-runtime package in site-packages: relative to the installed
    library, and the directory beside `tf_dir`, TensorFlow's package
    directory, for a library built in a source tree), never a system
    toolkit's directory, so it cannot load another runtime than TensorFlow.

    Args:
        major: the CUDA major version.
        link_dir: the directory holding `libcudart.so.<major>` to link.
        tf_dir: TensorFlow's package directory (`.../site-packages/tensorflow`).
    """
    # tfgc/ops/_tfgc_ops.so in site-packages: $ORIGIN/../.. is site-packages.
    rpaths = [f"$ORIGIN/../../{rel}" for rel in _pip_cudart_dirs(major)]
    beside_tf = find_cudart(major, _pip_cudart_dirs(major, _site_of(tf_dir)))
    if beside_tf:
        rpaths.append(beside_tf)
    return [
        f"-L{link_dir}",
        f"-l:libcudart.so.{major}",
        "-Wl,--enable-new-dtags",
        *(f"-Wl,-rpath,{r}" for r in rpaths),
    ]


def cudart_dirs(major: int, nvcc: Nvcc, tf_dir: str) -> list[str]:
    """Where to look for `libcudart.so.<major>`: TensorFlow's first."""
    return [
        *_pip_cudart_dirs(major, _site_of(tf_dir)),
        os.path.join(nvcc.home, "lib64"),
        os.path.join(nvcc.home, "lib"),
        os.path.join(nvcc.home, "targets", "x86_64-linux", "lib"),
    ]


# ---------------------------------------------------------------------------
# Compiling.
# ---------------------------------------------------------------------------


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


def _cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise BuildError("no C++ compiler (g++ or $CXX) was found")
    return cxx


def cxx_command(
    cxx: str, src: str, obj: str, cflags: list[str], extra: list[str]
) -> list[str]:
    """The C++ command compiling one op or kernel file against TensorFlow."""
    return [cxx, "-c", src, "-o", obj, f"-I{ROOT}", *cflags, *extra]


def nvcc_command(
    nvcc: str,
    src: str,
    obj: str,
    extra: list[str] | None = None,
    check: bool = False,
    targets: list[str] | None = None,
) -> list[str]:
    """The nvcc command compiling one TF-free `.cu.cc` to an object.

    `targets`: -gencode flags (default GENCODES). With `check`, a compile
    check: one GPU architecture, host code not optimised (ptxas still
    optimises the device code).
    """
    return [
        nvcc,
        "-x",
        "cu",
        "-c",
        src,
        "-o",
        obj,
        "-std=c++17",
        "-O0" if check else "-O3",
        "-DNDEBUG",
        "-Xcompiler",
        "-fPIC",
        f"-I{ROOT}",
        *(CHECK_GENCODES if check else (targets or GENCODES)),
        *(extra or []),
    ]


def _google_cuda_flags(headers: CudaHeaders) -> list[str]:
    return ["-DGOOGLE_CUDA=1", *(f"-I{d}" for d in headers.include_dirs)]


def launcher_symbols(obj: str) -> tuple[set[str], set[str]]:
    """The (defined, undefined) mangled `tfgc::gpu::` symbols of an object."""
    nm = shutil.which("nm")
    if nm is None:
        raise BuildError("nm (binutils) was not found")
    out = subprocess.run(
        [nm, "-P", obj], capture_output=True, text=True, check=True
    ).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2 or not re.match(r"_ZNK?4tfgc3gpu", parts[0]):
            continue
        (undefined if parts[1] == "U" else defined).add(parts[0])
    return defined, undefined


def missing_launchers(objs: Sequence[str]) -> list[str]:
    """`tfgc::gpu::` symbols some object uses and none defines (demangled)."""
    defined, undefined = set(), set()
    for obj in objs:
        d, u = launcher_symbols(obj)
        defined |= d
        undefined |= u
    missing = sorted(undefined - defined)
    if missing and shutil.which("c++filt"):
        missing = subprocess.run(
            ["c++filt", *missing], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    return missing


def _importable_tf_cuda_version() -> str | None:
    try:
        import tensorflow as tf  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - the nvcc check needs no TensorFlow
        return None
    return tf_cuda_version(tf.sysconfig.get_build_info())


def _cuda_check_jobs(dest: str, verbose: bool) -> tuple[list, list[str]]:
    """(nvcc commands, files) compiling every `.cu.cc` into `dest`."""
    found = find_nvccs()
    nvcc = select_nvcc(found, None)
    tf_cuda = _importable_tf_cuda_version()
    if tf_cuda is not None:
        try:
            nvcc = select_nvcc(found, tf_cuda)
        except BuildError:
            pass  # a compile check: another major version still checks it
    if verbose:
        print(f"custom_ops.build: checking the CUDA kernels with {nvcc}")
    _, cuda = sources()
    jobs = [
        nvcc_command(nvcc.path, s, os.path.join(dest, f"cu{i}.o"), check=True)
        for i, s in enumerate(cuda)
    ]
    return jobs, cuda


def _glue_jobs(dest: str, verbose: bool) -> tuple[list, list[str], CudaHeaders]:
    """(C++ commands, files, headers) compiling the glue into `dest`."""
    tf = _tf_config()
    tf_cuda = tf_cuda_version(tf.build_info)
    major = _major(tf_cuda) if tf_cuda else None
    headers = find_cuda_headers(major, tf.include_dir)
    if headers is None:
        want = f"CUDA {major} " if major else "CUDA "
        raise BuildError(
            f"no {want}headers (cuda_runtime.h and crt/host_config.h) were "
            "found in TensorFlow's include directory, site-packages/nvidia, "
            "$CUDA_HOME or /usr/local/cuda*. Install them with `pip install "
            f"nvidia-cuda-runtime-cu{major or 12} "
            f"nvidia-cuda-nvcc-cu{major or 12}` (about 25 MB; the second "
            "holds crt/)."
        )
    if verbose:
        print(f"custom_ops.build: checking the GOOGLE_CUDA glue with {headers}")
    cxx = _cxx()
    glue = glue_sources()
    extra = ["-O0", "-fPIC", *_google_cuda_flags(headers)]
    jobs = [
        cxx_command(
            cxx, s, os.path.join(dest, f"glue{i}.o"), tf.compile_flags, extra
        )
        for i, s in enumerate(glue)
    ]
    return jobs, glue, headers


def check_cuda(verbose: bool = False) -> list[str]:
    """Compiles every `.cu.cc` with nvcc alone; returns them.

    Uses the nvcc of TensorFlow's CUDA major version when TensorFlow is a
    CUDA build and one is found, else the first nvcc found (TensorFlow is
    not needed); one GPU architecture only: a compile check.
    """
    with tempfile.TemporaryDirectory() as tmp:
        jobs, cuda = _cuda_check_jobs(tmp, verbose)
        _compile_all(jobs, verbose)
    return cuda


def check_glue(verbose: bool = False) -> tuple[list[str], CudaHeaders]:
    """Compiles the GOOGLE_CUDA glue of the kernels, without nvcc or a GPU.

    Every `kernels/*.cc` with a `GOOGLE_CUDA` part is compiled with
    -DGOOGLE_CUDA=1 against TensorFlow's headers and CUDA headers (of
    TensorFlow's CUDA major version when it is a CUDA build; else the first
    found: TensorFlow's own, NVIDIA's pip packages, $CUDA_HOME,
    /usr/local/cuda*).

    Returns:
        (the files compiled, the headers used).

    Raises:
        BuildError: no CUDA headers, or a compile error.
    """
    with tempfile.TemporaryDirectory() as tmp:
        jobs, glue, headers = _glue_jobs(tmp, verbose)
        _compile_all(jobs, verbose)
    return glue, headers


def check_glue_and_cuda(verbose: bool = False) -> str:
    """`check_glue` and `check_cuda` at once, then checks that they link.

    Every `tfgc::gpu::` function the glue calls (the typed launchers
    declared in `kernels/*_gpu.h`, each instantiation for an element type
    included) must be defined by the nvcc-compiled objects: a launcher whose
    definition drifted from its declaration, or an instantiation missing,
    would otherwise surface only when a CUDA build of the library fails to
    load.

    Returns:
        A one-line summary.
    """
    with tempfile.TemporaryDirectory() as tmp:
        glue_jobs, glue, headers = _glue_jobs(tmp, verbose)
        cuda_jobs, cuda = _cuda_check_jobs(tmp, verbose)
        _compile_all(glue_jobs + cuda_jobs, verbose)
        missing = missing_launchers(glob.glob(os.path.join(tmp, "*.o")))
    if missing:
        raise BuildError(
            "the GOOGLE_CUDA glue calls functions that no CUDA kernel file "
            "defines (a launcher's declaration and definition differ):\n  "
            + "\n  ".join(missing)
        )
    return (
        f"compiled {len(glue)} glue files with -DGOOGLE_CUDA=1 ({headers}) "
        f"and {len(cuda)} CUDA files with nvcc; every launcher the glue "
        "calls is defined"
    )


# ---------------------------------------------------------------------------
# Building.
# ---------------------------------------------------------------------------


def _cuda_toolchain(
    tf_cuda: str | None, tf_dir: str
) -> tuple[Nvcc, CudaHeaders, list[str]]:
    """(nvcc, headers, link flags) for a CUDA build matching TensorFlow's."""
    nvcc = select_nvcc(find_nvccs(), tf_cuda)
    headers = toolkit_headers(nvcc)
    if headers is None:
        raise BuildError(f"{nvcc} has no cuda_runtime.h in {nvcc.home}")
    major = nvcc.version[0]
    link_dir = find_cudart(major, cudart_dirs(major, nvcc, tf_dir))
    if link_dir is None:
        raise BuildError(
            f"libcudart.so.{major} was found neither beside TensorFlow nor in "
            f"{nvcc.home}: `pip install nvidia-cuda-runtime-cu{major}` (or "
            "`tensorflow[and-cuda]`)"
        )
    return nvcc, headers, cudart_link_flags(major, link_dir, tf_dir)


def build(
    output: str = DEFAULT_OUTPUT, cuda: str = "auto", verbose: bool = False
) -> str:
    """Compiles the ops into `output`; returns its path.

    Args:
        output: path of the shared library to write.
        cuda: "auto" (the CUDA kernels too when TensorFlow is a CUDA build
            and an nvcc of its CUDA major version is found; else CPU only,
            saying why on stderr), "on" (fail without them) or "off".
        verbose: print the commands.

    Raises:
        BuildError: TensorFlow is not importable, no compiler, a compile or
            link step failed, or `cuda="on"` and the CUDA kernels cannot be
            built (the message says why and how to fix it).
    """
    if cuda not in ("auto", "on", "off"):
        raise ValueError(
            f"`cuda` must be auto, on or off. Received: cuda={cuda}"
        )
    tf = _tf_config()
    cxx = _cxx()
    cpp, cu = sources()
    toolchain = None
    if cuda != "off" and tf.build_info.get("is_cuda_build", False):
        try:
            toolchain = _cuda_toolchain(
                tf_cuda_version(tf.build_info), tf.package_dir
            )
        except BuildError as e:
            if cuda == "on":
                raise
            print(
                "custom_ops.build: WARNING: building the CPU kernels only, "
                f"so tfgc's ops will run on the CPU even on GPUs: {e}",
                file=sys.stderr,
            )
    elif cuda == "on":
        raise BuildError(
            "CUDA build requested but the installed TensorFlow is not a CUDA "
            "build (tensorflow-cpu?): install `tensorflow[and-cuda]`"
        )
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    extra, link_extra = list(OPT_FLAGS), []
    if toolchain:
        nvcc, headers, link_extra = toolchain
        extra += _google_cuda_flags(headers)
        if verbose:
            print(f"custom_ops.build: CUDA kernels with {nvcc}")
    with tempfile.TemporaryDirectory() as tmp:
        jobs, objs = [], []
        for i, src in enumerate(cpp):
            objs.append(os.path.join(tmp, f"cc{i}.o"))
            jobs.append(
                cxx_command(cxx, src, objs[-1], tf.compile_flags, extra)
            )
        if toolchain:
            for i, src in enumerate(cu):
                objs.append(os.path.join(tmp, f"cu{i}.o"))
                jobs.append(
                    nvcc_command(
                        toolchain[0].path,
                        src,
                        objs[-1],
                        targets=gencodes(
                            tf.build_info.get("cuda_compute_capabilities")
                        ),
                    )
                )
        _compile_all(jobs, verbose)
        tmp_out = os.path.join(tmp, "_tfgc_ops.so")
        _run(
            [cxx, "-shared", *objs, "-o", tmp_out, *tf.link_flags, *link_extra],
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
    parser.add_argument(
        "--check-glue",
        action="store_true",
        help="only compile the GOOGLE_CUDA glue (TensorFlow and CUDA "
        "headers needed, no nvcc); with --check-cuda, also check that the "
        "two link",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.check_glue and args.check_cuda:
            print(check_glue_and_cuda(args.verbose))
        elif args.check_glue:
            glue, headers = check_glue(args.verbose)
            print(
                f"compiled {len(glue)} files with -DGOOGLE_CUDA=1 ({headers})"
            )
        elif args.check_cuda:
            done = check_cuda(args.verbose)
            print(f"nvcc compiled {len(done)} CUDA sources")
        else:
            print(f"built {build(args.output, args.cuda, args.verbose)}")
    except BuildError as e:
        print(f"custom_ops.build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
