r"""Trains the word-level LSTM language model with tfgc compression.

Zaremba et al. (2014) small / medium / large on PTB-format text:

    python -m models.lstm_lm.main --config=medium --data_dir=/data/ptb \
        --model_dir=/tmp/lstm --compressor=topk --density=0.01

Prints perplexity on the validation and test splits and writes
`summary.json` to `--model_dir`. With `--use_synthetic_data` the same model
trains on random token ids (give `--train_steps`). Under
`python -m tfgc.launch -n 2 -- python -m models.lstm_lm.main ...` every
worker reads its own shard of the windows.
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
from models.common import backup, distribution, stopping, training
from models.common import flags as common_flags
from models.common.callbacks import Perplexity
from models.common.config import CommonConfig
from models.lstm_lm import data, model

SYNTHETIC_EVAL_STEPS = 2

common_flags.define_common_flags()
flags.DEFINE_enum(
    "config",
    "small",
    sorted(model.SIZES),
    "Model size from Zaremba et al.: small (200 hidden, no dropout), "
    "medium (650, dropout 0.5) or large (1500, dropout 0.65).",
)
FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class LstmConfig:
    """Settings of one run.

    Attributes:
        common: the shared settings.
        size: "small", "medium" or "large".
    """

    common: CommonConfig
    size: str = "small"

    def __post_init__(self):
        if self.size not in model.SIZES:
            raise ValueError(
                f"`--config` must be one of {sorted(model.SIZES)}. "
                f"Received: config={self.size!r}"
            )
        c = self.common
        if c.cache != "none":
            raise ValueError(
                "`--cache` has nothing to cache here: the LSTM main reads "
                "its corpus into memory once. Received: "
                f"cache={c.cache!r}"
            )
        if not c.use_synthetic_data:
            missing = data.missing_files(c.data_dir, self.splits)
            if missing:
                names = ", ".join(f"ptb.{s}.txt" for s in self.splits)
                raise ValueError(
                    f"`--data_dir` must hold {names}"
                    + ("" if c.skip_eval else " (or pass --skip_eval)")
                    + f". Missing: {missing}"
                )

    @property
    def splits(self) -> tuple[str, ...]:
        """The PTB splits this run reads: evaluation's only if it runs."""
        if self.common.skip_eval:
            return ("train",)
        return ("train",) + data.EVAL_SPLITS

    @property
    def model_size(self) -> model.ModelSize:
        return model.SIZES[self.size]

    @property
    def epochs(self) -> int:
        if self.common.epochs is not None:
            return self.common.epochs
        return 1 if self.common.train_steps else self.model_size.epochs

    @property
    def batch_size(self) -> int:
        return self.common.batch_size or self.model_size.batch_size

    @property
    def learning_rate(self) -> float:
        return self.common.learning_rate or self.model_size.learning_rate


def config_from_flags() -> LstmConfig:
    """Reads the flags once into a validated config."""
    return LstmConfig(
        common=common_flags.common_config_from_flags(FLAGS), size=FLAGS.config
    )


def _add_perplexity(results: dict[str, float]) -> None:
    Perplexity.add(results)


def run(config: LstmConfig) -> dict[str, Any]:
    """Trains (or resumes) and evaluates; returns the run summary.

    A `--model_dir` that holds a finished run is not trained again (its
    summary is returned) unless `config.common.overwrite` is set.

    Args:
        config: the validated settings.

    Returns:
        The summary written to `summary.json`; perplexities are under
        `summary["eval"]["valid"|"test"]["perplexity"]`.

    Raises:
        models.common.stopping.Stopped: SIGTERM or SIGINT stopped the run
            (exit code 128 + the signal); a backup is kept.
    """
    return backup.run_unless_finished(
        config.common, functools.partial(_train, config)
    )


