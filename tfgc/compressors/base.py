"""Helpers the compressors share: argument checks, k from a density, the
base class of density-driven compressors and their Keras registration.

The contract itself (`Compressor`, `Spec`, the collective kinds) is
`tfgc.core`.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from tfgc import _arguments
from tfgc.core.compressor import Compressor
from tfgc.core.wire import num_elements


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """Validates an integer argument >= `minimum` and returns it."""
    return _arguments.check_int(name, value, minimum)


def check_density(density) -> float:
    """Validates a `density` argument and returns it as a float.

    Only a number is accepted (a string is refused, as for every numeric
    argument of tfgc).
    """
    requirement = (
        "a number in (0, 1], the fraction of elements to send (0.01 sends 1 %)"
    )
    value = _arguments.check_number("density", density, requirement)
    if not 0.0 < value <= 1.0:
        raise ValueError(
            f"`density` must be {requirement}. Received: density={density!r}"
        )
    return value


#: The gradient dtypes that `tfgc.ops.top_k_sample` selects from.
SELECTION_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def check_selection_dtype(owner: str, dtype) -> None:
    """Refuses a gradient dtype that `tfgc.ops.top_k_sample` cannot select
    from, naming what to use instead."""
    dtype = tf.as_dtype(dtype)
    if dtype not in SELECTION_DTYPES:
        raise ValueError(
            "`dtype` must be float32, float16 or bfloat16: "
            f"{owner} selects with tfgc.ops.top_k_sample. Received: "
            f"dtype={dtype.name}. Keep the variable in float32, or use "
            "TopK, which takes float64 too."
        )


def num_selected(n: int, density: float) -> int:
    """k = ceil(density * n), at least 1 for a non-empty tensor."""
    if n == 0:
        return 0
    return max(1, min(n, math.ceil(density * n)))


class DensityCompressor(Compressor):
    """Base for compressors that send k = ceil(density * n) entries.

    Args:
        density: fraction of entries to send, in (0, 1].
    """

    def __init__(self, density: float = 0.01):
        self.density = check_density(density)

    def num_selected(self, shape) -> int:
        return num_selected(num_elements(shape), self.density)

    def get_config(self):
        return {"density": self.density}


def register(cls):
    """Registers a compressor for Keras serialization under `tfgc>`."""
    return keras.saving.register_keras_serializable(package="tfgc")(cls)
