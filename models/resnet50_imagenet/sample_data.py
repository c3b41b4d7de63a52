"""ImageNet-format sample data of real photographs, made without a download.

The two photographs that ship with scikit-learn (`load_sample_images`: a
Chinese temple and a flower, 640 x 427) are cut into many distinct
examples: each a random crop (10-100 % of the area, aspect ratio 3/4-4/3),
resized so that its shorter side is 160-400 pixels, maybe mirrored, and
JPEG-encoded at quality 75-95. The label is the photograph. They are
written in either layout the ResNet main reads, so that tests and
benchmarks decode real JPEGs of real sizes rather than synthetic tensors:

- `--layout=tfrecord` (default): the conversion scripts' TFRecords
  (`train-NNNNN-of-NNNNN`, `validation-...`, features `image/encoded` and
  `image/class/label`, photographs numbered 1 and 2);
- `--layout=tfds`: a prepared tensorflow-datasets `imagenet2012` directory
  (`<out>/imagenet2012/<version>/`, the features of tfds's own ImageNet
  builder, labels 0 and 1): examples serialized by tfds's feature
  connectors, metadata by `tfds.folder_dataset.write_metadata`.

The same seed and counts give the same examples in both, example `i` of a
split in shard `i % shards`:

    python -m models.resnet50_imagenet.sample_data --out /tmp/imagenet_sample \\
        --train 2000 --validation 200 --shards 8 [--layout=tfds]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import tensorflow as tf

from models.resnet50_imagenet import data

if TYPE_CHECKING:  # imported where used: it takes a while
    import tensorflow_datasets as tfds

SPLITS = ("train", "validation")
LAYOUTS = ("tfrecord", "tfds")


class Sample(NamedTuple):
    """One example as both layouts store it."""

    split: str
    index: int  # its place in the split
    jpeg: bytes
    photo: int  # the photograph it was cut from, numbered from 0


class Shards(NamedTuple):
    """One split's files, as `_write_sharded` filled them."""

    paths: list[str]
    lengths: list[int]  # examples per file
    num_bytes: int  # of the serialized examples (what tfds records)


def photographs() -> list[np.ndarray]:
    """scikit-learn's sample photographs, uint8 [height, width, 3]."""
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)


def example(photo: np.ndarray, rng: np.random.Generator) -> bytes:
    """One random crop of `photo`, resized, maybe mirrored, as a JPEG."""
    height, width, _ = photo.shape
    area = rng.uniform(0.1, 1.0) * height * width
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    crop_w = int(min(width, round(np.sqrt(area * aspect))))
    crop_h = int(min(height, round(np.sqrt(area / aspect))))
    top = int(rng.integers(0, height - crop_h + 1))
    left = int(rng.integers(0, width - crop_w + 1))
    crop = photo[top : top + crop_h, left : left + crop_w]
    shorter = int(rng.integers(160, 401))
    scale = shorter / min(crop_h, crop_w)
    size = [max(1, round(crop_h * scale)), max(1, round(crop_w * scale))]
    image = tf.image.resize(crop, size, antialias=True)
    if rng.random() < 0.5:
        image = tf.image.flip_left_right(image)
    pixels = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    quality = int(rng.integers(75, 96))
    return tf.io.encode_jpeg(pixels, quality=quality).numpy()


def samples(train: int, validation: int, seed: int = 0) -> Iterator[Sample]:
    """Every example, the training split first.

    One random stream draws them all, in this order, so that both layouts
    hold the same examples for the same seed and counts.
    """
    photos = photographs()
    rng = np.random.default_rng(seed)
    for split, count in zip(SPLITS, (train, validation)):
        for index in range(count):
            photo = int(rng.integers(len(photos)))
            yield Sample(split, index, example(photos[photo], rng), photo)


def _check(train: int, validation: int, shards: int, layout: str) -> None:
    if min(train, validation) < 0 or shards < 1:
        raise ValueError(
            "train and validation must be >= 0 and shards >= 1. Received: "
            f"train={train}, validation={validation}, shards={shards}"
        )
    if layout not in LAYOUTS:
        raise ValueError(
            f"layout must be one of {list(LAYOUTS)}. Received: "
            f"layout={layout!r}"
        )
    if layout == "tfds" and not train + validation:
        raise ValueError(
            "A tensorflow-datasets directory needs at least one example: "
            "train + validation must be >= 1. Received: "
            f"train={train}, validation={validation}"
        )


def _write_sharded(
    paths: dict[str, list[str]], records: Iterable[tuple[str, int, bytes]]
) -> dict[str, Shards]:
    """Writes each (split, index, serialized example) to file
    `index % files` of its split, as both layouts share out examples."""
    writers = {
        s: [tf.io.TFRecordWriter(p) for p in ps] for s, ps in paths.items()
    }
    lengths = {s: [0] * len(ps) for s, ps in paths.items()}
    num_bytes = dict.fromkeys(paths, 0)
    for split, index, serialized in records:
        shard = index % len(writers[split])
        writers[split][shard].write(serialized)
        lengths[split][shard] += 1
        num_bytes[split] += len(serialized)
    for split_writers in writers.values():
        for writer in split_writers:
            writer.close()
    return {s: Shards(ps, lengths[s], num_bytes[s]) for s, ps in paths.items()}


