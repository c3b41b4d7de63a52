"""ImageNet (and CIFAR-10) input pipelines, sharded per worker.

Sources, looked up in `--data_dir`:
- ImageNet TFRecords as written by the usual conversion scripts:
  `train-*-of-*` and `validation-*-of-*` files of `tf.train.Example`s with
  `image/encoded` (JPEG) and `image/class/label` (1..1000).
- a prepared tensorflow-datasets directory: `<data_dir>/imagenet2012/<ver>`
  (or `cifar10/<ver>` with `--cifar_sized`); nothing is downloaded.

Training preprocessing (ImageNet): a random crop covering 8-100 % of the
image with aspect ratio 3/4-4/3 (decoded with `decode_and_crop_jpeg`, so
only the crop is decoded), bilinear resize to 224x224, random horizontal
flip, per-channel mean/std normalisation. Evaluation: a central crop of
224/256 of the shorter side, resized to 224x224. CIFAR-10: 4-pixel pad
and random 32x32 crop plus flip for training, the plain image for
evaluation. Labels come out one-hot (for label smoothing).

Every input pipeline (one per worker under `distribute_datasets_from_function`)
reads its own subset of files, repeats forever and batches per replica; the
caller bounds the steps.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import tensorflow as tf

from models.common import cache

_AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What the model needs to know about a dataset."""

    tfds_name: str
    image_size: int
    num_classes: int
    train_examples: int
    eval_examples: int
    eval_split: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


IMAGENET = DatasetSpec(
    "imagenet2012",
    224,
    1000,
    1_281_167,
    50_000,
    "validation",
    (0.485, 0.456, 0.406),
    (0.229, 0.224, 0.225),
)
CIFAR10 = DatasetSpec(
    "cifar10",
    32,
    10,
    50_000,
    10_000,
    "test",
    (0.4914, 0.4822, 0.4465),
    (0.2470, 0.2435, 0.2616),
)

TFRECORD_PATTERNS = {"train": "train-*", "eval": "validation-*"}


def tfrecord_files(data_dir: str, split: str) -> list[str]:
    """ImageNet TFRecord files of `split` ("train" or "eval")."""
    return sorted(glob.glob(os.path.join(data_dir, TFRECORD_PATTERNS[split])))


def find_source(
    data_dir: str, spec: DatasetSpec, evaluate: bool = True
) -> str | None:
    """ "tfrecord", "tfds", or `None` when `data_dir` holds neither.

    TFRecords count only with the validation files too, unless the run
    does not evaluate (`evaluate=False`).
    """
    splits = ("train", "eval") if evaluate else ("train",)
    if spec is IMAGENET and all(tfrecord_files(data_dir, s) for s in splits):
        return "tfrecord"
    prepared = os.path.join(data_dir, spec.tfds_name, "*", "dataset_info.json")
    if glob.glob(prepared):
        return "tfds"
    return None


def _normalize(image, spec: DatasetSpec):
    mean = tf.constant(spec.mean, tf.float32) * 255.0
    std = tf.constant(spec.std, tf.float32) * 255.0
    return (tf.cast(image, tf.float32) - mean) / std


def imagenet_train_image(image_bytes, size: int = 224):
    """Random-resized crop and flip of an encoded JPEG, as float32 0-255."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
    begin, crop, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=whole,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    top, left, _ = tf.unstack(begin)
    height, width, _ = tf.unstack(crop)
    image = tf.image.decode_and_crop_jpeg(
        image_bytes, tf.stack([top, left, height, width]), channels=3
    )
    image = tf.image.resize(image, [size, size], method="bilinear")
    return tf.image.random_flip_left_right(image)


def imagenet_eval_image(image_bytes, size: int = 224, padding: int = 32):
    """Central crop of `size / (size + padding)` of the shorter side."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    height, width = shape[0], shape[1]
    ratio = size / (size + padding)
    side = tf.cast(
        ratio * tf.cast(tf.minimum(height, width), tf.float32), tf.int32
    )
    top = (height - side + 1) // 2
    left = (width - side + 1) // 2
    image = tf.image.decode_and_crop_jpeg(
        image_bytes, tf.stack([top, left, side, side]), channels=3
    )
    return tf.image.resize(image, [size, size], method="bilinear")


def cifar_train_image(image, size: int = 32):
    """4-pixel zero pad, random crop back to `size`, random flip."""
    image = tf.image.resize_with_crop_or_pad(image, size + 8, size + 8)
    image = tf.image.random_crop(image, [size, size, 3])
    return tf.image.random_flip_left_right(image)


def _preprocess(spec: DatasetSpec, training: bool):
    def fn(image, label):
        if spec is IMAGENET:
            if training:
                image = imagenet_train_image(image, spec.image_size)
            else:
                image = imagenet_eval_image(image, spec.image_size)
        elif training:
            image = cifar_train_image(image, spec.image_size)
        image = _normalize(image, spec)
        label = tf.one_hot(tf.cast(label, tf.int32), spec.num_classes)
        return image, label

    return fn


