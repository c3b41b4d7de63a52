"""Compressors by name: `get("topk", density=0.01)`, `names()`.

Every compressor class registers here; `tfgc.compressors` adds `Auto`
(`register`), which itself resolves its candidates' names here.
"""

from __future__ import annotations

import difflib

import keras

from tfgc.compressors.acpsgd import ACPSGD
from tfgc.compressors.dense import BF16, FP16, Identity
from tfgc.compressors.importance import ImportancePruning
from tfgc.compressors.mstopk import MSTopK
from tfgc.compressors.powersgd import PowerSGD
from tfgc.compressors.randomk import RandomK
from tfgc.compressors.redsync import RedSync
from tfgc.compressors.sbc import SBC
from tfgc.compressors.sign import SignSGD
from tfgc.compressors.topk import TopK
from tfgc.core.compressor import Compressor

_BY_NAME = {
    "identity": Identity,
    "none": Identity,
    "fp16": FP16,
    "bf16": BF16,
    "topk": TopK,
    "mstopk": MSTopK,
    "redsync": RedSync,
    "randomk": RandomK,
    "signsgd": SignSGD,
    "sign": SignSGD,
    "powersgd": PowerSGD,
    "acpsgd": ACPSGD,
    "sbc": SBC,
    "importance": ImportancePruning,
}


def names() -> list[str]:
    """The names `get` accepts."""
    return sorted(_BY_NAME)


def get(identifier, **kwargs) -> Compressor:
    """Returns a compressor from a name, a Keras config dict or an instance.

    Args:
        identifier: a name such as "topk" (case and "-"/"_" ignored), a dict
            from `keras.saving.serialize_keras_object`, or a `Compressor`.
        **kwargs: constructor arguments, with a name only; checked as the
            class checks them (`TopK(densty=0.1)` names `density`).
    """
    if isinstance(identifier, Compressor):
        if kwargs:
            raise ValueError(
                "Keyword arguments go with a compressor name, not an "
                f"instance. Received: {identifier!r} and {kwargs}"
            )
        return identifier
    if isinstance(identifier, dict):
        return keras.saving.deserialize_keras_object(identifier)
    if isinstance(identifier, str):
        key = identifier.lower().replace("-", "").replace("_", "")
        if key in _BY_NAME:
            return _BY_NAME[key](**kwargs)
    close = ""
    if isinstance(identifier, str):
        match = difflib.get_close_matches(identifier.lower(), names(), n=1)
        close = f"Did you mean {match[0]!r}? " if match else ""
    raise ValueError(
        f"Unknown compressor {identifier!r}. {close}Use one of {names()}, a "
        "tfgc.compressors.Compressor instance, or a Keras config dict."
    )


def register(name: str, cls) -> None:
    """Makes `get(name)` build `cls` (a name of lower-case letters)."""
    _BY_NAME[name] = cls
