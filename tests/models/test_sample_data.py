"""Real photographs in the ImageNet TFRecord layout and as a prepared
tensorflow-datasets directory, and the ResNet main's pipeline reading
them."""

import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

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


def _prepared(data_dir, split):
    """(JPEG bytes, label) of a split of a prepared directory, read the
    way the main's tfds source reads it."""
    builder = tfds.builder(data.IMAGENET.tfds_name, data_dir=str(data_dir))
    ds = builder.as_dataset(
        split=split, decoders={"image": tfds.decode.SkipDecoding()}
    )
    return [(ex["image"].numpy(), int(ex["label"])) for ex in ds]


def _version_dir(data_dir):
    version = tfds.builder_cls(data.IMAGENET.tfds_name).VERSION
    return os.path.join(data_dir, data.IMAGENET.tfds_name, str(version))


def test_a_prepared_tfds_directory_of_the_same_jpegs(tmp_path):
    tfrecords = sample_data.write(str(tmp_path / "r"), 10, 4, 2, seed=3)
    paths = sample_data.write(
        str(tmp_path / "t"), 10, 4, 2, seed=3, layout="tfds"
    )
    assert data.find_source(str(tmp_path / "t"), data.IMAGENET) == "tfds"
    assert paths["validation"] == [
        os.path.join(_version_dir(str(tmp_path / "t")), name)
        for name in (
            "imagenet2012-validation.tfrecord-00000-of-00002",
            "imagenet2012-validation.tfrecord-00001-of-00002",
        )
    ]
    for split, count in (("train", 10), ("validation", 4)):
        prepared = _prepared(tmp_path / "t", split)
        assert len(prepared) == count
        # The same JPEG bytes and labels (from 0) as the TFRecords hold.
        assert sorted(prepared) == sorted(
            (jpeg.numpy(), label) for jpeg, label in _records(tfrecords[split])
        )


def _epoch(data_dir, source, training, examples, batch=4):
    """One epoch of the main's input pipeline (`data.dataset_fn`, one input
    pipeline): images and labels from 0. It shuffles before it repeats, so
    the first `examples` are each example once."""
    fn = data.dataset_fn(str(data_dir), data.IMAGENET, source, batch, training)
    batches = fn(tf.distribute.InputContext()).take(examples // batch)
    images, labels = zip(*((x.numpy(), y.numpy()) for x, y in batches))
    return np.concatenate(images), list(np.concatenate(labels).argmax(1))


def test_the_mains_pipeline_decodes_the_prepared_directory(tmp_path):
    tfrecords = sample_data.write(str(tmp_path / "r"), 12, 4, 2, seed=5)
    sample_data.write(str(tmp_path / "t"), 12, 4, 2, seed=5, layout="tfds")
    images, labels = _epoch(tmp_path / "t", "tfds", True, 12)
    assert images.shape == (12, 224, 224, 3)
    assert np.isfinite(images).all()
    expected = sorted(label for _, label in _records(tfrecords["train"]))
    assert sorted(labels) == expected
    assert set(labels) == {0, 1}
    # Evaluation crops without randomness: the same decoded images, with
    # the same labels, in either layout (in the order each reads them).
    pairs = {}
    for source, directory in (("tfds", "t"), ("tfrecord", "r")):
        images, labels = _epoch(tmp_path / directory, source, False, 4)
        pairs[source] = sorted(zip(labels, (i.tobytes() for i in images)))
    assert pairs["tfds"] == pairs["tfrecord"]
    assert len({image for _, image in pairs["tfds"]}) == 4


def test_a_split_without_examples_is_left_out(tmp_path):
    paths = sample_data.write(str(tmp_path), 3, 0, 4, layout="tfds")
    # No more files than examples, as tfds's own writer would write.
    assert [os.path.basename(p) for p in paths["train"]] == [
        f"imagenet2012-train.tfrecord-0000{i}-of-00003" for i in range(3)
    ]
    builder = tfds.builder(data.IMAGENET.tfds_name, data_dir=str(tmp_path))
    assert list(builder.info.splits) == ["train"]
    assert len(_prepared(tmp_path, "train")) == 3


@pytest.mark.parametrize(
    "args, layout, message",
    [
        ((-1, 2, 2), "tfds", "must be >= 0"),
        ((0, 0, 2), "tfds", "at least one example"),
        ((2, 1, 1), "jpeg", "layout must be one of"),
    ],
)
def test_bad_arguments_write_nothing(tmp_path, args, layout, message):
    with pytest.raises(ValueError, match=message):
        sample_data.write(str(tmp_path), *args, layout=layout)
    assert not os.listdir(tmp_path)


def test_the_command_line_writes_either_layout(tmp_path, capsys):
    common = ["--train", "2", "--validation", "1", "--shards", "1"]
    assert sample_data.main(["--out", str(tmp_path / "r"), *common]) == 0
    assert data.find_source(str(tmp_path / "r"), data.IMAGENET) == "tfrecord"
    tfds_args = ["--out", str(tmp_path / "t"), "--layout", "tfds", *common]
    assert sample_data.main(tfds_args) == 0
    assert _version_dir(str(tmp_path / "t")) in capsys.readouterr().out
    assert data.find_source(str(tmp_path / "t"), data.IMAGENET) == "tfds"
    # Writing over a prepared directory would leave its old shards behind.
    with pytest.raises(SystemExit):
        sample_data.main(tfds_args)
    assert "already holds a prepared imagenet2012" in capsys.readouterr().err
