"""Keras callbacks: what compression saves (`CompressionStats`), the
planner's choices in TensorBoard (`PlanSummary`), and crash-safe backups
that keep every worker's compressor state (`BackupAndRestore`)."""

from tfgc.callbacks.backup import (
    METADATA_FILE,
    BackupAndRestore,
    BackupError,
    BackupState,
)
from tfgc.callbacks.files import atomic_file, write_json_atomically
from tfgc.callbacks.plan import PlanSummary
from tfgc.callbacks.statistics import CompressionStats

__all__ = [
    "METADATA_FILE",
    "BackupAndRestore",
    "BackupError",
    "BackupState",
    "CompressionStats",
    "PlanSummary",
    "atomic_file",
    "write_json_atomically",
]
