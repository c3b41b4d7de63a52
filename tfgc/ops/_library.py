"""Loads the compiled custom ops, or says why the pure-TF fallback is used.

The library `_tfgc_ops.so` next to this file is built by `pip install
--no-build-isolation .` (or `-e .`) or by `python -m custom_ops.build`. When
it is missing or fails to load, every op in `tfgc.ops` runs its pure-TF
reference and one warning says why. `TFGC_DISABLE_CUSTOM_OPS=1` forces the
reference (read at every call, so tests can flip it).

When TensorFlow is a CUDA build and sees a GPU but the library has no GPU
kernels (it was built without nvcc, or with tensorflow-cpu), one warning
says so when the library loads: TensorFlow would silently run every tfgc op
on the CPU. The check asks TensorFlow's kernel registry first and lists the
GPUs only then, so CPU builds of TensorFlow never initialise a GPU here.

While XLA compiles the graph being traced (`compiling_with_xla`), the
compiled ops are not used either: they have no XLA kernels. The choice is
made in Python while tracing, so it adds nothing to the graph.
"""

from __future__ import annotations

import os
import threading
import types
import warnings

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

DISABLE_ENV = "TFGC_DISABLE_CUSTOM_OPS"
LIBRARY_PATH = os.path.join(os.path.dirname(__file__), "_tfgc_ops.so")

_lock = threading.Lock()
_state: dict[str, object] = {"tried": False, "module": None, "error": None}


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )


