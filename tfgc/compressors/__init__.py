"""Gradient compressors: pure tensor math, no variables, no collectives.

Use a class directly (`TopK(density=0.01)`) or by name
(`get("topk", density=0.01)`).
"""

from __future__ import annotations

from tfgc.compressors.acpsgd import ACPSGD
from tfgc.compressors.auto import Auto
from tfgc.compressors.base import check_density
from tfgc.compressors.dense import BF16, FP16, DenseWarmup, Identity
from tfgc.compressors.error_feedback import ErrorFeedback
from tfgc.compressors.importance import ImportancePruning
from tfgc.compressors.mstopk import MSTopK
from tfgc.compressors.powersgd import PowerSGD
from tfgc.compressors.randomk import RandomK
from tfgc.compressors.redsync import RedSync
from tfgc.compressors.registry import get, names, register
from tfgc.compressors.sbc import SBC
from tfgc.compressors.sign import SignSGD
from tfgc.compressors.topk import TopK
from tfgc.core.compressor import Compressor, Network, Spec, StepInfo
from tfgc.core.cost_model import CostModel
from tfgc.core.wire import (
    ALL_GATHER,
    ALL_GATHER_RAGGED,
    ALL_REDUCE,
    BROADCAST,
)

register("auto", Auto)

__all__ = [
    "ACPSGD",
    "ALL_GATHER",
    "ALL_GATHER_RAGGED",
    "ALL_REDUCE",
    "Auto",
    "BF16",
    "BROADCAST",
    "Compressor",
    "CostModel",
    "DenseWarmup",
    "ErrorFeedback",
    "FP16",
    "Identity",
    "ImportancePruning",
    "MSTopK",
    "Network",
    "PowerSGD",
    "RandomK",
    "RedSync",
    "SBC",
    "SignSGD",
    "Spec",
    "StepInfo",
    "TopK",
    "check_density",
    "get",
    "names",
]
