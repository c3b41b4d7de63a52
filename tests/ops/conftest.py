"""Runs every op test against the custom ops and the pure-TF references."""

import os

import pytest

from tfgc.ops import _library

_FORCED_OFF = _library._disabled()


@pytest.fixture(params=["custom", "reference"])
def backend(request, monkeypatch):
    """Selects the implementation behind `tfgc.ops` for one test."""
    if request.param == "custom":
        if _FORCED_OFF:
            pytest.skip(f"{_library.DISABLE_ENV} is set")
        monkeypatch.delenv(_library.DISABLE_ENV, raising=False)
        if not _library.using_custom_ops():
            pytest.skip(f"custom ops not built: {_library.load_error()}")
    else:
        monkeypatch.setenv(_library.DISABLE_ENV, "1")
    return request.param


@pytest.fixture
def custom_lib(monkeypatch):
    """The loaded op library; skips the test when it is not available."""
    if _FORCED_OFF:
        pytest.skip(f"{_library.DISABLE_ENV} is set")
    monkeypatch.delenv(_library.DISABLE_ENV, raising=False)
    lib = _library.custom_ops()
    if lib is None:
        pytest.skip(f"custom ops not built: {_library.load_error()}")
    return lib


def pytest_report_header(config):
    del config
    return (
        f"tfgc custom ops: {os.path.exists(_library.LIBRARY_PATH)=}, "
        f"{_library.DISABLE_ENV}={os.environ.get(_library.DISABLE_ENV)}"
    )
