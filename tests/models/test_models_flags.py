"""Flags, config validation and chief detection of the training mains.

Bad flags must fail before any work: no strategy, no files in
`--model_dir`, and a message that names the flag and what is valid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import keras
import pytest
import tensorflow as tf
from absl import app, flags
from absl.testing import flagsaver

import tfgc
from models.common import distribution, training
from models.common import flags as common_flags
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
            "`--density` applies only to --compressor in ['topk', 'randomk', "
            "'mstopk', 'redsync', 'sbc', 'importance']",
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
            "`--rank` applies only to --compressor in ['powersgd', 'acpsgd']",
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
    ]
    + [
        (["--model_dir={d}", "--use_synthetic_data", "--train_steps=2", *a], m)
        for a, m in [
            (
                ["--workers_per_host=2"],
                "`--workers_per_host` applies only to "
                "--communicator=hierarchical. Received: communicator='auto', "
                "workers_per_host=2. Drop --workers_per_host, or use "
                "--communicator=hierarchical.",
            ),
            (
                ["--communicator=hierarchical", "--workers_per_host=0"],
                "`--workers_per_host` must be an integer >= 1. Received: "
                "workers_per_host=0",
            ),
            (
                [
                    "--communicator=hierarchical",
                    "--distribution_strategy=one_device",
                ],
                "`--communicator=hierarchical` needs at least 2 workers, and "
                "--distribution_strategy=one_device runs one.",
            ),
            (
                ["--compressor=topk", "--selection=trimmed"],
                "`--selection` applies only to --compressor in ['redsync']. "
                "Received: compressor='topk', selection='trimmed'. Drop "
                "--selection, or use one of those compressors.",
            ),
            (
                ["--compressor=mstopk", "--warmup_steps=10"],
                "`--warmup_steps` applies only to --compressor in "
                "['redsync', 'powersgd', 'acpsgd']. Received: "
                "compressor='mstopk', warmup_steps=10.",
            ),
            (
                ["--compressor=redsync", "--warmup_steps=-1"],
                "`--warmup_steps` must be an integer >= 0. Received: "
                "warmup_steps=-1",
            ),
            (
                ["--compressor=redsync", "--noerror_feedback"],
                "`--noerror_feedback` cannot be used with "
                "--compressor=redsync: it always keeps its own residual",
            ),
            (
                ["--compressor=redsync", "--communicator=allreduce"],
                "`--communicator=allreduce` cannot carry what "
                "--compressor=redsync sends (all_gather_ragged). Received: "
                "communicator='allreduce', compressor='redsync'. Use "
                "--communicator=auto",
            ),
            (
                ["--compressor=mstopk", "--communicator=allreduce"],
                "`--communicator=allreduce` cannot carry what "
                "--compressor=mstopk sends (all_gather). Received: "
                "communicator='allreduce', compressor='mstopk'. Use "
                "--communicator=auto",
            ),
            (
                ["--compressor=mstopk", "--density=0"],
                "`--density` must be in (0, 1]",
            ),
            (
                ["--compressor=topk", "--delay=4"],
                "`--delay` applies only to --compressor in ['sbc']",
            ),
            (
                ["--compressor=sbc", "--delay=0"],
                "`--delay` must be an integer >= 1. Received: delay=0",
            ),
            (
                ["--compressor=powersgd", "--bucket_bytes=1000"],
                "`--bucket_bytes` applies only to --compressor in ['acpsgd']",
            ),
            (
                ["--compressor=acpsgd", "--bucket_bytes=-1"],
                "`--bucket_bytes` must be an integer >= 1",
            ),
            (
                ["--compressor=topk", "--nobinarize"],
                "`--binarize` applies only to --compressor in ['sbc']",
            ),
            (
                ["--compressor=importance", "--communicator=allreduce"],
                "`--communicator=allreduce` cannot carry what "
                "--compressor=importance sends (broadcast)",
            ),
            (
                ["--backup_steps=0"],
                "`--backup_steps` must be an integer >= 1. Received: "
                "backup_steps=0",
            ),
            (
                ["--stop_timeout=0"],
                "`--stop_timeout` must be a number of seconds > 0, e.g. "
                "--stop_timeout=30. Received: stop_timeout=0.0",
            ),
        ]
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
        ["--communicator=ring"],
        ["--selection=topk"],
        ["--config=huge"],
        ["--precision=float16"],
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
    assert "ImageNet TFRecords (train-*, and validation-* unless" in str(
        err.value
    )
    assert "'imagenet2012'" in str(err.value)


@pytest.mark.parametrize(
    "flag, message",
    [
        # Refused by the config.
        (
            "--density=0.01",
            "error: `--density` applies only to --compressor in ['topk', "
            "'randomk', 'mstopk', 'redsync', 'sbc', 'importance']. Received: "
            "compressor='powersgd', density=0.01. Drop --density, or use one "
            "of those compressors.",
        ),
        # Refused by absl's parser.
        (
            "--densty=0.01",
            "error: Unknown command line flag 'densty'. Did you mean: "
            "density ?",
        ),
    ],
)
def test_command_line_error_comes_first_in_one_line(tmp_path, flag, message):
    """The error and where the usage is, nothing else: absl printed the
    module docstring and the flags before the error."""
    model_dir = tmp_path / "model"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "models.lstm_lm.main",
            f"--model_dir={model_dir}",
            "--use_synthetic_data",
            "--train_steps=2",
            "--compressor=powersgd",
            flag,
        ],
        cwd=REPO,
        env={**env, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        message,
        "see python -m models.lstm_lm.main --help",
    ], proc.stderr
    assert proc.stdout == ""
    assert not model_dir.exists()


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), "300", True])
def test_startup_timeout_must_be_positive_seconds(value):
    with pytest.raises(ValueError, match="`--startup_timeout` must be a"):
        CommonConfig(
            model_dir="/tmp/x",
            use_synthetic_data=True,
            train_steps=1,
            startup_timeout=value,
        )


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


def test_precision_is_validated_in_the_config():
    with pytest.raises(ValueError) as err:
        CommonConfig(
            model_dir="/tmp/x",
            use_synthetic_data=True,
            train_steps=2,
            precision="float16",
        )
    assert str(err.value) == (
        "`--precision` must be one of ['float32', 'mixed_bfloat16', "
        "'mixed_float16']. Received: precision='float16'"
    )


def test_precision_policy_is_restored_after_an_error():
    with pytest.raises(RuntimeError):
        with training.precision_policy("mixed_float16"):
            policy = keras.mixed_precision.global_policy()
            assert policy.name == "mixed_float16"
            raise RuntimeError("stop")
    assert keras.mixed_precision.global_policy().name == "float32"


def test_enum_flags_offer_every_library_name():
    assert FLAGS["compressor"].parser.enum_values == tfgc.compressors.names()
    assert {"mstopk", "redsync"} <= set(FLAGS["compressor"].parser.enum_values)
    assert (
        FLAGS["communicator"].parser.enum_values == tfgc.communicators.names()
    )
    assert FLAGS["communicator"].default == "auto"


def _parsed_config(argv):
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["prog", *argv])
        return common_flags.common_config_from_flags(FLAGS)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--compressor=mstopk", "--density=0.02"],
            dict(compressor="mstopk", density=0.02, communicator="auto"),
        ),
        (
            [
                "--compressor=redsync",
                "--density=0.001",
                "--selection=trimmed",
                "--warmup_steps=0",
                "--communicator=hierarchical",
                "--workers_per_host=2",
                "--all_reduce_alg=ring",
            ],
            dict(
                compressor="redsync",
                density=0.001,
                selection="trimmed",
                warmup_steps=0,
                communicator="hierarchical",
                workers_per_host=2,
                all_reduce_alg="ring",
            ),
        ),
        (
            ["--compressor=redsync", "--selection=threshold"],
            dict(compressor="redsync", selection="threshold"),
        ),
        (
            # The hierarchical communicator carries unequal-size payloads.
            ["--compressor=redsync", "--communicator=hierarchical"],
            dict(compressor="redsync", communicator="hierarchical"),
        ),
        (
            ["--compressor=topk", "--communicator=hierarchical"],
            dict(communicator="hierarchical", workers_per_host=None),
        ),
        ([], dict(precision="float32")),
        (["--precision=mixed_float16"], dict(precision="mixed_float16")),
        (["--precision=mixed_bfloat16"], dict(precision="mixed_bfloat16")),
        ([], dict(overwrite=False, stop_timeout=30.0, backup_steps=None)),
        (
            ["--overwrite", "--stop_timeout=5", "--backup_steps=100"],
            dict(overwrite=True, stop_timeout=5.0, backup_steps=100),
        ),
    ],
)
def test_new_flags_round_trip_through_the_config(tmp_path, argv, expected):
    common = [
        f"--model_dir={tmp_path}",
        "--use_synthetic_data",
        "--train_steps=2",
    ]
    config = _parsed_config(common + argv)
    for name, value in expected.items():
        assert getattr(config, name) == value, name
    # A config rebuilt from its dict (as in summary.json) is the same one.
    assert CommonConfig(**config.as_dict()) == config
    as_json = json.loads(json.dumps(config.as_dict()))
    assert CommonConfig(**as_json) == config


def test_redsync_flags_reach_the_compressor():
    config = CommonConfig(
        model_dir="/tmp/x",
        use_synthetic_data=True,
        train_steps=2,
        compressor="redsync",
        density=0.01,
        selection="trimmed",
        warmup_steps=5,
    )
    assert config.compressor_kwargs() == {
        "density": 0.01,
        "selection": "trimmed",
        "warmup_steps": 5,
    }


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (
            {"compressor": "sbc", "density": 0.002, "delay": 4},
            {"density": 0.002, "delay": 4, "binarize": True},
        ),
        (
            {"compressor": "sbc", "binarize": False},
            {"binarize": False, "delay": 1},
        ),
        (
            {"compressor": "acpsgd", "rank": 2, "bucket_bytes": 1 << 20},
            {"rank": 2, "bucket_bytes": 1 << 20, "warmup_steps": 0},
        ),
        ({"compressor": "powersgd", "warmup_steps": 3}, {"warmup_steps": 3}),
        ({"compressor": "importance", "density": 0.05}, {"density": 0.05}),
    ],
)
def test_paper_compressor_flags_reach_the_compressor(kwargs, expected):
    config = CommonConfig(
        model_dir="/tmp/x", use_synthetic_data=True, train_steps=2, **kwargs
    )
    optimizer = training.compressed_optimizer(
        config, keras.optimizers.SGD(0.1, momentum=0.9)
    )
    got = optimizer.compressor.get_config()
    assert {k: got[k] for k in expected} == expected


def _options_implementation(optimizer):
    options = optimizer.communicator.options
    return None if options is None else options.implementation


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_redsync_takes_the_momentum_of_the_inner_sgd(momentum):
    config = CommonConfig(
        model_dir="/tmp/x",
        use_synthetic_data=True,
        train_steps=2,
        compressor="redsync",
        density=0.01,
    )
    schedule = resnet_main.WarmupDecay(0.1, 100, 10)
    inner = keras.optimizers.SGD(
        schedule, momentum=momentum, global_clipnorm=5.0, weight_decay=1e-4
    )
    optimizer = training.compressed_optimizer(config, inner)
    assert isinstance(optimizer.compressor, tfgc.compressors.RedSync)
    assert optimizer.compressor.momentum == momentum
    assert optimizer.compressor.density == 0.01
    sgd = optimizer.inner_optimizer
    assert type(sgd) is keras.optimizers.SGD
    assert sgd.momentum == 0.0 and not sgd.nesterov
    assert sgd.global_clipnorm == 5.0 and sgd.weight_decay == 1e-4
    assert (
        sgd.get_config()["learning_rate"] == inner.get_config()["learning_rate"]
    )
    # The caller's optimizer is left alone.
    assert inner.momentum == momentum


@pytest.mark.parametrize(
    "inner, message",
    [
        (
            lambda: keras.optimizers.Adam(1e-3),
            "so that optimizer must be keras.optimizers.SGD. Received: Adam",
        ),
        (
            lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
            "SGD(momentum=0.9, nesterov=True)",
        ),
    ],
)
def test_redsync_refuses_other_inner_optimizers(inner, message):
    config = CommonConfig(
        model_dir="/tmp/x",
        use_synthetic_data=True,
        train_steps=2,
        compressor="redsync",
    )
    with pytest.raises(ValueError) as err:
        training.compressed_optimizer(config, inner())
    assert message in str(err.value)


def test_other_compressors_keep_the_inner_optimizer():
    config = CommonConfig(
        model_dir="/tmp/x",
        use_synthetic_data=True,
        train_steps=2,
        compressor="mstopk",
        density=0.05,
    )
    inner = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer = training.compressed_optimizer(config, inner)
    assert optimizer.inner_optimizer is inner
    assert isinstance(optimizer.compressor, tfgc.compressors.MSTopK)
    assert optimizer.compressor.density == 0.05


@pytest.mark.parametrize(
    "all_reduce_alg, implementation",
    [
        (None, None),
        ("ring", tf.distribute.experimental.CommunicationImplementation.RING),
        ("nccl", tf.distribute.experimental.CommunicationImplementation.NCCL),
    ],
)
@pytest.mark.parametrize(
    "communicator, workers_per_host",
    [
        ("auto", None),
        ("allgather", None),
        ("hierarchical", None),
        ("hierarchical", 2),
    ],
)
def test_all_reduce_alg_reaches_tfgc_collectives(
    all_reduce_alg, implementation, communicator, workers_per_host
):
    config = CommonConfig(
        model_dir="/tmp/x",
        use_synthetic_data=True,
        train_steps=2,
        compressor="mstopk",
        all_reduce_alg=all_reduce_alg,
        communicator=communicator,
        workers_per_host=workers_per_host,
    )
    optimizer = training.compressed_optimizer(config, keras.optimizers.SGD(0.1))
    assert optimizer.communicator.name == communicator
    assert _options_implementation(optimizer) == implementation
    if workers_per_host is not None:
        assert optimizer.communicator.workers_per_host == workers_per_host


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
