"""End-to-end runs of `models.lstm_lm.main` in one process."""

from __future__ import annotations

import json
import logging
import os
import signal

import keras
import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

import tfgc
from models.common import callbacks as callbacks_lib
from models.common import stopping, training
from models.common.config import CommonConfig
from models.lstm_lm import data
from models.lstm_lm import main as lstm_main
from tests.models.conftest import REPO, batch_summary_steps, saved_weights

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
    # Epochs 1 and 2 ran after the restart; the summary covers all three.
    assert summary["train_steps"] == 3
    assert len(summary["history"]["loss"]) == 3
    assert summary["finished"] is True
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


def _ptb_config(ptb_dir, model_dir, **kwargs) -> lstm_main.LstmConfig:
    """The small LSTM on the PTB subset: batch 4, 3 epochs of 2 steps."""
    settings = dict(
        model_dir=str(model_dir),
        data_dir=str(ptb_dir),
        batch_size=4,
        train_steps=6,
        epochs=3,
        log_steps=1,
        skip_eval=True,
        distribution_strategy="one_device",
        compressor="topk",
        density=0.01,
    )
    settings.update(kwargs)
    return lstm_main.LstmConfig(common=CommonConfig(**settings))


class _Crash(Exception):
    pass


def _signal_at(monkeypatch, step, signum):
    """Makes the run send itself `signum` after its global step `step`
    (crash, with `_Crash`, for `signum=None`)."""
    original = callbacks_lib.Throughput.on_train_batch_end

    def signalling(self, batch, logs=None):
        original(self, batch, logs)
        if self.step == step and signum is None:
            raise _Crash()
        if self.step == step:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(
        callbacks_lib.Throughput, "on_train_batch_end", signalling
    )
    return lambda: monkeypatch.setattr(
        callbacks_lib.Throughput, "on_train_batch_end", original
    )


def test_signals_stop_with_a_backup_and_the_resume_is_exact(
    ptb_dir, tmp_path, monkeypatch
):
    """SIGINT in an epoch's last step (the epoch ends first), SIGTERM
    inside an epoch, then a crash in the last step (before its backup)
    with `--backup_steps=1`: each signal stop saves a backup and exits
    128 + the signal; the rerun ends with the weights of the run that
    never stopped, bit for bit, and its summary and TensorBoard steps
    cover all epochs once."""
    through = lstm_main.run(_ptb_config(ptb_dir, tmp_path / "through"))
    model_dir = tmp_path / "stopped"
    config = _ptb_config(ptb_dir, model_dir)
    backup = tfgc.callbacks.BackupAndRestore(str(model_dir / "backup"))

    # (1, 0): after epoch 1 (its last step); (1, 1): inside epoch 2; (2, 1):
    # the periodic backup of step 5, inside epoch 3.
    stops = [
        (2, signal.SIGINT, (1, 0), config),
        (3, signal.SIGTERM, (1, 1), config),
        (6, None, (2, 1), _ptb_config(ptb_dir, model_dir, backup_steps=1)),
    ]
    for step, signum, position, stopped_config in stops:
        restore = _signal_at(monkeypatch, step, signum)
        expected = stopping.Stopped if signum else _Crash
        with pytest.raises(expected) as stopped:
            lstm_main.run(stopped_config)
        if signum:
            assert stopped.value.code == 128 + signum
        assert backup.find_backup()[:2] == position
        restore()
    summary = lstm_main.run(config)

    expected = saved_weights(tmp_path / "through" / "model.weights.h5")
    got = saved_weights(model_dir / "model.weights.h5")
    assert expected.keys() == got.keys() and expected
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], name)
    assert summary["train_steps"] == through["train_steps"] == 6
    for key, values in through["history"].items():
        if key in ("loss", "perplexity"):
            # Epoch 2's mean is folded from two parts: float rounding.
            np.testing.assert_allclose(summary["history"][key], values, 1e-6)
    assert batch_summary_steps(model_dir) == list(range(1, 7))
    assert not (model_dir / "backup").exists()


def test_a_finished_run_is_reported_not_trained_again(
    ptb_dir, tmp_path, caplog
):
    model_dir = tmp_path / "model"
    summary = lstm_main.run(
        _ptb_config(ptb_dir, model_dir, train_steps=2, epochs=1)
    )
    assert summary["finished"] is True
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "model.keras",
        "model.weights.h5",
        "summary.json",
        "tensorboard",
    ]
    written = (model_dir / "summary.json").read_bytes()
    events = sorted(model_dir.glob("tensorboard/*/events.*"))

    with caplog.at_level(logging.INFO, logger="absl"):
        again = lstm_main.run(
            _ptb_config(ptb_dir, model_dir, train_steps=2, epochs=1)
        )
    assert "holds a finished run" in caplog.text
    assert "--overwrite" in caplog.text
    assert again == summary
    assert (model_dir / "summary.json").read_bytes() == written
    assert sorted(model_dir.glob("tensorboard/*/events.*")) == events

    overwritten = lstm_main.run(
        _ptb_config(ptb_dir, model_dir, train_steps=2, epochs=1, overwrite=True)
    )
    assert overwritten["train_seconds"] != summary["train_seconds"]
    assert not set(model_dir.glob("tensorboard/*/events.*")) & set(events)
    assert batch_summary_steps(model_dir) == [1, 2]


def test_a_backup_of_other_settings_is_refused(ptb_dir, tmp_path, monkeypatch):
    model_dir = tmp_path / "model"
    _signal_at(monkeypatch, 3, signal.SIGTERM)
    with pytest.raises(stopping.Stopped):
        lstm_main.run(_ptb_config(ptb_dir, model_dir))
    with pytest.raises(ValueError) as refused:
        lstm_main.run(_ptb_config(ptb_dir, model_dir, density=0.02))
    assert "config.density=0.01 there, 0.02 here" in str(refused.value)
    assert "use another --model_dir" in str(refused.value)


def _readme_snippet(marker: str) -> str:
    """The python block after `marker` in models/README.md."""
    text = (REPO / "models" / "README.md").read_text()
    after = text[text.index(marker) :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("```", start)]


def test_the_saved_model_loads_for_evaluation_as_documented(
    ptb_dir, tmp_path, capsys
):
    model_dir = tmp_path / "lstm"
    summary = lstm_main.run(
        _ptb_config(ptb_dir, model_dir, train_steps=2, epochs=1)
    )
    code = _readme_snippet("<!-- load-the-trained-lstm -->")
    code = code.replace("/tmp/lstm", str(model_dir))
    code = code.replace("/data/ptb", str(ptb_dir))
    scope = {}
    exec(compile(code, "models/README.md", "exec"), scope)
    assert "test perplexity:" in capsys.readouterr().out
    trained, fresh = scope["trained"], scope["fresh"]
    for a, b in zip(trained.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The .keras file kept tfgc's optimizer, its compressor and its step.
    optimizer = trained.optimizer
    assert isinstance(optimizer, tfgc.CompressedOptimizer)
    assert isinstance(optimizer.compressor, tfgc.compressors.TopK)
    assert int(optimizer.iterations) == summary["train_steps"] == 2
    assert np.isfinite(scope["loss"])


def test_cache_is_refused_the_corpus_is_in_memory(tmp_path):
    common = CommonConfig(
        model_dir=str(tmp_path / "model"),
        use_synthetic_data=False,
        data_dir=str(tmp_path),
        cache="memory",
    )
    with pytest.raises(ValueError, match="reads its corpus into memory"):
        lstm_main.LstmConfig(common=common)
