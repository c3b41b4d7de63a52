"""The CUDA build matches TensorFlow's, and the GOOGLE_CUDA glue compiles.

Pure-Python tests of `custom_ops/build.py`'s choice of nvcc, CUDA headers
and CUDA runtime (with made-up toolkits and TensorFlow build info), of the
loader's warning for a CPU-only library under a CUDA TensorFlow with a GPU,
and (slow) the compile check CI runs: the `#if GOOGLE_CUDA` glue compiled
against TensorFlow's and CUDA's headers, the `.cu.cc` files with nvcc, and
every launcher the glue calls defined by them. That check skips without
CUDA headers or nvcc, unless TFGC_REQUIRE_CUDA_CHECKS=1 (.ci/run sets it,
and scripts/setup.sh then installs the headers), which makes it fail.
"""

import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest
import tensorflow as tf

from custom_ops import build as ops_build
from tfgc.ops import _library

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
REQUIRE_ENV = "TFGC_REQUIRE_CUDA_CHECKS"
# tf.sysconfig.get_build_info() of the tensorflow 2.21.0 GPU wheel (read
# from the wheel) and of tensorflow-cpu 2.21.0.
GPU_INFO = {
    "cpu_compiler": "clang",
    "cuda_compute_capabilities": [
        "sm_60",
        "sm_70",
        "sm_80",
        "sm_89",
        "compute_90",
    ],
    "cuda_version": "12.5.1",
    "cudnn_version": "9",
    "is_cuda_build": True,
    "is_rocm_build": False,
    "is_tensorrt_build": False,
}
CPU_INFO = {
    "is_cuda_build": False,
    "is_rocm_build": False,
    "is_tensorrt_build": False,
}


def nvcc(major, minor=0, path=None, home=None):
    path = path or f"/opt/cuda-{major}.{minor}/bin/nvcc"
    home = home or os.path.dirname(os.path.dirname(path))
    return ops_build.Nvcc(path, (major, minor), home)


def fake_toolkit(root, version=(12, 5), crt=True, cudart=True):
    """A directory laid out like a CUDA toolkit, holding no real CUDA."""
    include = root / "include"
    (include / "crt").mkdir(parents=True)
    number = version[0] * 1000 + version[1] * 10
    (include / "cuda_runtime.h").write_text("// fake\n")
    (include / "cuda_runtime_api.h").write_text(
        f"#define CUDART_VERSION  {number}\n"
    )
    if crt:
        (include / "crt" / "host_config.h").write_text("// fake\n")
    if cudart:
        (root / "lib64").mkdir()
        (root / "lib64" / f"libcudart.so.{version[0]}").write_text("")
    return root


# ---------------------------------------------------------------------------
# Which nvcc.
# ---------------------------------------------------------------------------


def test_tf_cuda_version():
    assert ops_build.tf_cuda_version(GPU_INFO) == "12.5.1"
    assert ops_build.tf_cuda_version(CPU_INFO) is None
    # A CUDA build that does not say which CUDA: any nvcc will do.
    assert ops_build.tf_cuda_version({"is_cuda_build": True}) is None


def test_parse_nvcc_version():
    out = (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Cuda compilation tools, release 12.5, V12.5.82\n"
        "Build cuda_12.5.r12.5/compiler.34385749_0\n"
    )
    assert ops_build.parse_nvcc_version(out) == (12, 5)
    assert ops_build.parse_nvcc_version("release 13.0, V13.0.88") == (13, 0)
    assert ops_build.parse_nvcc_version("command not found") is None


def test_select_nvcc_takes_the_first_of_tensorflows_major_version():
    found = [nvcc(13, 0), nvcc(12, 4), nvcc(12, 9)]
    assert ops_build.select_nvcc(found, "12.5.1") is found[1]
    assert ops_build.select_nvcc(found, "13.0") is found[0]
    assert ops_build.select_nvcc(found, None) is found[0]


