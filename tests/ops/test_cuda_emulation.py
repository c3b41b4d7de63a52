"""The CUDA kernels, run on the CPU emulation of CUDA, against numpy.

custom_ops/cuda_harness/run_harness.py --emulate compiles the kernel
sources (custom_ops/cc/kernels/*.cu.cc) as C++ on cuda_emulation.h and
checks them against numpy on several emulated devices and thread
schedules; emulation_selftest.cc checks the emulation itself. Both run in
subprocesses: the emulation aborts the process on misuse of CUDA.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
HARNESS = os.path.join(ROOT, "custom_ops", "cuda_harness")
RUN_HARNESS = os.path.join(HARNESS, "run_harness.py")
SELFTEST = os.path.join(HARNESS, "emulation_selftest.cc")


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the CUDA emulation needs Linux (mmap guard pages, fibers)"
    missing = [p for p in (RUN_HARNESS, SELFTEST) if not os.path.exists(p)]
    if missing:
        # Under Bazel the harness is not among the test's data files.
        return f"the CUDA harness sources are not here: {missing}"
    from custom_ops.cuda_harness import run_harness  # noqa: PLC0415

    if run_harness.find_cxx() is None:
        return "no C++ compiler (g++, c++ or $CXX) was found"
    return None


_SKIP = _skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


def run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def emulation_lib(tmp_path_factory) -> str:
    from custom_ops.cuda_harness import run_harness  # noqa: PLC0415

    out = tmp_path_factory.mktemp("emulation") / "libtfgc_cuda_emulation.so"
    return run_harness.build_emulation(str(out))


@pytest.fixture(scope="module")
def selftest(tmp_path_factory) -> str:
    from custom_ops.cuda_harness import run_harness  # noqa: PLC0415

    exe = str(tmp_path_factory.mktemp("emulation") / "emulation_selftest")
    proc = run(
        [
            run_harness.find_cxx(),
            *("-x", "c++", "-std=c++17", "-O1", "-pthread"),
            *("-DTFGC_CUDA_EMULATION", f"-I{ROOT}", SELFTEST, "-o", exe),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return exe


def run_harness_checks(lib: str, *extra: str) -> None:
    proc = run(
        [sys.executable, RUN_HARNESS, "--emulate", "--no-build"]
        + ["--library", lib, *extra]
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "correctness: 0 failures" in proc.stdout, out[-5000:]
    assert "conversions: 0 failures" in proc.stdout, out[-5000:]


def test_kernels_match_numpy(emulation_lib):
    from custom_ops.cuda_harness import run_harness  # noqa: PLC0415

    own_tests = (
        "top_k_segments",
        "fused_update",
        "top_k_ratio",
        "top_k_two_sided",
    )
    checks = [c for c in run_harness.CHECKS if c not in own_tests]
    run_harness_checks(emulation_lib, "--checks", ",".join(checks))


def test_segmented_top_k_matches_single_launches(emulation_lib):
    # Many tensors in one selection (mixed sizes and kinds, n = 0,
    # k = 0, k = n, gaps and offsets out of order, none, one, ResNet-50's
    # 161 tensors scaled down), every mode and dtype: each segment bit for
    # bit the single-tensor launchers' on it alone, with the host traffic
    # of the exact-k modes (nothing but the table's upload) and of
    # threshold mode (one wait, one copy of all the sizes).
    run_harness_checks(emulation_lib, "--checks", "top_k_segments")


def test_top_k_ratio_matches_numpy(emulation_lib):
    # TopKRatioWithResidual's launcher: indices, acc's values and the new
    # residual bit for bit numpy's (np_select_ratio), every dtype, with
    # zero, subnormal and infinite weights, NaN, Inf, ties and floors from
    # 0 to 1e30, with and without the host thread flushing.
    run_harness_checks(emulation_lib, "--checks", "top_k_ratio")


def test_top_k_two_sided_matches_numpy(emulation_lib):
    # TopKTwoSided's launchers (SBC's two sides): both sides' indices and
    # values bit for bit numpy's (np_select_two_sided; NaN payloads of
    # both signs, the negative side's sign bit flipped), every dtype, on
    # TopKSample's inputs and one sign only, k above a side's entries,
    # zeros of both signs and subnormals, with and without the host thread
    # flushing; one wait and one copy of the sizes to the host.
    run_harness_checks(emulation_lib, "--checks", "top_k_two_sided")


def test_fused_update_matches_numpy(emulation_lib):
    # Every rule with and without weight decay, Keras's scalars, tables of
    # 0, 1, 3, 100 (three launches) and ResNet-50's 161 tensors: each
    # variable and slot bit for bit numpy's float32 operations in
    # UpdateElement's order with FTZ and DAZ as on x86 (subnormal operands
    # and results, and the products that x86 deems tiny only after
    # rounding, flushed), with and without the host thread flushing; the
    # gradients and the words around every buffer untouched, no host
    # waits or copies, one launch per chunk; invalid tables refused.
    run_harness_checks(emulation_lib, "--checks", "fused_update")


@pytest.mark.slow
def test_kernels_match_numpy_large(emulation_lib):
    run_harness_checks(emulation_lib, "--check-sizes", "65537,100003")


@pytest.mark.parametrize(
    "scenario", ["warp", "indices", "atomics", "race", "launch-errors"]
)
def test_emulation_behaves_as_cuda(selftest, scenario):
    proc = run([selftest, scenario])
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (
        proc.stdout + proc.stderr
    )


@pytest.mark.parametrize(
    "scenario, message",
    [
        ("early-return", "cannot finish"),
        ("divergent-barrier", "divergent __syncthreads"),
        ("divergent-warp", "divergent warp"),
        ("partial-mask", "only full-warp masks"),
        ("read-past-end", "out-of-bounds access at byte 148"),
        ("host-pointer", "is not device memory"),
        ("copy-to-host-memory", "not inside one device buffer"),
        ("copy-past-end", "not inside one device buffer"),
        ("endless", "has run for more than 1 s"),
    ],
)
def test_emulation_aborts_on_misuse(selftest, scenario, message):
    proc = run([selftest, scenario], timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert "tfgc CUDA emulation: " in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr
