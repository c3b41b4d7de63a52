"""Flags, config validation and chief detection of the training mains.

Bad flags must fail before any work: no strategy, no files in
`--model_dir`, and a message that names the flag and what is valid.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import tensorflow as tf
from absl import app, flags
from absl.testing import flagsaver

from models.common import distribution
from models.common.config import CommonConfig
from models.lstm_lm import main as lstm_main
from models.resnet50_imagenet import main as resnet_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
FLAGS = flags.FLAGS


def _main(module, argv):
    """Parses `argv` as the command line and calls `module.main`."""
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["prog", *argv])
        module.main(["prog"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--train_steps=2"], "--model_dir` is required"),
        (["--model_dir={d}"], "--use_synthetic_data"),
        (
            ["--model_dir={d}", "--use_synthetic_data"],
            "pass `--train_steps` too",
        ),
        (
            ["--model_dir={d}", "--use_synthetic_data", "--train_steps=0"],
            "`--train_steps` must be an integer >= 1",
        ),
        (
            [
                "--model_dir={d}",
                "--use_synthetic_data",
                "--train_steps=5",
                "--epochs=2",
            ],
            "must be a multiple",
        ),
        (
            [
                "--model_dir={d}",
                "--use_synthetic_data",
                "--train_steps=2",
                "--compressor=signsgd",
                "--density=0.1",
            ],
            "`--density` applies only to --compressor in ['topk', 'randomk']",
        ),
        (
            [
                "--model_dir={d}",
                "--use_synthetic_data",
                "--train_steps=2",
                "--compressor=topk",
                "--density=1.5",
            ],
            "`--density` must be in (0, 1]",
        ),
        (
            [
                "--model_dir={d}",
                "--use_synthetic_data",
                "--train_steps=2",
                "--compressor=topk",
                "--rank=4",
            ],
            "`--rank` applies only to --compressor in ['powersgd']",
        ),
        (
            [
                "--model_dir={d}",
                "--use_synthetic_data",
                "--train_steps=2",
                "--distribution_strategy=one_device",
                "--all_reduce_alg=ring",
            ],
            "no effect with --distribution_strategy=one_device",
        ),
        (
            [
                "--model_dir={d}",
                "--use_synthetic_data",
                "--train_steps=2",
                "--distribution_strategy=mirrored",
                "--cluster_resolver=slurm",
            ],
            "needs --distribution_strategy=multi_worker_mirrored",
        ),
        (
            ["--model_dir={d}", "--data_dir={d}"],
            "must hold ptb.train.txt",
        ),
    ],
)
def test_lstm_bad_flags_fail_fast(tmp_path, argv, message):
    model_dir = tmp_path / "model"
    argv = [a.format(d=model_dir) for a in argv]
    with pytest.raises(app.UsageError) as err:
        _main(lstm_main, argv)
    assert message in str(err.value)
    assert not model_dir.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--distribution_strategy=parameter_server"],
        ["--compressor=top_k_magic"],
        ["--all_reduce_alg=hierarchical"],
        ["--config=huge"],
    ],
)
def test_enum_flags_list_valid_values(argv):
    with pytest.raises(flags.IllegalFlagValueError) as err:
        _main(lstm_main, argv)
    assert "should be one of" in str(err.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--label_smoothing=1.0"], "`--label_smoothing` must be in [0, 1)"),
        (["--warmup_epochs=-1"], "`--warmup_epochs` must be >= 0"),
    ],
)
def test_resnet_bad_flags_fail_fast(tmp_path, argv, message):
    model_dir = tmp_path / "model"
    common = [
        f"--model_dir={model_dir}",
        "--use_synthetic_data",
        "--train_steps=2",
    ]
    with pytest.raises(app.UsageError) as err:
        _main(resnet_main, common + argv)
    assert message in str(err.value)
    assert not model_dir.exists()


def test_resnet_data_dir_without_dataset(tmp_path):
    with pytest.raises(app.UsageError) as err:
        _main(
            resnet_main,
            [f"--model_dir={tmp_path / 'm'}", f"--data_dir={tmp_path}"],
        )
    assert "ImageNet TFRecords (train-*, validation-*)" in str(err.value)
    assert "'imagenet2012'" in str(err.value)


def test_command_line_error_exits_before_training(tmp_path):
    model_dir = tmp_path / "model"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "models.lstm_lm.main",
            f"--model_dir={model_dir}",
            "--use_synthetic_data",
            "--train_steps=2",
            "--compressor=powersgd",
            "--density=0.01",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "`--density` applies only to --compressor in" in proc.stderr
    assert not model_dir.exists()


def test_config_is_frozen_and_reports_kwargs():
    config = CommonConfig(
        model_dir="/tmp/x",
        compressor="powersgd",
        rank=2,
        use_synthetic_data=True,
        train_steps=6,
        epochs=3,
    )
    assert config.compressor_kwargs() == {"rank": 2}
    assert config.steps_per_epoch() == 2
    with pytest.raises(AttributeError):
        config.rank = 3


def test_nccl_without_gpu_is_refused():
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible")
    config = CommonConfig(
        model_dir="/tmp/x",
        use_synthetic_data=True,
        train_steps=1,
        distribution_strategy="mirrored",
        all_reduce_alg="nccl",
    )
    with pytest.raises(ValueError, match="--all_reduce_alg=ring"):
        distribution.make_strategy(config)


def _fake_strategy(cluster, task_type, task_id):
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id
    )
    return SimpleNamespace(cluster_resolver=resolver)


@pytest.mark.parametrize(
    "cluster, task_type, task_id, chief",
    [
        ({"worker": ["a:1", "b:1"]}, "worker", 0, True),
        ({"worker": ["a:1", "b:1"]}, "worker", 1, False),
        ({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0, True),
        ({"chief": ["c:1"], "worker": ["a:1"]}, "worker", 0, False),
    ],
)
def test_chief_detection(tmp_path, cluster, task_type, task_id, chief):
    strategy = _fake_strategy(cluster, task_type, task_id)
    assert distribution.is_chief(strategy) is chief
    assert distribution.num_workers(strategy) == sum(
        len(v) for v in cluster.values()
    )
    out = distribution.output_dir(str(tmp_path / "model"), strategy)
    assert (out == str(tmp_path / "model")) is chief
    if not chief:
        assert os.path.isdir(out)
        os.rmdir(out)


def test_single_process_strategy_is_chief():
    assert distribution.is_chief(tf.distribute.OneDeviceStrategy("/cpu:0"))
