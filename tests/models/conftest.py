"""Shared helpers for the tests of the training mains in `models/`."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from models.common import training
from models.lstm_lm import shared_subset_dir

REPO = Path(__file__).resolve().parents[2]
PTB_SUBSET = Path(shared_subset_dir())


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


@pytest.fixture
def run_and_check_precision(monkeypatch):
    """Runs a main's `run(config)` and checks the precision it trained in.

    Returns `check(run, config) -> (summary, model)`: it calls
    `run(config)`, takes the model the main passed to
    `training.train_and_evaluate`, and asserts that the model computed in
    `config.common.precision` with float32 logits, that the loss is finite,
    that the global policy is float32 again afterwards, that the summary
    records the precision, and that "mixed_float16" (alone) trained through
    a `LossScaleOptimizer` around the `CompressedOptimizer`.
    """
    models = []
    original = training.train_and_evaluate

    def recording(**kwargs):
        models.append(kwargs["model"])
        return original(**kwargs)

    monkeypatch.setattr(training, "train_and_evaluate", recording)

    def check(run, config):
        precision = config.common.precision
        summary = run(config)
        (model,) = models
        assert keras.mixed_precision.global_policy().name == "float32"
        assert model.dtype_policy.name == precision
        half = precision.removeprefix("mixed_")
        assert any(layer.compute_dtype == half for layer in model.layers)
        assert model.get_layer("logits").compute_dtype == "float32"
        assert summary["precision"] == precision
        assert summary["config"]["precision"] == precision
        assert np.isfinite(summary["train"]["loss"])
        # The compression stats are found inside the LossScaleOptimizer.
        assert summary["bytes_per_step"]["compression_ratio"] > 1
        optimizer = model.optimizer
        if precision == "mixed_float16":
            assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            optimizer = optimizer.inner_optimizer
            assert summary["loss_scale"] > 0
        else:
            assert summary["loss_scale"] is None
        assert isinstance(optimizer, tfgc.CompressedOptimizer)
        return summary, model

    return check


def saved_weights(path) -> dict[str, np.ndarray]:
    """Every array of a Keras `.weights.h5` file, by its path in it."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, item: (
                out.__setitem__(name, item[()])
                if isinstance(item, h5py.Dataset)
                else None
            )
        )
    return out


def batch_summary_steps(model_dir) -> list[int]:
    """The steps of every `batch/loss` scalar in the TensorBoard files."""
    steps = []
    for path in sorted((model_dir / "tensorboard" / "train").glob("events.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "batch/loss":
                    steps.append(event.step)
    return steps
