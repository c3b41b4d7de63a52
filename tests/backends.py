"""Switches `tfgc.ops` between the compiled ops and the pure-TF references.

`TFGC_DISABLE_CUSTOM_OPS` is read at every call, so a test can flip it.
"""

import pytest

from tfgc.ops import _library

#: The environment of the whole run forces the references.
FORCED_OFF = _library._disabled()
BACKENDS = ("custom", "reference")


def use(backend: str, monkeypatch) -> None:
    """Makes `tfgc.ops` run `backend` ("custom": the compiled ops, or
    "reference": the pure-TF ones) for one test; skips the test when the
    compiled ops are asked for and cannot run."""
    if backend == "custom":
        if FORCED_OFF:
            pytest.skip(f"{_library.DISABLE_ENV} is set")
        monkeypatch.delenv(_library.DISABLE_ENV, raising=False)
        if not _library.using_custom_ops():
            pytest.skip(f"custom ops not built: {_library.load_error()}")
    else:
        monkeypatch.setenv(_library.DISABLE_ENV, "1")
