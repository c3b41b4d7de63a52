r"""Trains ResNet-50 v1.5 on ImageNet with tfgc gradient compression.

    python -m models.resnet50_imagenet.main --data_dir=/data/imagenet \
        --model_dir=/tmp/resnet --batch_size=128 --compressor=topk \
        --density=0.01

`--data_dir` holds ImageNet TFRecords or a prepared tensorflow-datasets
`imagenet2012` directory (see `data.py`). `--cifar_sized` trains a small
ResNet v1.5 (one bottleneck block per stage, width 16, 3x3 stem) on 32x32
images: CIFAR-10 from a prepared tensorflow-datasets `cifar10` directory,
or random images with `--use_synthetic_data`.

SGD with Nesterov-free momentum 0.9, learning rate 0.1 per 256 examples of
global batch (Goyal et al., 2017), linear warm-up over `--warmup_epochs`,
then steps of 10x at 1/3, 2/3 and 8/9 of training (epochs 30, 60, 80 of
90) or a cosine decay; label smoothing 0.1; L2 weight decay 1e-4.
"""

from __future__ import annotations

from tfgc import quiet

# First: TensorFlow's C++ logs at warning level, its start-up notices
# dropped (they ignore the level).
quiet.import_tensorflow()

import dataclasses
import functools
import math
from typing import Any

import keras
import tensorflow as tf
from absl import flags

import tfgc  # noqa: F401  (fixes Keras model.fit under multi-worker)
from models.common import backup, distribution, training
from models.common import flags as common_flags
from models.common.config import CommonConfig
from models.resnet50_imagenet import data, resnet

SYNTHETIC_EVAL_STEPS = 2
LR_SCHEDULES = ("piecewise", "cosine")
BASE_BATCH = 256

common_flags.define_common_flags()
flags.DEFINE_bool(
    "cifar_sized",
    False,
    "Small ResNet v1.5 on 32x32 images (CIFAR-10) for quick runs.",
)
flags.DEFINE_float("label_smoothing", 0.1, "Label smoothing in [0, 1).")
flags.DEFINE_float(
    "warmup_epochs", 5.0, "Epochs of linear learning-rate warm-up."
)
flags.DEFINE_enum(
    "lr_schedule",
    "piecewise",
    list(LR_SCHEDULES),
    "Learning-rate decay after warm-up.",
)
FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class ResnetConfig:
    """Settings of one run.

    Attributes:
        common: the shared settings.
        cifar_sized: the small 32x32 variant.
        label_smoothing: in [0, 1).
        warmup_epochs: linear warm-up length (capped at half the run).
        lr_schedule: "piecewise" or "cosine".
    """

    common: CommonConfig
    cifar_sized: bool = False
    label_smoothing: float = 0.1
    warmup_epochs: float = 5.0
    lr_schedule: str = "piecewise"

    def __post_init__(self):
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(
                "`--label_smoothing` must be in [0, 1). Received: "
                f"label_smoothing={self.label_smoothing!r}"
            )
        if not self.warmup_epochs >= 0:
            raise ValueError(
                "`--warmup_epochs` must be >= 0. Received: "
                f"warmup_epochs={self.warmup_epochs!r}"
            )
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"`--lr_schedule` must be one of {list(LR_SCHEDULES)}. "
                f"Received: lr_schedule={self.lr_schedule!r}"
            )
        c = self.common
        if not c.use_synthetic_data and self.source is None:
            spec = self.spec
            wanted = f"a prepared tensorflow-datasets {spec.tfds_name!r}"
            if spec is data.IMAGENET:
                wanted = (
                    "ImageNet TFRecords (train-*, and validation-* unless "
                    "--skip_eval) or " + wanted
                )
            raise ValueError(
                f"`--data_dir` must hold {wanted} directory (nothing is "
                f"downloaded). Received: data_dir={c.data_dir!r}"
            )

    @property
    def spec(self) -> data.DatasetSpec:
        return data.CIFAR10 if self.cifar_sized else data.IMAGENET

    @property
    def source(self) -> str | None:
        if self.common.use_synthetic_data:
            return None
        return data.find_source(
            self.common.data_dir, self.spec, not self.common.skip_eval
        )

    @property
    def epochs(self) -> int:
        if self.common.epochs is not None:
            return self.common.epochs
        if self.common.train_steps:
            return 1
        return 100 if self.cifar_sized else 90

    @property
    def batch_size(self) -> int:
        return self.common.batch_size or 128

    @property
    def base_learning_rate(self) -> float:
        """Learning rate per 256 examples of global batch."""
        return self.common.learning_rate or 0.1


def config_from_flags() -> ResnetConfig:
    """Reads the flags once into a validated config."""
    return ResnetConfig(
        common=common_flags.common_config_from_flags(FLAGS),
        cifar_sized=FLAGS.cifar_sized,
        label_smoothing=FLAGS.label_smoothing,
        warmup_epochs=FLAGS.warmup_epochs,
        lr_schedule=FLAGS.lr_schedule,
    )


