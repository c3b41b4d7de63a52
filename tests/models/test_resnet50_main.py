"""ResNet v1.5 model, input pipelines and end-to-end runs in one process."""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import tfgc
from models.common import cache, training
from models.common.config import CommonConfig
from models.resnet50_imagenet import data, resnet
from models.resnet50_imagenet import main as resnet_main


def test_resnet50_v1_5_shape_and_stride_placement():
    model = resnet.resnet((224, 224, 3), 1000)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == 25_557_032
    assert model.count_params() == 25_610_152
    # v1.5: the first block of stages 2-4 strides in its 3x3 convolution.
    for stage in (2, 3, 4):
        assert model.get_layer(f"stage{stage}_0_1").strides == (1, 1)
        assert model.get_layer(f"stage{stage}_0_2").strides == (2, 2)
        assert model.get_layer(f"stage{stage}_0_proj").strides == (2, 2)
    assert model.get_layer("pool").output.shape == (None, 2048)


def test_warmup_decay_schedule():
    schedule = resnet_main.WarmupDecay(0.4, 90, 9, "piecewise")
    lr = [float(schedule(step)) for step in range(90)]
    assert lr[0] == pytest.approx(0.4 / 9)
    assert lr[8] == pytest.approx(0.4)
    assert lr[29] == pytest.approx(0.4)
    assert lr[30] == pytest.approx(0.04)
    assert lr[60] == pytest.approx(0.004)
    assert lr[80] == pytest.approx(0.0004)
    cosine = resnet_main.WarmupDecay(0.4, 90, 9, "cosine")
    assert float(cosine(9)) == pytest.approx(0.4)
    assert float(cosine(89)) < 0.001
    restored = resnet_main.WarmupDecay.from_config(cosine.get_config())
    assert float(restored(50)) == pytest.approx(float(cosine(50)))


def _write_imagenet_tfrecords(directory, split, count):
    """Random JPEGs in the ImageNet TFRecord layout (labels 1..1000)."""
    rng = np.random.default_rng(0)
    path = directory / f"{split}-00000-of-00001"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(count):
            height, width = rng.integers(40, 90, size=2)
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image/encoded": tf.train.Feature(
                            bytes_list=tf.train.BytesList(
                                value=[tf.io.encode_jpeg(pixels).numpy()]
                            )
                        ),
                        "image/class/label": tf.train.Feature(
                            int64_list=tf.train.Int64List(value=[i + 1])
                        ),
                    }
                )
            )
            writer.write(example.SerializeToString())


def test_tfrecords_without_validation_files_serve_skip_eval(tmp_path):
    _write_imagenet_tfrecords(tmp_path, "train", 2)
    assert data.find_source(str(tmp_path), data.IMAGENET) is None
    found = data.find_source(str(tmp_path), data.IMAGENET, evaluate=False)
    assert found == "tfrecord"


@pytest.mark.parametrize("training", [True, False])
def test_imagenet_tfrecord_pipeline(tmp_path, training):
    _write_imagenet_tfrecords(tmp_path, "train", 6)
    _write_imagenet_tfrecords(tmp_path, "validation", 6)
    assert data.find_source(str(tmp_path), data.IMAGENET) == "tfrecord"
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    fn = data.dataset_fn(
        str(tmp_path), data.IMAGENET, "tfrecord", 4, training=training
    )
    images, labels = next(iter(strategy.distribute_datasets_from_function(fn)))
    assert images.shape == (4, 224, 224, 3)
    assert images.dtype == tf.float32
    assert labels.shape == (4, 1000)
    labels = labels.numpy()
    np.testing.assert_array_equal(labels.sum(axis=1), 1)
    # Labels 1..6 in the files become classes 0..5.
    assert set(labels.argmax(axis=1)) <= set(range(6))
    assert abs(float(tf.reduce_mean(images))) < 3


def _config(tmp_path, **kwargs):
    cifar_sized = kwargs.pop("cifar_sized", True)
    common = {
        "model_dir": str(tmp_path / "model"),
        "use_synthetic_data": True,
        "train_steps": 4,
        "epochs": 2,
        "log_steps": 2,
        "batch_size": 8,
        "distribution_strategy": "one_device",
        "compressor": "topk",
        "density": 0.01,
        **kwargs,
    }
    return resnet_main.ResnetConfig(
        common=CommonConfig(**common), cifar_sized=cifar_sized
    )


