"""CI's guard: TFGC_REQUIRE_CUSTOM_OPS=1 fails the session without the
compiled ops (tests/conftest.py); without it the tests run on the pure-TF
reference ops."""

import pytest

from tests import conftest
from tfgc.ops import _library


def test_required_ops_missing_fail_the_session(monkeypatch):
    monkeypatch.setenv(conftest.REQUIRE_ENV, "1")
    monkeypatch.setenv(_library.DISABLE_ENV, "1")  # as if they did not load
    with pytest.raises(pytest.exit.Exception, match="not in use") as exit:
        conftest.pytest_sessionstart(None)
    assert exit.value.returncode == pytest.ExitCode.TESTS_FAILED


def test_ops_not_required_by_default(monkeypatch):
    monkeypatch.delenv(conftest.REQUIRE_ENV, raising=False)
    monkeypatch.setenv(_library.DISABLE_ENV, "1")
    conftest.pytest_sessionstart(None)  # no exit


def test_required_ops_present_pass(monkeypatch):
    monkeypatch.setenv(conftest.REQUIRE_ENV, "1")
    monkeypatch.delenv(_library.DISABLE_ENV, raising=False)
    if not _library.using_custom_ops():
        pytest.skip(f"custom ops not built: {_library.load_error()}")
    conftest.pytest_sessionstart(None)
