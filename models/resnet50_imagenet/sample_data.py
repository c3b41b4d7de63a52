"""ImageNet-format TFRecords of real photographs, made without a download.

The two photographs that ship with scikit-learn (`load_sample_images`: a
Chinese temple and a flower, 640 x 427) are cut into many distinct
examples: each a random crop (10-100 % of the area, aspect ratio 3/4-4/3),
resized so that its shorter side is 160-400 pixels, maybe mirrored, and
JPEG-encoded at quality 75-95. The label is the photograph (1 or 2, in
the conversion scripts' numbering from 1). The files follow the layout
the ResNet main reads (`train-NNNNN-of-NNNNN`, `validation-...`, features
`image/encoded` and `image/class/label`), so tests and benchmarks decode
real JPEGs of real sizes rather than synthetic tensors:

    python -m models.resnet50_imagenet.sample_data --out /tmp/imagenet_sample \\
        --train 2000 --validation 200 --shards 8
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import tensorflow as tf


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
) -> dict[str, list[str]]:
    """Writes `train` and `validation` examples in `shards` files each;
    returns the paths by split. The same arguments write the same bytes."""
    if min(train, validation) < 0 or shards < 1:
        raise ValueError(
            "train and validation must be >= 0 and shards >= 1. Received: "
            f"train={train}, validation={validation}, shards={shards}"
        )
    os.makedirs(directory, exist_ok=True)
    photos = photographs()
    rng = np.random.default_rng(seed)
    paths: dict[str, list[str]] = {}
    for split, count in (("train", train), ("validation", validation)):
        paths[split] = [
            os.path.join(directory, f"{split}-{s:05d}-of-{shards:05d}")
            for s in range(shards)
        ]
        writers = [tf.io.TFRecordWriter(p) for p in paths[split]]
        for i in range(count):
            label = int(rng.integers(len(photos)))
            jpeg = example(photos[label], rng)
            writers[i % shards].write(_serialized(jpeg, label + 1))
        for writer in writers:
            writer.close()
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--validation", type=int, default=200)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        paths = write(
            args.out, args.train, args.validation, args.shards, args.seed
        )
    except ValueError as e:
        parser.error(str(e))
    size = sum(os.path.getsize(p) for ps in paths.values() for p in ps)
    print(
        f"wrote {args.train} train and {args.validation} validation "
        f"examples, {size / 2**20:.1f} MiB, to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
