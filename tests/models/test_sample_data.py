"""Real photographs in the ImageNet TFRecord layout, and the ResNet main's
pipeline reading them."""

import hashlib

import numpy as np
import pytest
import tensorflow as tf

from models.resnet50_imagenet import data, sample_data


def _records(paths):
    for serialized in tf.data.TFRecordDataset(paths):
        jpeg, label = data._parse_example(serialized)
        yield jpeg, int(label)


def _digest(paths):
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def test_distinct_real_jpegs_in_the_mains_layout(tmp_path):
    paths = sample_data.write(str(tmp_path), 12, 4, shards=2, seed=3)
    assert [p.rsplit("/", 1)[1] for p in paths["train"]] == [
        "train-00000-of-00002",
        "train-00001-of-00002",
    ]
    assert data.find_source(str(tmp_path), data.IMAGENET) == "tfrecord"
    records = list(_records(paths["train"]))
    assert len(records) == 12
    assert len({jpeg.numpy() for jpeg, _ in records}) == 12
    for jpeg, label in records:
        image = tf.io.decode_jpeg(jpeg).numpy()
        assert 160 <= min(image.shape[:2]) <= 400 and image.shape[2] == 3
        assert label in (0, 1)  # photographs 1 and 2, numbered from 0
        assert image.std() > 10  # a photograph, not a flat image
    assert len(list(_records(paths["validation"]))) == 4


def test_the_same_arguments_write_the_same_bytes(tmp_path):
    first = sample_data.write(str(tmp_path / "a"), 6, 2, shards=2, seed=1)
    again = sample_data.write(str(tmp_path / "b"), 6, 2, shards=2, seed=1)
    other = sample_data.write(str(tmp_path / "c"), 6, 2, shards=2, seed=2)
    assert _digest(first["train"]) == _digest(again["train"])
    assert _digest(first["train"]) != _digest(other["train"])


def test_the_training_pipeline_decodes_them(tmp_path):
    sample_data.write(str(tmp_path), 16, 4, shards=2)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    fn = data.dataset_fn(str(tmp_path), data.IMAGENET, "tfrecord", 8, True)
    images, labels = next(iter(strategy.distribute_datasets_from_function(fn)))
    assert images.shape == (8, 224, 224, 3)
    assert np.isfinite(images.numpy()).all()
    assert set(labels.numpy().argmax(1)) <= {0, 1}


@pytest.mark.parametrize("args", [(-1, 2, 2), (4, 2, 0)])
def test_bad_counts(tmp_path, args):
    with pytest.raises(ValueError, match="must be >= 0"):
        sample_data.write(str(tmp_path), *args)
