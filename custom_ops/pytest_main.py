"""Runs tfgc op tests with pytest under `bazel test` (see //:BUILD).

Usage (as a py_test main): pytest_main.py TEST_FILE [pytest args...]

Before pytest runs it checks that `tfgc` is imported from the test's
runfiles and that `tfgc.ops.using_custom_ops()` is True with the library
Bazel built (//custom_ops:tfgc_ops copied to tfgc/ops/_tfgc_ops.so), so a
passing test proves the Bazel-built ops were loaded and tested, not the
pure-TF fallback or a library built by setup.py.
"""

from __future__ import annotations

import os
import sys


def _check_library() -> None:
    import tfgc.ops  # noqa: PLC0415
    from tfgc.ops import _library  # noqa: PLC0415

    here = os.path.abspath(os.getcwd())
    package = os.path.abspath(os.path.dirname(tfgc.ops.__file__))
    if not package.startswith(here + os.sep):
        raise SystemExit(
            f"pytest_main: tfgc was imported from {package}, not from the "
            f"test's runfiles {here}; an installed tfgc shadows the one "
            "Bazel staged."
        )
    if os.environ.get(_library.DISABLE_ENV):
        raise SystemExit(
            f"pytest_main: unset {_library.DISABLE_ENV}; the Bazel tests "
            "must run the custom ops."
        )
    if not tfgc.ops.using_custom_ops():
        raise SystemExit(
            "pytest_main: the Bazel-built op library did not load: "
            f"{_library.load_error()}"
        )
    real = os.path.realpath(_library.LIBRARY_PATH)
    if f"{os.sep}bazel-out{os.sep}" not in real:
        raise SystemExit(
            f"pytest_main: {_library.LIBRARY_PATH} resolves to {real}, "
            "which is not the library Bazel built (bazel-out/...)."
        )
    print(
        f"pytest_main: custom ops loaded from {_library.LIBRARY_PATH} "
        f"-> {real}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    # Bazel gives each test a private writable TEST_TMPDIR; the runfiles
    # tree is not the place for pytest's or hypothesis' caches.
    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:
        os.environ.setdefault(
            "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tmp, ".hypothesis")
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _check_library()

    import pytest  # noqa: PLC0415

    args = [
        "-p",
        "no:cacheprovider",
        # All tests, the slow ones included, as scripts/test.sh runs them.
        "-m",
        "",
        "-q",
        "-rs",
        *argv,
    ]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    return int(pytest.main(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
