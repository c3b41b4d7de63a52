"""Tests of the custom-op loader and build helper."""

import os
import subprocess
import sys
import textwrap

import pytest

from tfgc.ops import _library

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    full_env.pop(_library.DISABLE_ENV, None)
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
        timeout=300,
    )


def test_env_var_forces_reference(monkeypatch):
    monkeypatch.setenv(_library.DISABLE_ENV, "1")
    assert not _library.using_custom_ops()
    assert _library.custom_ops() is None


def test_broken_library_falls_back_with_one_warning(tmp_path):
    broken = tmp_path / "_tfgc_ops.so"
    broken.write_bytes(b"not an ELF file")
    proc = run_python(
        f"""
        import warnings
        import tensorflow as tf
        import tfgc
        from tfgc import ops
        from tfgc.ops import _library
        _library.LIBRARY_PATH = {str(broken)!r}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not ops.using_custom_ops()
            assert not ops.using_custom_ops()
            v, i = ops.top_k_sample(tf.range(10.0), 3)
            w = ops.pack_bits(tf.ones([40], tf.bool))
        assert i.numpy().tolist() == [7, 8, 9], i
        assert w.shape == [2]
        msgs = [str(w.message) for w in caught]
        assert len(msgs) == 1, msgs
        assert "pure-TensorFlow" in msgs[0], msgs
        print("OK")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout


def test_missing_library_imports_fine(tmp_path):
    proc = run_python(
        f"""
        import warnings
        import tfgc
        from tfgc.ops import _library
        _library.LIBRARY_PATH = {str(tmp_path / "missing.so")!r}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not tfgc.ops.using_custom_ops()
        assert "does not exist" in str(caught[0].message)
        print("OK")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_build_helper_lists_sources():
    sys.path.insert(0, ROOT)
    try:
        from custom_ops import build
    finally:
        sys.path.remove(ROOT)
    cpp, cuda = build.sources()
    names = {os.path.basename(f) for f in cpp + cuda}
    assert "top_k_sample_kernels.cc" in names
    assert "top_k_sample_ops.cc" in names
    assert all(f.endswith(".cu.cc") for f in cuda)
    with pytest.raises(ValueError, match="cuda"):
        build.build(cuda="maybe")
