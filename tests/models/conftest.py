"""Shared helpers for the tests of the training mains in `models/`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PTB_SUBSET = Path(
    os.environ.get("TFGC_PTB_SUBSET", REPO.parent / "shared/data/ptb-subset")
)


@pytest.fixture(scope="session")
def ptb_dir(tmp_path_factory) -> Path:
    """The PTB subset with its test split doubling as the validation split.

    The subset has no `ptb.valid.txt`; copying into a temporary directory
    keeps the shared data untouched.
    """
    if not (PTB_SUBSET / "ptb.train.txt").is_file():
        pytest.skip(f"PTB subset not found at {PTB_SUBSET}")
    out = tmp_path_factory.mktemp("ptb")
    shutil.copy(PTB_SUBSET / "ptb.train.txt", out / "ptb.train.txt")
    shutil.copy(PTB_SUBSET / "ptb.test.txt", out / "ptb.test.txt")
    shutil.copy(PTB_SUBSET / "ptb.test.txt", out / "ptb.valid.txt")
    return out