def test_select_nvcc_refuses_another_major_version_and_says_why():
    found = [nvcc(13, 0, path="/usr/local/bin/nvcc")]
    with pytest.raises(ops_build.BuildError) as e:
        ops_build.select_nvcc(found, "12.5.1")
    msg = str(e.value)
    assert "CUDA 12.5.1" in msg  # what TensorFlow needs
    assert "nvcc 12.x" in msg
    assert "nvcc 13.0 at /usr/local/bin/nvcc" in msg  # what was found
    assert "CUDA_HOME" in msg and "--cuda=off" in msg  # how to fix
    # PyPI's nvidia-cuda-nvcc-cu12 has no nvcc: the fix must not send
    # people there.
    assert "ptxas but no nvcc" in msg


def test_select_nvcc_without_any_nvcc():
    with pytest.raises(ops_build.BuildError, match="no nvcc was found"):
        ops_build.select_nvcc([], None)
    with pytest.raises(ops_build.BuildError) as e:
        ops_build.select_nvcc([], "13.0")
    assert 'pip install "nvidia-cuda-nvcc==13.*"' in str(e.value)


def test_probe_nvcc_reads_release_and_toolkit_root(tmp_path):
    home = fake_toolkit(tmp_path / "cuda-12.5")
    # A wrapper script elsewhere, as /usr/local/bin/nvcc here: the toolkit
    # is where nvcc says it is, not where the script lies.
    script = tmp_path / "bin" / "nvcc"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then\n'
        "  echo 'Cuda compilation tools, release 12.5, V12.5.82'\n"
        "else\n"
        f"  echo '#$ TOP={home}/bin/..'\n"
        "fi\n"
    )
    script.chmod(0o755)
    found = ops_build.probe_nvcc(str(script))
    assert found == ops_build.Nvcc(str(script), (12, 5), str(home))
    assert ops_build.toolkit_headers(found).version == (12, 5)
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    assert ops_build.probe_nvcc(str(broken)) is None


