"""End-to-end runs of `models.lstm_lm.main` in one process."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

import tfgc
from models.common import callbacks as callbacks_lib
from models.common import training
from models.common.config import CommonConfig
from models.lstm_lm import data
from models.lstm_lm import main as lstm_main

FLAGS = flags.FLAGS


def test_main_synthetic_writes_summary_and_summaries(tmp_path, capsys):
    model_dir = tmp_path / "model"
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(
            [
                "prog",
                "--use_synthetic_data",
                "--train_steps=4",
                "--epochs=2",
                "--log_steps=2",
                "--batch_size=4",
                "--distribution_strategy=one_device",
                "--compressor=topk",
                "--density=0.01",
                f"--model_dir={model_dir}",
            ]
        )
        lstm_main.main(["prog"])
    out = capsys.readouterr().out
    assert "valid perplexity:" in out and "test perplexity:" in out

    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["train_steps"] == 4
    assert summary["steps_per_epoch"] == 2
    assert summary["num_replicas"] == 1
    assert summary["global_batch_size"] == 4
    bytes_per_step = summary["bytes_per_step"]
    assert 0 < bytes_per_step["compressed"] < bytes_per_step["dense"]
    assert summary["examples_per_second"] > 0
    assert summary["tokens_per_second"] > 0
    for split in ("valid", "test"):
        result = summary["eval"][split]
        assert np.isclose(result["perplexity"], np.exp(result["loss"]))
    assert len(summary["history"]["perplexity"]) == 2
    # TensorBoard event files for training and evaluation.
    assert list((model_dir / "tensorboard" / "train").glob("events.*"))
    assert list((model_dir / "tensorboard" / "eval").glob("events.*"))
    # The backup is removed after a run that finished.
    assert not (model_dir / "backup").exists()


def test_vocab_and_windows(ptb_dir):
    corpus = data.load_corpus(str(ptb_dir))
    words = data.read_words(str(ptb_dir / "ptb.train.txt"))
    assert words.count(data.EOS) == len(
        (ptb_dir / "ptb.train.txt").read_text().splitlines()
    )
    assert corpus.vocab_size == len(set(words))
    x, y = data.windows(corpus.train, 35)
    assert x.shape == y.shape == (len(corpus.train) // 35, 35) or (
        x.shape == y.shape == ((len(corpus.train) - 1) // 35, 35)
    )
    np.testing.assert_array_equal(x[0, 1:], y[0, :-1])
    np.testing.assert_array_equal(x[1, 0], y[0, -1])


def test_ptb_subset_perplexity_falls(ptb_dir, tmp_path):
    config = lstm_main.LstmConfig(
        common=CommonConfig(
            model_dir=str(tmp_path / "model"),
            data_dir=str(ptb_dir),
            train_steps=30,
            epochs=3,
            eval_steps=4,
            log_steps=10,
            distribution_strategy="one_device",
            compressor="topk",
            density=0.05,
        ),
        size="small",
    )
    summary = lstm_main.run(config)
    perplexity = summary["history"]["perplexity"]
    assert len(perplexity) == 3
    # The untrained model is near uniform over the vocabulary.
    assert perplexity[0] > 0.5 * summary["model_config"]["vocab_size"]
    assert perplexity[-1] < 0.5 * perplexity[0], perplexity
    assert summary["eval"]["valid"]["perplexity"] < perplexity[0]
    assert summary["eval"]["test"]["perplexity"] < perplexity[0]


def test_ptb_subset_redsync_one_process(ptb_dir, tmp_path, monkeypatch):
    """`--compressor=redsync` through the main: the LSTM's plain SGD gives
    RedSync momentum 0, and with one worker its cost model sends every
    gradient dense (there is nothing to communicate)."""
    built = []
    original = training.compressed_optimizer

    def recording(config, inner):
        built.append(original(config, inner))
        return built[-1]

    monkeypatch.setattr(training, "compressed_optimizer", recording)
    config = lstm_main.LstmConfig(
        common=CommonConfig(
            model_dir=str(tmp_path / "model"),
            data_dir=str(ptb_dir),
            train_steps=20,
            epochs=2,
            eval_steps=2,
            log_steps=10,
            distribution_strategy="one_device",
            compressor="redsync",
            density=0.01,
            selection="trimmed",
        ),
        size="small",
    )
    summary = lstm_main.run(config)
    (optimizer,) = built
    assert isinstance(optimizer.compressor, tfgc.compressors.RedSync)
    assert optimizer.compressor.momentum == 0.0
    assert optimizer.compressor.selection == "trimmed"
    assert optimizer.inner_optimizer.momentum == 0.0
    assert summary["config"]["compressor"] == "redsync"
    assert summary["bytes_per_step"]["compression_ratio"] == 1.0
    perplexity = summary["history"]["perplexity"]  # epoch means
    assert perplexity[-1] < perplexity[0], perplexity
    # Measured: epoch means 7405, 5003; valid 2147 after the 20 steps.
    valid = summary["eval"]["valid"]["perplexity"]
    assert valid < 0.5 * perplexity[0], (valid, perplexity)


def _tiny_synthetic_config(tmp_path, **kwargs) -> lstm_main.LstmConfig:
    """The small LSTM on random tokens: batch 2, one device, no eval."""
    return lstm_main.LstmConfig(
        common=CommonConfig(
            model_dir=str(tmp_path / "model"),
            use_synthetic_data=True,
            batch_size=2,
            skip_eval=True,
            distribution_strategy="one_device",
            **kwargs,
        )
    )


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_synthetic_mixed_precision(
    tmp_path, run_and_check_precision, precision
):
    config = _tiny_synthetic_config(
        tmp_path,
        train_steps=2,
        compressor="topk",
        density=0.01,
        precision=precision,
    )
    _, lm = run_and_check_precision(lstm_main.run, config)
    half = precision.removeprefix("mixed_")
    (embedding,) = [
        layer
        for layer in lm.layers
        if isinstance(layer, keras.layers.Embedding)
    ]
    for layer in (embedding, lm.get_layer("lstm_0"), lm.get_layer("lstm_1")):
        assert layer.compute_dtype == half, layer.name
    # Embedding and LSTM weights stay float32; the logits are float32.
    assert all(w.dtype == "float32" for w in lm.trainable_weights)
    assert lm.outputs[0].dtype == "float32"


class _Preempted(Exception):
    pass


def test_restarted_run_resumes_from_backup(tmp_path, monkeypatch):
    config = _tiny_synthetic_config(
        tmp_path, train_steps=3, epochs=3, compressor="randomk", density=0.1
    )
    original = callbacks_lib.Throughput.on_epoch_end

    def preempt_in_second_epoch(self, epoch, logs=None):
        original(self, epoch, logs)
        if epoch == 1:
            raise _Preempted()

    monkeypatch.setattr(
        callbacks_lib.Throughput, "on_epoch_end", preempt_in_second_epoch
    )
    with pytest.raises(_Preempted):
        lstm_main.run(config)
    backup = tmp_path / "model" / "backup"
    metadata = json.loads((backup / "training_metadata.json").read_text())
    assert metadata["epoch"] == 1  # epoch 0 was saved, epoch 1 was not

    monkeypatch.setattr(callbacks_lib.Throughput, "on_epoch_end", original)
    summary = lstm_main.run(config)
    # Only epochs 1 and 2 ran after the restart.
    assert summary["train_steps"] == 2
    assert len(summary["history"]["loss"]) == 2
    assert not backup.exists()


def test_skip_eval_needs_only_the_training_split(tmp_path, ptb_dir):
    """The shared subset layout (no ptb.valid.txt) trains with --skip_eval
    and is refused, naming the missing file and the flag, without it."""
    only_train = tmp_path / "ptb"
    only_train.mkdir()
    (only_train / "ptb.train.txt").write_text(
        (ptb_dir / "ptb.train.txt").read_text()
    )

    def config(skip_eval):
        return lstm_main.LstmConfig(
            common=CommonConfig(
                model_dir=str(tmp_path / "model"),
                data_dir=str(only_train),
                batch_size=2,
                train_steps=1,
                skip_eval=skip_eval,
                distribution_strategy="one_device",
            )
        )

    with pytest.raises(ValueError, match="ptb.valid.txt.*--skip_eval"):
        config(skip_eval=False)
    summary = lstm_main.run(config(skip_eval=True))
    assert summary["train_steps"] == 1
    assert "valid" not in summary.get("eval", {})
    # The vocabulary comes from the training split alone.
    with_evals = data.load_corpus(str(ptb_dir))
    without = data.load_corpus(str(only_train), eval_splits=())
    assert without.evals == {}
    assert without.vocab_size == with_evals.vocab_size
    np.testing.assert_array_equal(without.train, with_evals.train)
