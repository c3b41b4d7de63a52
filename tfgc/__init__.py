"""tfgc: gradient compression for Keras 3 multi-worker training.

    opt = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9),
        compressor=tfgc.compressors.TopK(density=0.01))

tfgc also fixes Keras 3 `model.fit` under MultiWorkerMirroredStrategy (see
`tfgc._keras_compat`). The package loads lazily, so that `tfgc.launch`
starts without TensorFlow: `import tfgc` loads tfgc's modules (and installs
the fix) at once when TensorFlow is already imported, and otherwise at the
first use of a public name such as `tfgc.CompressedOptimizer`.
"""

from __future__ import annotations

import importlib
import sys

__version__ = "0.1.0"

# Public names that need TensorFlow, and the module each comes from.
_LAZY = {
    "CompressedOptimizer": "tfgc.optimizers",
    "callbacks": "tfgc.callbacks",
    "communicators": "tfgc.communicators",
    "compressors": "tfgc.compressors",
    "ops": "tfgc.ops",
    "optimizers": "tfgc.optimizers",
    "patch_keras_multi_worker_fit": "tfgc._keras_compat",
}

__all__ = [
    "CompressedOptimizer",
    "callbacks",
    "communicators",
    "compressors",
    "ops",
    "patch_keras_multi_worker_fit",
]


def _load() -> None:
    """Imports the TensorFlow side of tfgc and installs the `fit` fix."""
    from tfgc import _keras_compat

    _keras_compat.check_versions()
    namespace = globals()
    for name, module in _LAZY.items():
        if name == "patch_keras_multi_worker_fit":
            value = _keras_compat.patch_multi_worker_fit
        else:
            value = importlib.import_module(module)
            if name == "CompressedOptimizer":
                value = value.CompressedOptimizer
        namespace[name] = value
    _keras_compat.patch_multi_worker_fit()


def __getattr__(name: str):
    if name in _LAZY:
        _load()
        return globals()[name]
    raise AttributeError(f"module 'tfgc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# Code that already imported TensorFlow gets everything at `import tfgc`,
# as before; that costs no more than tfgc's own modules.
if "tensorflow" in sys.modules:
    _load()
