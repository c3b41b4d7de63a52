"""Runs every op test against the custom ops and the pure-TF references."""

import os

import pytest

from tests import backends
from tfgc.ops import _library


@pytest.fixture(params=backends.BACKENDS)
def backend(request, monkeypatch):
    """Selects the implementation behind `tfgc.ops` for one test."""
    backends.use(request.param, monkeypatch)
    return request.param


@pytest.fixture
def custom_lib(monkeypatch):
    """The loaded op library; skips the test when it is not available."""
    backends.use("custom", monkeypatch)
    return _library.custom_ops()


def pytest_report_header(config):
    del config
    return (
        f"tfgc custom ops: {os.path.exists(_library.LIBRARY_PATH)=}, "
        f"{_library.DISABLE_ENV}={os.environ.get(_library.DISABLE_ENV)}"
    )
