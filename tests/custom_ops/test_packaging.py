"""The source distribution carries what `pip install <sdist>` needs.

Installing an sdist compiles the custom ops from `custom_ops/` (setup.py's
build_ext runs `custom_ops/build.py`), so MANIFEST.in must ship those
sources. The fast test reads the file list setuptools derives from
MANIFEST.in; the slow one builds an sdist, installs it offline and loads
the compiled ops from the installed copy.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from custom_ops import build as ops_build

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
# What MANIFEST.in keeps out: build outputs and caches.
BUILD_OUTPUTS = (".so", ".o", ".pyc", ".pyo", ".pyd")


def _setup_py(args, cwd):
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _manifest(root, egg_base):
    """The files an sdist of `root` carries (relative paths)."""
    _setup_py(["egg_info", "--egg-base", str(egg_base)], root)
    with open(egg_base / "tfgc.egg-info" / "SOURCES.txt") as f:
        names = f.read().split()
    # The egg-info files are listed by absolute path; sdist makes its own.
    return {n for n in names if not os.path.isabs(n)}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return _manifest(ROOT, tmp_path_factory.mktemp("egg"))


def _rel(path):
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def test_sdist_carries_the_custom_op_sources(manifest):
    cpp, cuda = ops_build.sources()
    assert cpp and cuda
    needed = {_rel(p) for p in cpp + cuda}
    needed |= {"setup.py", "custom_ops/__init__.py", "custom_ops/build.py"}
    assert needed <= manifest, sorted(needed - manifest)


def test_sdist_carries_all_of_custom_ops_but_build_outputs(manifest):
    """Headers, the CUDA harness and anything added later travel too."""
    on_disk = set()
    for folder, dirs, files in os.walk(os.path.join(ROOT, "custom_ops")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        on_disk |= {
            _rel(os.path.join(folder, f))
            for f in files
            if not f.endswith(BUILD_OUTPUTS)
        }
    assert any(p.endswith(".h") for p in on_disk)
    assert on_disk <= manifest, sorted(on_disk - manifest)
    assert not [p for p in manifest if p.endswith(BUILD_OUTPUTS)]


@pytest.mark.slow
def test_sdist_installs_offline_with_the_custom_ops(tmp_path, manifest):
    """Build an sdist from a copy of its own file list, pip-install it into
    a target folder (no index, no build isolation: this TensorFlow), and
    load the compiled ops from the installed copy."""
    if not (os.environ.get("CXX") or shutil.which("g++")):
        pytest.skip("no C++ compiler to build the custom ops")
    pytest.importorskip("pip")
    src = tmp_path / "src"
    for name in manifest:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), src / name)
    dist = tmp_path / "dist"
    _setup_py(["sdist", "--dist-dir", str(dist)], src)
    (sdist,) = dist.iterdir()
    target = tmp_path / "target"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "TFGC_DISABLE_CUSTOM_OPS")
    }
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(sdist),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    check = textwrap.dedent(
        """
        import tfgc.ops
        from tfgc.ops import _library
        print(tfgc.ops.__file__)
        assert tfgc.ops.using_custom_ops(), _library.load_error()
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,  # not the repository, so its tfgc is not imported
        env=dict(env, PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[0].startswith(str(target))