def _parse_example(serialized):
    features = tf.io.parse_single_example(
        serialized,
        {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    # The conversion scripts number classes from 1 (0 was "background").
    return features["image/encoded"], features["image/class/label"] - 1


def _tfrecord_examples(paths, training, seed):
    files = tf.data.Dataset.from_tensor_slices(list(paths))
    if training:
        files = files.shuffle(1024, seed=seed)
    ds = files.interleave(
        tf.data.TFRecordDataset,
        cycle_length=8,
        num_parallel_calls=_AUTOTUNE,
        deterministic=not training,
    )
    return ds.map(_parse_example, num_parallel_calls=_AUTOTUNE)


def _tfds_examples(data_dir, spec, training, context, seed):
    import tensorflow_datasets as tfds

    decoders = None
    if spec is IMAGENET:
        # Keep the JPEG bytes: only the crop gets decoded.
        decoders = {"image": tfds.decode.SkipDecoding()}
    ds = tfds.builder(spec.tfds_name, data_dir=data_dir).as_dataset(
        split="train" if training else spec.eval_split,
        shuffle_files=training,
        decoders=decoders,
        read_config=tfds.ReadConfig(input_context=context, shuffle_seed=seed),
    )
    return ds.map(lambda ex: (ex["image"], ex["label"]))


def _tfds_unit(data_dir, spec, split, context) -> cache.Unit:
    """This pipeline's share of a prepared tensorflow-datasets split, as
    one unit: its size an even share of the split's files, its stamp
    theirs."""
    pattern = os.path.join(data_dir, spec.tfds_name, "*", f"*-{split}.*")
    files = cache.file_units(sorted(glob.glob(pattern)))
    share = sum(u.size for u in files) // context.num_input_pipelines
    stamp = cache.fingerprint(files, {})
    return cache.Unit(f"{spec.tfds_name}:{split}", share, stamp)


def _records(data_dir, spec, source, training, context, seed, settings):
    """This pipeline's (encoded image, label) pairs, one pass, cached
    after the first as `settings` says (`models.common.cache`)."""
    split = "train" if training else spec.eval_split
    if source == "tfrecord":
        paths = tfrecord_files(data_dir, "train" if training else "eval")
        paths = paths[context.input_pipeline_id :: context.num_input_pipelines]
        units = cache.file_units(paths)

        def records_of(chosen):
            return _tfrecord_examples([u.name for u in chosen], training, seed)

    else:
        units = [_tfds_unit(data_dir, spec, split, context)]

        def records_of(chosen):
            del chosen  # the one unit: the pipeline's share
            return _tfds_examples(data_dir, spec, training, context, seed)

    if settings.level == "none":
        return records_of(units)
    shard = (
        f"{source}-{spec.tfds_name}-{split}-"
        f"{context.input_pipeline_id}-of-{context.num_input_pipelines}"
    )
    config = {
        "records": f"{source}: encoded image, label from 0",
        "dataset": spec.tfds_name,
        "split": split,
        "shard": shard,
    }
    plan = cache.plan(settings, units, config, shard)
    cache.log(plan)
    return cache.cached(plan, records_of, seed)


def dataset_fn(
    data_dir: str,
    spec: DatasetSpec,
    source: str,
    global_batch_size: int,
    training: bool,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    start_step: int = 0,
    cache_settings: cache.Settings = cache.NO_CACHE,
):
    """A function for `strategy.distribute_datasets_from_function`.

    Files are read in parallel and in no fixed order (for speed), so the
    order of the examples is not reproducible; a training run resumed at
    `start_step` shuffles with a seed drawn from `(seed, start_step)`, so
    that it does not replay the order the run started with.

    Args:
        data_dir: the dataset directory.
        spec: `IMAGENET` or `CIFAR10`.
        source: "tfrecord" or "tfds" (see `find_source`).
        global_batch_size: examples per step over all replicas.
        training: training (shuffled, augmented) or evaluation pipeline.
        seed: shuffle seed.
        shuffle_buffer: examples in the shuffle buffer.
        start_step: the global step the training pipeline starts at.
        cache_settings: where each pipeline keeps its records after the
            first epoch (`models.common.cache`); shuffling and
            augmentation come after the cache.
    """
    if start_step:
        seed = int(
            np.random.SeedSequence([seed, start_step]).generate_state(1)[0]
        )

    def fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch_size)
        ds = _records(
            data_dir, spec, source, training, context, seed, cache_settings
        )
        if training:
            ds = ds.shuffle(shuffle_buffer, seed=seed)
        ds = ds.repeat()
        ds = ds.map(_preprocess(spec, training), num_parallel_calls=_AUTOTUNE)
        ds = ds.batch(batch, drop_remainder=True)
        options = tf.data.Options()
        options.experimental_deterministic = not training
        return ds.with_options(options).prefetch(_AUTOTUNE)

    return fn


def synthetic_dataset_fn(
    spec: DatasetSpec, global_batch_size: int, seed: int = 0
):
    """One random, normalised-looking batch of the real shapes, repeated."""

    def fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch_size)
        rng = np.random.default_rng(seed + context.input_pipeline_id)
        size = spec.image_size
        images = rng.normal(size=(batch, size, size, 3)).astype(np.float32)
        labels = rng.integers(0, spec.num_classes, size=batch)
        one_hot = np.eye(spec.num_classes, dtype=np.float32)[labels]
        return tf.data.Dataset.from_tensors((images, one_hot)).repeat()

    return fn