@keras.saving.register_keras_serializable(package="tfgc_models")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak`, then piecewise (10x steps) or cosine decay.

    Args:
        peak: learning rate at the end of warm-up.
        total_steps: steps of the whole run.
        warmup_steps: steps of linear warm-up from 0.
        kind: "piecewise" (x0.1 at 1/3, 2/3 and 8/9 of the run) or
            "cosine" (to 0 at `total_steps`).
    """

    BOUNDARIES = (1 / 3, 2 / 3, 8 / 9)

    def __init__(self, peak, total_steps, warmup_steps, kind="piecewise"):
        self.peak = float(peak)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.kind = kind

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = float(max(self.warmup_steps, 1))
        warm = self.peak * (step + 1.0) / warmup
        if self.kind == "cosine":
            span = float(max(self.total_steps - self.warmup_steps, 1))
            progress = tf.clip_by_value(
                (step - self.warmup_steps) / span, 0.0, 1.0
            )
            decayed = self.peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        else:
            boundaries = [
                float(int(b * self.total_steps)) for b in self.BOUNDARIES
            ]
            passed = tf.add_n(
                [tf.cast(step >= b, tf.float32) for b in boundaries]
            )
            decayed = self.peak * tf.pow(0.1, passed)
        return tf.where(step < self.warmup_steps, warm, decayed)

    def get_config(self):
        return {
            "peak": self.peak,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "kind": self.kind,
        }


def build_model(config: ResnetConfig) -> keras.Model:
    """ResNet-50 v1.5, or the small 32x32 variant."""
    spec = config.spec
    shape = (spec.image_size, spec.image_size, 3)
    if config.cifar_sized:
        return resnet.resnet(
            shape,
            spec.num_classes,
            layers=(1, 1, 1, 1),
            width=16,
            cifar_stem=True,
            name="resnet14_v1_5_cifar",
        )
    return resnet.resnet(shape, spec.num_classes)


def run(config: ResnetConfig) -> dict[str, Any]:
    """Trains (or resumes) and evaluates; returns the run summary.

    Accuracy is under `summary["eval"]["validation"]["accuracy"]`. See
    `models.common.backup.run_unless_finished` for a finished
    `--model_dir` and for SIGTERM and SIGINT.
    """
    return backup.run_unless_finished(
        config.common, functools.partial(_train, config)
    )


def _train(config: ResnetConfig, strategy, signals) -> dict[str, Any]:
    """`run` once the strategy exists and the signals are caught."""
    c = config.common
    spec = config.spec
    keras.utils.set_random_seed(c.seed)
    global_batch = config.batch_size * strategy.num_replicas_in_sync

    if c.use_synthetic_data:
        synthetic = data.synthetic_dataset_fn(spec, global_batch, c.seed)

        def train_fn(start_step):
            del start_step  # one batch, repeated
            return synthetic

        eval_fn = data.synthetic_dataset_fn(spec, global_batch, c.seed + 1)
        steps_per_epoch = c.steps_per_epoch()
        eval_steps = c.eval_steps or SYNTHETIC_EVAL_STEPS
    else:
        source = config.source

        def train_fn(start_step):
            return data.dataset_fn(
                c.data_dir,
                spec,
                source,
                global_batch,
                training=True,
                seed=c.seed,
                start_step=start_step,
                cache_settings=c.cache_settings(),
            )

        eval_fn = data.dataset_fn(
            c.data_dir, spec, source, global_batch, training=False
        )
        steps_per_epoch = c.steps_per_epoch(spec.train_examples // global_batch)
        eval_steps = max(spec.eval_examples // global_batch, 1)
        if c.eval_steps is not None:
            eval_steps = min(eval_steps, c.eval_steps)
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = min(
        int(config.warmup_epochs * steps_per_epoch), total_steps // 2
    )
    peak = config.base_learning_rate * global_batch / BASE_BATCH

    with training.precision_policy(c.precision), strategy.scope():
        model = build_model(config)
        optimizer = training.compressed_optimizer(
            c,
            keras.optimizers.SGD(
                WarmupDecay(
                    peak, total_steps, warmup_steps, config.lr_schedule
                ),
                momentum=0.9,
            ),
        )
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.CategoricalCrossentropy(
                from_logits=True, label_smoothing=config.label_smoothing
            ),
            metrics=[
                keras.metrics.CategoricalAccuracy(name="accuracy"),
                keras.metrics.TopKCategoricalAccuracy(5, name="top5"),
            ],
            jit_compile=False,
        )
    eval_sets = {}
    if not c.skip_eval:
        eval_sets = {
            spec.eval_split: (
                distribution.distribute_dataset(strategy, eval_fn),
                eval_steps,
            )
        }
    return training.train_and_evaluate(
        name=model.name,
        config=c,
        strategy=strategy,
        model=model,
        train_data=lambda start_step: distribution.distribute_dataset(
            strategy, train_fn(start_step)
        ),
        steps_per_epoch=steps_per_epoch,
        epochs=config.epochs,
        global_batch_size=global_batch,
        eval_sets=eval_sets,
        model_config={
            "cifar_sized": config.cifar_sized,
            "dataset": spec.tfds_name,
            "source": config.source or "synthetic",
            "image_size": spec.image_size,
            "num_classes": spec.num_classes,
            "batch_size": config.batch_size,
            "peak_learning_rate": peak,
            "warmup_steps": warmup_steps,
            "lr_schedule": config.lr_schedule,
            "label_smoothing": config.label_smoothing,
        },
        signals=signals,
    )


def main(argv: list[str]) -> None:
    config = common_flags.config_for_main(argv, config_from_flags)
    run(config)


if __name__ == "__main__":
    common_flags.run(main)
