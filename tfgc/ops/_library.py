"""Loads the compiled custom ops, or says why the pure-TF fallback is used.

The library `_tfgc_ops.so` next to this file is built by `pip install
--no-build-isolation .` (or `-e .`) or by `python -m custom_ops.build`. When
it is missing or fails to load, every op in `tfgc.ops` runs its pure-TF
reference and one warning says why. `TFGC_DISABLE_CUSTOM_OPS=1` forces the
reference (read at every call, so tests can flip it).
"""

from __future__ import annotations

import os
import threading
import types
import warnings

import tensorflow as tf

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
                return module
        warnings.warn(
            "tfgc: custom ops are not available "
            f"({_state['error']}); using the pure-TensorFlow reference ops, "
            f"which are slower. {hint}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _register_no_gradients(module: types.ModuleType) -> None:
    """Marks every op of the library as not differentiable (idempotent)."""
    # The generated module exposes each op `Tfgc>Name` as `Tfgc_Name`.
    for attr in dir(module):
        if not attr.startswith("Tfgc_"):
            continue
        try:
            tf.no_gradient("Tfgc>" + attr[len("Tfgc_") :])
        except KeyError:  # already registered, e.g. by another module
            pass


def custom_ops() -> types.ModuleType | None:
    """Returns the loaded op library, or None to use the references."""
    if _disabled():
        return None
    return _load()


def using_custom_ops() -> bool:
    """Whether `tfgc.ops` functions run the compiled custom ops.

    False when `TFGC_DISABLE_CUSTOM_OPS=1` is set or the library is missing
    or does not load (a warning then says why).
    """
    return custom_ops() is not None


def load_error() -> str | None:
    """Why the library did not load, or None (also before the first try)."""
    return _state["error"]  # type: ignore[return-value]