def _train(
    config: LstmConfig,
    strategy: tf.distribute.Strategy,
    signals: stopping.Signals,
) -> dict[str, Any]:
    c = config.common
    size = config.model_size
    keras.utils.set_random_seed(c.seed)
    global_batch = config.batch_size * strategy.num_replicas_in_sync
    num_steps = size.num_steps

    if c.use_synthetic_data:
        vocab_size = size.vocab_size
        synthetic = data.synthetic_dataset_fn(
            vocab_size, num_steps, global_batch, c.seed
        )

        def train_fn(start_step):
            del start_step  # one batch, repeated
            return synthetic

        steps_per_epoch = c.steps_per_epoch()
        eval_fns = {
            split: (
                data.synthetic_dataset_fn(
                    vocab_size, num_steps, global_batch, c.seed + 1
                ),
                c.eval_steps or SYNTHETIC_EVAL_STEPS,
            )
            for split in data.EVAL_SPLITS
        }
    else:
        corpus = data.load_corpus(c.data_dir, config.splits[1:])
        vocab_size = corpus.vocab_size
        inputs, targets = data.windows(corpus.train, num_steps)

        def train_fn(start_step):
            return data.dataset_fn(
                inputs,
                targets,
                global_batch,
                training=True,
                seed=c.seed,
                start_step=start_step,
            )

        steps_per_epoch = c.steps_per_epoch(
            data.steps_per_pass(len(inputs), global_batch)
        )
        eval_fns = {}
        for split, ids in corpus.evals.items():
            x, y = data.windows(ids, num_steps)
            steps = data.steps_per_pass(len(x), global_batch)
            if steps < 1:
                raise ValueError(
                    f"ptb.{split}.txt has {len(x)} windows of {num_steps} "
                    f"tokens, fewer than one global batch of {global_batch}."
                    " Use a smaller --batch_size."
                )
            if c.eval_steps is not None:
                steps = min(steps, c.eval_steps)
            eval_fns[split] = (
                data.dataset_fn(x, y, global_batch, training=False),
                steps,
            )
    if steps_per_epoch < 1:
        raise ValueError(
            "The training split has fewer windows than one global batch "
            f"of {global_batch}. Use a smaller --batch_size."
        )

    with training.precision_policy(c.precision), strategy.scope():
        lm = model.build_model(size, vocab_size, num_steps, seed=c.seed)
        schedule = model.EpochDecay(
            config.learning_rate, size.lr_decay, size.max_epoch, steps_per_epoch
        )
        optimizer = training.compressed_optimizer(
            c,
            keras.optimizers.SGD(schedule, global_clipnorm=size.max_grad_norm),
        )
        lm.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )

    eval_sets = {}
    if not c.skip_eval:
        eval_sets = {
            split: (distribution.distribute_dataset(strategy, fn), steps)
            for split, (fn, steps) in eval_fns.items()
        }
    summary = training.train_and_evaluate(
        name="lstm_lm",
        config=c,
        strategy=strategy,
        model=lm,
        train_data=lambda start_step: distribution.distribute_dataset(
            strategy, train_fn(start_step)
        ),
        steps_per_epoch=steps_per_epoch,
        epochs=config.epochs,
        global_batch_size=global_batch,
        eval_sets=eval_sets,
        extra_callbacks=(Perplexity(),),
        derived=_add_perplexity,
        model_config={
            "size": config.size,
            **dataclasses.asdict(size),
            "vocab_size": vocab_size,
            "batch_size": config.batch_size,
            "learning_rate": config.learning_rate,
            "tokens_per_step": global_batch * num_steps,
        },
        units_per_example={"tokens": num_steps},
        signals=signals,
    )
    return summary


def main(argv: list[str]) -> None:
    config = common_flags.config_for_main(argv, config_from_flags)
    summary = run(config)
    if not summary["chief"]:
        return
    for split, results in summary["eval"].items():
        perplexity = results.get("perplexity", math.nan)
        print(f"{split} perplexity: {perplexity:.2f}", flush=True)


if __name__ == "__main__":
    common_flags.run(main)
