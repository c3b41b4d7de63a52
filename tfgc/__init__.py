"""tfgc: gradient compression for Keras 3 multi-worker training.

    opt = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9),
        compressor=tfgc.compressors.TopK(density=0.01))

Importing tfgc also fixes Keras 3 `model.fit` under
MultiWorkerMirroredStrategy (see `tfgc._keras_compat`).
"""

from tfgc import _keras_compat

_keras_compat.check_versions()

from tfgc import callbacks, communicators, compressors, ops  # noqa: E402
from tfgc.optimizers import CompressedOptimizer  # noqa: E402

patch_keras_multi_worker_fit = _keras_compat.patch_multi_worker_fit
patch_keras_multi_worker_fit()

__version__ = "0.1.0"

__all__ = [
    "CompressedOptimizer",
    "callbacks",
    "communicators",
    "compressors",
    "ops",
    "patch_keras_multi_worker_fit",
]