def _serialized(jpeg: bytes, label: int) -> bytes:
    feature = {
        "image/encoded": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[jpeg])
        ),
        "image/class/label": tf.train.Feature(
            int64_list=tf.train.Int64List(value=[label])
        ),
    }
    return tf.train.Example(
        features=tf.train.Features(feature=feature)
    ).SerializeToString()


def write(
    directory: str,
    train: int,
    validation: int,
    shards: int = 4,
    seed: int = 0,
    layout: str = "tfrecord",
) -> dict[str, list[str]]:
    """Writes `train` and `validation` examples in up to `shards` files
    each, in `layout` ("tfrecord" or "tfds", see the module docstring);
    returns the paths by split.

    The same arguments write the same bytes, and both layouts hold the
    same examples for the same seed and counts.
    """
    _check(train, validation, shards, layout)
    counts = dict(zip(SPLITS, (train, validation)))
    examples = samples(train, validation, seed)
    if layout == "tfds":
        return _write_tfds(directory, counts, shards, examples)
    return _write_tfrecords(directory, shards, examples)


def _write_tfrecords(
    directory: str, shards: int, examples: Iterable[Sample]
) -> dict[str, list[str]]:
    """The conversion scripts' layout: `shards` files a split, even
    empty ones, and photographs numbered from 1."""
    os.makedirs(directory, exist_ok=True)
    paths = {
        split: [
            os.path.join(directory, f"{split}-{s:05d}-of-{shards:05d}")
            for s in range(shards)
        ]
        for split in SPLITS
    }
    records = (
        (s.split, s.index, _serialized(s.jpeg, s.photo + 1)) for s in examples
    )
    _write_sharded(paths, records)
    return paths


def _tfds_paths(
    template: tfds.core.ShardedFileTemplate,
    counts: dict[str, int],
    shards: int,
) -> dict[str, list[str]]:
    """tfds's file names for each split with examples, no more files than
    examples: tfds's own writer refuses empty shards. A split without
    examples is left out (a run with `--skip_eval` needs none)."""
    return {
        split: [
            os.fspath(p)
            for p in template.replace(split=split).sharded_filepaths(
                min(shards, count)
            )
        ]
        for split, count in counts.items()
        if count
    }


def _write_tfds(
    directory: str,
    counts: dict[str, int],
    shards: int,
    examples: Iterable[Sample],
) -> dict[str, list[str]]:
    """A prepared tensorflow-datasets `imagenet2012` directory under
    `directory` (the main's `--data_dir`).

    The features are those of tfds's registered ImageNet builder, the one
    the main's `tfds.builder` call constructs, so it parses these files
    as it would parse a real prepared ImageNet; the JPEG bytes are stored
    as they are. `tfds.folder_dataset.write_metadata` (tfds's writer for
    TFRecords made outside a builder) adds `dataset_info.json` and
    `features.json` and reads one example back.
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder(data.IMAGENET.tfds_name, data_dir=directory)
    target = os.fspath(builder.data_path)
    if os.path.isdir(target) and os.listdir(target):
        # Its old shards would stay beside the new ones.
        raise ValueError(
            f"directory already holds a prepared {data.IMAGENET.tfds_name}"
            f" ({target}); remove that folder or write to another "
            f"directory. Received: directory={directory!r}"
        )
    os.makedirs(target, exist_ok=True)
    template = tfds.core.ShardedFileTemplate(
        data_dir=target,
        dataset_name=data.IMAGENET.tfds_name,
        filetype_suffix="tfrecord",
    )
    features = builder.info.features
    records = (
        (
            s.split,
            s.index,
            features.serialize_example(
                {
                    "image": s.jpeg,
                    "label": s.photo,
                    "file_name": f"{s.split}_{s.index:08d}.JPEG",
                }
            ),
        )
        for s in examples
    )
    written = _write_sharded(_tfds_paths(template, counts, shards), records)
    tfds.folder_dataset.write_metadata(
        data_dir=target,
        features=features,
        split_infos=[
            tfds.core.SplitInfo(
                name=split,
                shard_lengths=shards_of.lengths,
                num_bytes=shards_of.num_bytes,
                filename_template=template.replace(split=split),
            )
            for split, shards_of in written.items()
        ],
        version=builder.version,
        description=__doc__.splitlines()[0],
        supervised_keys=builder.info.supervised_keys,
    )
    return {split: shards_of.paths for split, shards_of in written.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--validation", type=int, default=200)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="tfrecord",
        help="ImageNet TFRecords, or a prepared tensorflow-datasets "
        "imagenet2012 directory under --out",
    )
    args = parser.parse_args(argv)
    try:
        paths = write(
            args.out,
            args.train,
            args.validation,
            args.shards,
            args.seed,
            args.layout,
        )
    except ValueError as e:
        parser.error(str(e))
    files = [p for ps in paths.values() for p in ps]
    size = sum(os.path.getsize(p) for p in files)
    print(
        f"wrote {args.train} train and {args.validation} validation "
        f"examples, {size / 2**20:.1f} MiB, to {os.path.commonpath(files)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