def test_cifar_sized_synthetic_end_to_end(tmp_path):
    summary = resnet_main.run(_config(tmp_path))
    on_disk = json.loads((tmp_path / "model" / "summary.json").read_text())
    assert on_disk["train_steps"] == summary["train_steps"] == 4
    assert summary["model"] == "resnet14_v1_5_cifar"
    assert summary["model_config"]["image_size"] == 32
    assert set(summary["eval"]["test"]) >= {"loss", "accuracy", "top5"}
    stats = summary["bytes_per_step"]
    assert stats["compression_ratio"] > 5
    assert np.isfinite(summary["train"]["loss"])
    # The saved model, with its WarmupDecay schedule and tfgc optimizer.
    trained = keras.models.load_model(tmp_path / "model" / "model.keras")
    assert isinstance(trained.optimizer, tfgc.CompressedOptimizer)
    schedule = trained.optimizer.inner_optimizer.get_config()["learning_rate"]
    assert schedule["class_name"] == "WarmupDecay"
    assert int(trained.optimizer.iterations) == 4
    fresh = resnet_main.build_model(_config(tmp_path))
    fresh.load_weights(tmp_path / "model" / "model.weights.h5")
    for a, b in zip(fresh.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Finished: the same run again trains nothing.
    assert resnet_main.run(_config(tmp_path)) == on_disk


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_cifar_sized_mixed_precision(
    tmp_path, run_and_check_precision, precision
):
    summary, model = run_and_check_precision(
        resnet_main.run,
        _config(
            tmp_path,
            train_steps=2,
            epochs=1,
            compressor="signsgd",
            density=None,
            skip_eval=True,
            precision=precision,
        ),
    )
    half = precision.removeprefix("mixed_")
    assert model.get_layer("stage1_0_2").compute_dtype == half
    assert summary["eval"] == {}


def test_cifar_sized_redsync_takes_the_sgd_momentum(tmp_path, monkeypatch):
    """The main's SGD(momentum=0.9) becomes RedSync(momentum=0.9) around a
    momentum-free SGD; CompressedOptimizer would refuse the original."""
    built = []
    original = training.compressed_optimizer

    def recording(config, inner):
        built.append(original(config, inner))
        return built[-1]

    monkeypatch.setattr(training, "compressed_optimizer", recording)
    summary = resnet_main.run(
        _config(
            tmp_path,
            train_steps=2,
            epochs=1,
            compressor="redsync",
            selection="trimmed",
            warmup_steps=1,
            skip_eval=True,
        )
    )
    (optimizer,) = built
    assert optimizer.compressor.momentum == 0.9
    assert optimizer.compressor.warmup_steps == 1
    assert optimizer.inner_optimizer.momentum == 0.0
    assert np.isfinite(summary["train"]["loss"])
    assert summary["config"]["selection"] == "trimmed"


@pytest.mark.slow
def test_resnet50_synthetic_two_steps(tmp_path):
    summary = resnet_main.run(
        _config(
            tmp_path,
            cifar_sized=False,
            train_steps=2,
            epochs=1,
            batch_size=2,
            eval_steps=1,
        )
    )
    assert summary["num_parameters"] == 25_610_152
    assert summary["bytes_per_step"]["dense"] == 4 * 25_557_032
    assert np.isfinite(summary["train"]["loss"])


@pytest.mark.parametrize(
    "spec", [data.CIFAR10, data.IMAGENET], ids=lambda s: s.tfds_name
)
@pytest.mark.parametrize("training", [True, False])
def test_tfds_pipeline_on_mock_data(spec, training):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    fn = data.dataset_fn("/nonexistent", spec, "tfds", 4, training=training)
    with tfds.testing.mock_data(
        num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        images, labels = next(
            iter(strategy.distribute_datasets_from_function(fn))
        )
    size = spec.image_size
    assert images.shape == (4, size, size, 3)
    assert labels.shape == (4, spec.num_classes)


def test_cifar_sized_on_prepared_tfds_dir(tmp_path):
    # A prepared directory as find_source sees it; mock_data supplies the
    # examples, since nothing may be downloaded here.
    prepared = tmp_path / "data" / "cifar10" / "3.0.2"
    prepared.mkdir(parents=True)
    (prepared / "dataset_info.json").write_text("{}")
    config = _config(
        tmp_path,
        use_synthetic_data=False,
        data_dir=str(tmp_path / "data"),
        train_steps=2,
        epochs=1,
        eval_steps=1,
    )
    assert config.source == "tfds"
    with tfds.testing.mock_data(
        num_examples=64, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        summary = resnet_main.run(config)
    assert summary["model_config"]["source"] == "tfds"
    assert summary["eval"]["test"]["steps"] == 1
    assert np.isfinite(summary["train"]["loss"])


def _labelled_tfrecord(directory, name, labels):
    """One ImageNet-layout file of small random JPEGs with `labels`."""
    rng = np.random.default_rng(len(labels))
    with tf.io.TFRecordWriter(str(directory / name)) as writer:
        for label in labels:
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            feature = {
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(
                        value=[tf.io.encode_jpeg(pixels).numpy()]
                    )
                ),
                "image/class/label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[label])
                ),
            }
            example = tf.train.Example(
                features=tf.train.Features(feature=feature)
            )
            writer.write(example.SerializeToString())


@pytest.mark.parametrize("level", ["memory", "disk", "auto"])
def test_cached_pipelines_see_their_shard_every_epoch(tmp_path, level):
    """Two input pipelines with the cache: each caches its own shard (the
    disk level in a directory per shard), every epoch holds the shard's
    examples, and after the first the source files may be gone."""
    source = tmp_path / "source"
    source.mkdir()
    for f in range(2):  # labels 1..6 in one file, 7..12 in the other
        _labelled_tfrecord(
            source, f"train-{f:05d}-of-00002", range(6 * f + 1, 6 * f + 7)
        )
    settings = cache.Settings(level, str(tmp_path / "cache"), 1)
    iterators = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline, 2)
        fn = data.dataset_fn(
            str(source), data.IMAGENET, "tfrecord", 4, training=True,
            cache_settings=settings,
        )  # fmt: skip
        iterators.append(iter(fn(context)))

    def epoch(it):  # 6 examples, batches of 2
        return sorted(
            int(i) for _ in range(3) for i in next(it)[1].numpy().argmax(1)
        )

    first = [epoch(it) for it in iterators]
    assert first == [list(range(0, 6)), list(range(6, 12))]
    for path in source.iterdir():
        path.unlink()
    assert [epoch(it) for it in iterators] == first
    if level != "memory":
        shards = sorted(os.listdir(tmp_path / "cache"))
        assert shards == [f"tfrecord-imagenet2012-train-{i}-of-2"
                          for i in range(2)]  # fmt: skip


def test_cache_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="needs `--cache_dir`"):
        _config(tmp_path, use_synthetic_data=False, data_dir="/d", cache="disk")
    with pytest.raises(ValueError, match="nothing to cache"):
        _config(tmp_path, cache="memory")