def test_nvcc_candidates_include_the_pip_layouts(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    for rel in ("nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"):
        path = site / rel
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = ops_build.nvcc_candidates()
    assert str(site / "nvidia/cuda_nvcc/bin/nvcc") in found
    assert str(site / "nvidia/cu13/bin/nvcc") in found


# ---------------------------------------------------------------------------
# Which headers and which CUDA runtime.
# ---------------------------------------------------------------------------


def test_headers_from_the_split_pip_packages(tmp_path, monkeypatch):
    # nvidia-cuda-runtime-cu12 has cuda_runtime.h, nvidia-cuda-nvcc-cu12
    # the crt/ headers it includes.
    nvidia = tmp_path / "nvidia"
    runtime = fake_toolkit(nvidia / "cuda_runtime", crt=False)
    crt = nvidia / "cuda_nvcc" / "include" / "crt"
    crt.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert ops_build.find_cuda_headers(12) is None  # no crt/host_config.h
    (crt / "host_config.h").write_text("")
    headers = ops_build.find_cuda_headers(12)
    assert headers.version == (12, 5)
    assert headers.include_dirs == (
        str(runtime / "include"),
        str(nvidia / "cuda_nvcc" / "include"),
    )


def test_headers_of_tensorflows_cuda_version_first(tmp_path, monkeypatch):
    # TensorFlow's GPU wheel ships the CUDA headers it was built with.
    tf_include = tmp_path / "tensorflow" / "include"
    fake_toolkit(tf_include / "third_party/gpus/cuda", version=(12, 5))
    other = fake_toolkit(tmp_path / "nvidia" / "cu13", version=(13, 0))
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    found = ops_build.find_cuda_headers(12, str(tf_include))
    assert found.version == (12, 5)
    found = ops_build.find_cuda_headers(13, str(tf_include))
    assert found.include_dirs == (str(other / "include"),)
    assert ops_build.find_cuda_headers(11, str(tf_include)) is None


def test_cudart_linked_by_soname_and_found_where_tensorflow_finds_it(
    tmp_path,
):
    site = tmp_path / "site-packages"
    tf_dir = site / "tensorflow"
    tf_dir.mkdir(parents=True)
    flags = ops_build.cudart_link_flags(12, "/opt/cuda-12.5/lib64", tf_dir)
    assert "-l:libcudart.so.12" in flags
    assert "-lcudart" not in flags  # would not exist in the pip package
    rpaths = [f.split(",", 2)[2] for f in flags if "-rpath" in f]
    assert "$ORIGIN/../../nvidia/cuda_runtime/lib" in rpaths
    # Never a system toolkit's directory: it could load another runtime
    # than TensorFlow's.
    assert not any(r.startswith("/opt") for r in rpaths)
    # A library built in a source tree finds the runtime beside TensorFlow.
    beside = site / "nvidia" / "cuda_runtime" / "lib"
    beside.mkdir(parents=True)
    (beside / "libcudart.so.12").write_text("")
    flags = ops_build.cudart_link_flags(12, str(beside), tf_dir)
    assert f"-Wl,-rpath,{beside}" in flags
    nvcc12 = nvcc(12, 5, home=str(tmp_path / "cuda"))
    assert ops_build.cudart_dirs(12, nvcc12, tf_dir)[0] == str(beside)


# ---------------------------------------------------------------------------
# build() with a CUDA TensorFlow (made up): the commands it would run.
# ---------------------------------------------------------------------------


@pytest.fixture
def cuda_tf_build(tmp_path, monkeypatch):
    """build() under a CUDA 12.5 TensorFlow, recording its commands."""
    site = tmp_path / "site-packages"
    (site / "tensorflow").mkdir(parents=True)
    config = ops_build.TfConfig(
        ["-I/tf/include", "--std=c++17"],
        ["-L/tf", "-l:libtensorflow_framework.so.2"],
        dict(GPU_INFO),
        str(site / "tensorflow"),
    )
    monkeypatch.setattr(ops_build, "_tf_config", lambda: config)
    commands = []

    def record(jobs, verbose):
        del verbose
        commands.extend(jobs)

    def run(cmd, verbose):
        del verbose
        commands.append(cmd)
        with open(cmd[cmd.index("-o") + 1], "wb"):
            pass

    monkeypatch.setattr(ops_build, "_compile_all", record)
    monkeypatch.setattr(ops_build, "_run", run)
    return types.SimpleNamespace(
        commands=commands, output=str(tmp_path / "out.so"), tmp=tmp_path
    )


def test_build_uses_the_matching_nvcc_and_links_cudart(
    cuda_tf_build, monkeypatch
):
    home12 = fake_toolkit(cuda_tf_build.tmp / "cuda-12.5")
    found = [nvcc(13, 0), nvcc(12, 5, home=str(home12))]
    monkeypatch.setattr(ops_build, "find_nvccs", lambda: found)
    ops_build.build(cuda_tf_build.output, cuda="on")
    cmds = cuda_tf_build.commands
    nvcc_jobs = [c for c in cmds if c[0].endswith("nvcc")]
    _, cu = ops_build.sources()
    assert len(nvcc_jobs) == len(cu)
    assert {c[0] for c in nvcc_jobs} == {found[1].path}
    # TensorFlow's GPUs (sm_60 ... sm_89), not the default list.
    for job in nvcc_jobs:
        assert "-gencode=arch=compute_60,code=sm_60" in job
        assert "-gencode=arch=compute_90,code=compute_90" in job
        assert "-gencode=arch=compute_90,code=sm_90" not in job
    glue = [c for c in cmds if "-DGOOGLE_CUDA=1" in c]
    assert len(glue) == len(ops_build.sources()[0])
    assert all(f"-I{home12}/include" in c for c in glue)
    link = cmds[-1]
    assert "-shared" in link
    assert "-l:libcudart.so.12" in link
    assert f"-L{home12}/lib64" in link


def test_build_refuses_a_mismatched_nvcc(cuda_tf_build, monkeypatch, capsys):
    monkeypatch.setattr(ops_build, "find_nvccs", lambda: [nvcc(13, 0)])
    with pytest.raises(ops_build.BuildError, match="need nvcc 12.x"):
        ops_build.build(cuda_tf_build.output, cuda="on")
    # auto: the CPU kernels only, and says so.
    cuda_tf_build.commands.clear()
    ops_build.build(cuda_tf_build.output, cuda="auto")
    cmds = cuda_tf_build.commands
    assert not any("-DGOOGLE_CUDA=1" in c for c in cmds)
    assert not any(c[0].endswith("nvcc") for c in cmds)
    assert not any("libcudart" in " ".join(c) for c in cmds)
    err = capsys.readouterr().err
    assert "CPU kernels only" in err and "need nvcc 12.x" in err


def test_build_refuses_cuda_on_with_a_cpu_tensorflow(
    cuda_tf_build, monkeypatch
):
    config = ops_build._tf_config()
    cpu = ops_build.TfConfig(
        config.compile_flags, config.link_flags, CPU_INFO, config.package_dir
    )
    monkeypatch.setattr(ops_build, "_tf_config", lambda: cpu)
    monkeypatch.setattr(ops_build, "find_nvccs", pytest.fail)  # not asked
    with pytest.raises(ops_build.BuildError, match="not a CUDA build"):
        ops_build.build(cuda_tf_build.output, cuda="on")
    ops_build.build(cuda_tf_build.output, cuda="auto")
    assert not any("-DGOOGLE_CUDA=1" in c for c in cuda_tf_build.commands)


# ---------------------------------------------------------------------------
# The link check between the glue and the CUDA objects.
# ---------------------------------------------------------------------------


@pytest.mark.skipif(
    not (shutil.which("g++") and shutil.which("nm")), reason="needs g++, nm"
)
def test_missing_launchers_finds_a_declaration_that_drifted(tmp_path):
    decl = "namespace tfgc { namespace gpu { int Launch(%s n); } }\n"
    glue = tmp_path / "glue.cc"
    glue.write_text(decl % "int" + "int Use() { return tfgc::gpu::Launch(1); }")
    objs = {}
    for name, arg in (("good", "int"), ("drifted", "long")):
        src = tmp_path / f"{name}.cc"
        src.write_text(
            "namespace tfgc { namespace gpu { "
            f"int Launch({arg} n) {{ return n; }} }} }}\n"
        )
        objs[name] = str(tmp_path / f"{name}.o")
        subprocess.run(["g++", "-c", src, "-o", objs[name]], check=True)
    subprocess.run(["g++", "-c", glue, "-o", tmp_path / "g.o"], check=True)
    glue_obj = str(tmp_path / "g.o")
    assert ops_build.missing_launchers([glue_obj, objs["good"]]) == []
    assert ops_build.missing_launchers([glue_obj, objs["drifted"]]) == [
        "tfgc::gpu::Launch(int)"
    ]


# ---------------------------------------------------------------------------
# The loader's warning: a CUDA TensorFlow with a GPU and a CPU-only library.
# ---------------------------------------------------------------------------

FAKE_LIBRARY = types.SimpleNamespace(Tfgc_TopKSample=None, Tfgc_PackBits=None)


@pytest.fixture
def no_gpu_init(monkeypatch):
    """Fails the test if the check lists the GPUs."""

    def list_devices(kind=None):
        raise AssertionError(f"the check must not list devices ({kind})")

    monkeypatch.setattr(tf.config, "list_physical_devices", list_devices)


def test_no_warning_and_no_gpu_query_on_cpu_tensorflow(
    monkeypatch, no_gpu_init
):
    monkeypatch.setattr(tf.sysconfig, "get_build_info", lambda: CPU_INFO)
    assert _library.cpu_only_on_gpu_warning(FAKE_LIBRARY) is None


def test_no_gpu_query_when_the_library_has_gpu_kernels(
    monkeypatch, no_gpu_init
):
    monkeypatch.setattr(tf.sysconfig, "get_build_info", lambda: GPU_INFO)
    monkeypatch.setattr(_library, "ops_with_gpu_kernels", lambda ops: ops)
    assert _library.cpu_only_on_gpu_warning(FAKE_LIBRARY) is None


def test_warning_for_cpu_only_ops_on_a_gpu(monkeypatch):
    monkeypatch.setattr(tf.sysconfig, "get_build_info", lambda: GPU_INFO)
    monkeypatch.setattr(_library, "ops_with_gpu_kernels", lambda ops: [])
    gpus = ["/physical_device:GPU:0"]
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda kind=None: gpus
    )
    msg = _library.cpu_only_on_gpu_warning(FAKE_LIBRARY)
    assert "no GPU kernels" in msg and "1 GPU" in msg
    assert "CUDA 12.5.1" in msg
    assert "--cuda=on" in msg and "nvcc 12.x" in msg
    # Without a GPU there is nothing to warn about.
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda kind=None: []
    )
    assert _library.cpu_only_on_gpu_warning(FAKE_LIBRARY) is None