def _load() -> types.ModuleType | None:
    with _lock:
        if _state["tried"]:
            return _state["module"]  # type: ignore[return-value]
        _state["tried"] = True
        if not os.path.exists(LIBRARY_PATH):
            _state["error"] = f"{LIBRARY_PATH} does not exist"
            hint = (
                "Build it with `pip install --no-build-isolation -e .` or "
                "`python -m custom_ops.build` in the tfgc source tree."
            )
        else:
            try:
                module = tf.load_op_library(LIBRARY_PATH)
            except Exception as e:  # noqa: BLE001 - any failure falls back
                _state["error"] = f"{type(e).__name__}: {e}"
                hint = (
                    "Rebuild it against the installed TensorFlow with "
                    "`python -m custom_ops.build`."
                )
            else:
                _register_no_gradients(module)
                _state["module"] = module
                try:
                    cpu_only = cpu_only_on_gpu_warning(module)
                except Exception as e:  # noqa: BLE001 - ops work regardless
                    cpu_only = f"tfgc: could not look for GPU kernels: {e!r}"
                if cpu_only:
                    warnings.warn(cpu_only, RuntimeWarning, stacklevel=3)
                return module
        warnings.warn(
            "tfgc: custom ops are not available "
            f"({_state['error']}); using the pure-TensorFlow reference ops, "
            f"which are slower. {hint}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _op_names(module: types.ModuleType) -> list[str]:
    """The ops of the library, as registered ("Tfgc>TopKSample")."""
    # The generated module exposes each op `Tfgc>Name` as `Tfgc_Name`.
    prefix = "Tfgc_"
    return [
        "Tfgc>" + attr[len(prefix) :]
        for attr in dir(module)
        if attr.startswith(prefix)
    ]


def _register_no_gradients(module: types.ModuleType) -> None:
    """Marks every op of the library as not differentiable (idempotent)."""
    for op in _op_names(module):
        try:
            tf.no_gradient(op)
        except KeyError:  # already registered, e.g. by another module
            pass


def ops_with_gpu_kernels(ops: list[str]) -> list[str]:
    """Those of `ops` with a GPU kernel registered (asks no device)."""
    from tensorflow.python.framework import kernels  # noqa: PLC0415

    return [
        op
        for op in ops
        if any(
            k.device_type == "GPU"
            for k in kernels.get_registered_kernels_for_op(op).kernel
        )
    ]


def cpu_only_on_gpu_warning(module: types.ModuleType) -> str | None:
    """The warning for a CPU-only library in a process with a GPU, or None.

    None unless TensorFlow is a CUDA build, none of the library's ops has a
    GPU kernel, and TensorFlow sees a GPU (asked last, so that CPU builds
    of TensorFlow and libraries with GPU kernels initialise no GPU).
    """
    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build", False):
        return None
    ops = _op_names(module)
    if not ops or ops_with_gpu_kernels(ops):
        return None
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    cuda = info.get("cuda_version", "?")
    return (
        f"tfgc: TensorFlow (a CUDA {cuda} build) sees {len(gpus)} GPU(s), "
        f"but tfgc's compiled ops ({LIBRARY_PATH}) have no GPU kernels, so "
        "TensorFlow runs every tfgc op on the CPU and copies the gradients "
        "to the host and back at every step. Rebuild them with CUDA: "
        "`python -m custom_ops.build --cuda=on` in the tfgc source tree "
        f"(needs nvcc {str(cuda).split('.')[0]}.x; the command says what is "
        "missing)."
    )


def compiling_with_xla() -> bool:
    """Whether the graph being traced is compiled by XLA.

    True inside `tf.function(jit_compile=True)` (as `model.compile(
    jit_compile=True)` makes Keras's train step), including its `tf.cond`
    and `tf.switch_case` branches, loops, `strategy.run` replicas and the
    functions it calls; False in eager mode and in graphs TensorFlow runs
    itself.
    """
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return control_flow_util.GraphOrParentsInXlaContext(graph)


def refuse_xla(reason: str, data_dependent_shape: bool = True) -> None:
    """Raises while tracing for XLA a step that XLA cannot compile.

    Args:
        reason: what cannot be compiled, as a clause, e.g.
            "tfgc.ops.golomb_encode writes a stream whose length depends
            on the data".
        data_dependent_shape: the reason is a shape known only at run
            time (the message then says that XLA needs static shapes).

    Raises:
        ValueError: `compiling_with_xla()` is true; the message gives
            `reason` and the fix.
    """
    if not compiling_with_xla():
        return
    if data_dependent_shape:
        reason += ", and XLA needs every shape before the step runs"
    raise ValueError(
        f"XLA cannot compile this step: {reason}. Train without XLA: "
        "`model.compile(..., jit_compile=False)` (Keras's default "
        "jit_compile='auto' turns XLA on for one GPU without a distribution "
        "strategy), or `tf.function(jit_compile=False)`."
    )


# Not converted by AutoGraph when a user's tf.function calls an op: the
# loader's file checks come from frozen standard-library modules, whose
# source AutoGraph cannot read, and it said so in a warning.
@tf.autograph.experimental.do_not_convert
def custom_ops() -> types.ModuleType | None:
    """Returns the loaded op library, or None to use the references.

    None also while XLA compiles the graph being traced: the compiled ops
    have no XLA kernels, and the references compile.
    """
    if _disabled() or compiling_with_xla():
        return None
    return _load()


def using_custom_ops() -> bool:
    """Whether `tfgc.ops` functions run the compiled custom ops.

    False when `TFGC_DISABLE_CUSTOM_OPS=1` is set, the library is missing
    or does not load (a warning then says why), or XLA compiles the graph
    being traced (`compiling_with_xla`).
    """
    return custom_ops() is not None


def selects_segments_on_gpu() -> bool:
    """Whether `top_k_sample_segments` runs the compiled op on a GPU: the
    library is loaded with GPU kernels and TensorFlow sees a GPU (asked
    last, so that CPU-only libraries initialise no GPU)."""
    return (
        custom_ops() is not None
        and bool(ops_with_gpu_kernels(["Tfgc>TopKSampleSegments"]))
        and bool(tf.config.list_logical_devices("GPU"))
    )


def load_error() -> str | None:
    """Why the library did not load, or None (also before the first try)."""
    return _state["error"]  # type: ignore[return-value]