def _compiled_library():
    if not os.path.exists(_library.LIBRARY_PATH):
        pytest.skip("the compiled ops are not built")
    return tf.load_op_library(_library.LIBRARY_PATH)


def test_kernel_registry_query_on_the_real_library():
    module = _compiled_library()
    ops = _library._op_names(module)
    assert "Tfgc>TopKSample" in ops and "Tfgc>PackBits" in ops
    from tensorflow.python.framework import kernels

    for op in ops:  # the query finds the ops (an unknown name gives none)
        devices = {
            k.device_type
            for k in kernels.get_registered_kernels_for_op(op).kernel
        }
        assert "CPU" in devices, op
    if not tf.sysconfig.get_build_info().get("is_cuda_build"):
        assert _library.ops_with_gpu_kernels(ops) == []


def test_loader_warns_once_for_cpu_only_ops_on_a_gpu():
    _compiled_library()
    code = textwrap.dedent(
        f"""
        import warnings
        import tensorflow as tf
        tf.sysconfig.get_build_info = lambda: {GPU_INFO!r}
        tf.config.list_physical_devices = lambda kind=None: ["GPU:0"]
        from tfgc import ops
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert ops.using_custom_ops()
            assert ops.using_custom_ops()
        msgs = [str(w.message) for w in caught]
        assert len(msgs) == 1, msgs
        assert "no GPU kernels" in msgs[0], msgs
        print("OK")
        """
    )
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(_library.DISABLE_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout


# ---------------------------------------------------------------------------
# The compile check CI runs.
# ---------------------------------------------------------------------------


def _need(what, fix):
    message = f"{what} not found; {fix}"
    if os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0"):
        pytest.fail(f"{REQUIRE_ENV}=1: {message}")
    pytest.skip(message)


@pytest.mark.slow
def test_google_cuda_glue_and_cuda_kernels_compile_and_link():
    info = tf.sysconfig.get_build_info()
    cuda = ops_build.tf_cuda_version(info)
    major = int(cuda.split(".")[0]) if cuda else None
    tf_include = tf.sysconfig.get_include()
    if ops_build.find_cuda_headers(major, tf_include) is None:
        _need(
            "CUDA headers",
            "`pip install nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12` "
            f"(scripts/setup.sh does with {REQUIRE_ENV}=1)",
        )
    if not ops_build.find_nvccs():
        _need("nvcc", "install a CUDA toolkit or set CUDA_HOME")
    summary = ops_build.check_glue_and_cuda()
    assert "every launcher the glue calls is defined" in summary


def test_gencodes_follow_tensorflows_compute_capabilities():
    got = ops_build.gencodes(["sm_70", "sm_80", "compute_90"])
    assert got == [
        "-gencode=arch=compute_70,code=sm_70",
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    assert ops_build.gencodes(["sm_60", "sm_89"])[-1] == (
        "-gencode=arch=compute_89,code=compute_89"
    )
    assert ops_build.gencodes(None) == ops_build.GENCODES
    assert ops_build.gencodes([]) == ops_build.GENCODES
    with pytest.raises(ops_build.BuildError, match="cuda_compute_cap"):
        ops_build.gencodes(["8.0"])
