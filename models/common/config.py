"""`CommonConfig`: the validated, frozen settings every main shares.

A config is built once (from flags in a main, or directly in tests and
notebooks) and checked in `__post_init__`, so a bad value or a bad
combination fails before TensorFlow starts any work. Messages follow the
project style: they name the flag, the value received and what is valid.
"""

from __future__ import annotations

import dataclasses

import tfgc
from models.common import cache

STRATEGIES = ("multi_worker_mirrored", "mirrored", "one_device")
ALL_REDUCE_ALGS = ("ring", "nccl")
CLUSTER_RESOLVERS = ("tf_config", "slurm")
# Keras dtype policies: variables stay float32; "mixed_float16" also makes
# `model.compile` wrap the optimizer in a `LossScaleOptimizer`.
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")

# Which compressors take which parameter flag (a constructor argument of
# the same name).
COMPRESSOR_FLAGS = {
    "density": ("topk", "randomk", "mstopk", "redsync", "sbc", "importance"),
    "rank": ("powersgd", "acpsgd"),
    "selection": ("redsync",),
    "warmup_steps": ("redsync", "powersgd", "acpsgd"),
    "delay": ("sbc",),
    "binarize": ("sbc",),
    "bucket_bytes": ("acpsgd",),
}
REDSYNC_SELECTIONS = tfgc.compressors.redsync.SELECTIONS
HIERARCHICAL = "hierarchical"


def _canonical(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _check_seconds(name: str, value) -> None:
    """A finite number of seconds > 0, as a flag takes it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value < float("inf")
    ):
        raise ValueError(
            f"`--{name}` must be a number of seconds > 0, e.g. "
            f"--{name}=30. Received: {name}={value!r}"
        )


def _check_positive_int(name: str, value, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"`--{name}` must be an integer >= 1. Received: {name}={value!r}"
        )


@dataclasses.dataclass(frozen=True)
class CommonConfig:
    """Settings shared by every main; see `models.common.flags` for help.

    Attributes:
        model_dir: where the chief writes checkpoints, TensorBoard summaries
            and `summary.json`.
        compressor: a name from `tfgc.compressors.names()`.
        density: fraction of entries sent by "topk", "randomk", "mstopk",
            "redsync", "sbc" (per side) and "importance"; `None` keeps the
            compressor's default.
        rank: rank of "powersgd" and "acpsgd"; `None` keeps its default.
        error_feedback: keep and re-send what compression dropped (always
            on for "redsync", which keeps its own residual).
        min_compress_size: tensors with fewer elements go dense.
        communicator: a name from `tfgc.communicators.names()`.
        workers_per_host: workers per host of the "hierarchical"
            communicator; `None` reads the hosts from the cluster spec.
        selection: "threshold" or "trimmed", for "redsync"; `None` keeps
            its default ("threshold").
        warmup_steps: steps at the start that "redsync", "powersgd" and
            "acpsgd" send dense; `None` keeps the default (0).
        delay: local steps per communication round of "sbc"; `None` keeps
            its default (1).
        binarize: "sbc" keeps one sign with one value (True, the paper's)
            or sends top-k values (False); `None` keeps the default.
        bucket_bytes: gradient bytes per exchange bucket of "acpsgd";
            `None` keeps its default (25 MiB).
        distribution_strategy: one of `STRATEGIES`.
        all_reduce_alg: "ring" or "nccl" for the collectives, `None` for
            TensorFlow's default.
        cluster_resolver: "tf_config" (the `TF_CONFIG` variable) or "slurm"
            (`SlurmClusterResolver`), for `multi_worker_mirrored` only.
        slurm_port_base: first port of the tasks on a SLURM node.
        train_steps: total training steps; `None` trains whole epochs.
        epochs: number of epochs (the total steps are split evenly over
            them); `None` leaves the model's default.
        eval_steps: evaluation steps; `None` evaluates the whole split.
        skip_eval: do not evaluate after training.
        log_steps: throughput and TensorBoard batch logs every N steps.
        batch_size: batch size per replica; `None` for the model default.
        learning_rate: base learning rate; `None` for the model default.
        use_synthetic_data: random inputs of the real shapes.
        data_dir: where the real data lies.
        seed: random seed for weights, data order and compressors.
        precision: the Keras dtype policy of the model, one of
            `PRECISIONS`; "mixed_float16" trains with dynamic loss scaling.
        startup_timeout: seconds a worker waits for the other tasks of its
            cluster to start (and, at the end, to finish) before it fails
            naming them.
        verbose: TensorFlow's INFO logs and every worker's log lines, not
            just the chief's progress and warnings.
        overwrite: train again from scratch when `model_dir` holds a
            finished run (its files are removed first); without it a
            finished run is reported and not trained again. An
            unfinished run is resumed either way.
        backup_steps: also back up every this many steps (inside epochs);
            `None` backs up at epoch ends and signal stops only.
        stop_timeout: seconds a main may take, after SIGTERM or SIGINT,
            to stop every worker at the same step and save a backup;
            past them it exits without one (the last backup is kept).
        cache: where each worker keeps its input records after the first
            epoch: "none", "memory", "disk" or "auto" (memory up to
            `cache_memory_mb`, the rest on `cache_dir`);
            `models.common.cache`.
        cache_dir: a directory on the node's local disk for "disk" and
            "auto".
        cache_memory_mb: the memory budget of "auto", in MiB.
    """

    model_dir: str
    compressor: str = "identity"
    density: float | None = None
    rank: int | None = None
    error_feedback: bool = True
    min_compress_size: int = 1024
    communicator: str = "auto"
    workers_per_host: int | None = None
    selection: str | None = None
    warmup_steps: int | None = None
    delay: int | None = None
    binarize: bool | None = None
    bucket_bytes: int | None = None
    distribution_strategy: str = "multi_worker_mirrored"
    all_reduce_alg: str | None = None
    cluster_resolver: str = "tf_config"
    slurm_port_base: int = 8888
    train_steps: int | None = None
    epochs: int | None = None
    eval_steps: int | None = None
    skip_eval: bool = False
    log_steps: int = 100
    batch_size: int | None = None
    learning_rate: float | None = None
    use_synthetic_data: bool = False
    data_dir: str | None = None
    seed: int = 0
    precision: str = "float32"
    startup_timeout: float = 300.0
    verbose: bool = False
    overwrite: bool = False
    backup_steps: int | None = None
    stop_timeout: float = 30.0
    cache: str = "none"
    cache_dir: str | None = None
    cache_memory_mb: int = 1024

    def cache_settings(self) -> cache.Settings:
        """The input cache's settings (`models.common.cache`)."""
        return cache.Settings(
            self.cache, self.cache_dir, self.cache_memory_mb * 2**20
        )

    def __post_init__(self):
        if not self.model_dir:
            raise ValueError(
                "`--model_dir` is required: the directory for checkpoints, "
                "TensorBoard summaries and summary.json. Received: "
                f"model_dir={self.model_dir!r}"
            )
        if self.distribution_strategy not in STRATEGIES:
            raise ValueError(
                "`--distribution_strategy` must be one of "
                f"{list(STRATEGIES)}. Received: "
                f"distribution_strategy={self.distribution_strategy!r}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"`--precision` must be one of {list(PRECISIONS)}. "
                f"Received: precision={self.precision!r}"
            )
        self._check_compression()
        self._check_communicator()
        if self.all_reduce_alg is not None:
            if self.all_reduce_alg not in ALL_REDUCE_ALGS:
                raise ValueError(
                    "`--all_reduce_alg` must be one of "
                    f"{list(ALL_REDUCE_ALGS)}. Received: "
                    f"all_reduce_alg={self.all_reduce_alg!r}"
                )
            if self.distribution_strategy == "one_device":
                raise ValueError(
                    "`--all_reduce_alg` has no effect with "
                    "--distribution_strategy=one_device (nothing is "
                    "reduced). Drop it, or use multi_worker_mirrored or "
                    "mirrored."
                )
        if self.cluster_resolver not in CLUSTER_RESOLVERS:
            raise ValueError(
                "`--cluster_resolver` must be one of "
                f"{list(CLUSTER_RESOLVERS)}. Received: "
                f"cluster_resolver={self.cluster_resolver!r}"
            )
        if (
            self.cluster_resolver != "tf_config"
            and self.distribution_strategy != "multi_worker_mirrored"
        ):
            raise ValueError(
                f"`--cluster_resolver={self.cluster_resolver}` needs "
                "--distribution_strategy=multi_worker_mirrored. Received: "
                f"distribution_strategy={self.distribution_strategy!r}"
            )
        if not 1 <= self.slurm_port_base <= 65535:
            raise ValueError(
                "`--slurm_port_base` must be a port in [1, 65535]. Received: "
                f"slurm_port_base={self.slurm_port_base!r}"
            )
        for name in (
            "train_steps",
            "epochs",
            "eval_steps",
            "batch_size",
            "backup_steps",
        ):
            _check_positive_int(name, getattr(self, name))
        _check_positive_int("log_steps", self.log_steps, allow_none=False)
        if (
            isinstance(self.min_compress_size, bool)
            or not isinstance(self.min_compress_size, int)
            or self.min_compress_size < 0
        ):
            raise ValueError(
                "`--min_compress_size` must be an integer >= 0. Received: "
                f"min_compress_size={self.min_compress_size!r}"
            )
        for name in ("startup_timeout", "stop_timeout"):
            _check_seconds(name, getattr(self, name))
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(
                "`--learning_rate` must be > 0. Received: "
                f"learning_rate={self.learning_rate!r}"
            )
        if (
            self.train_steps is not None
            and self.epochs is not None
            and self.train_steps % self.epochs
        ):
            raise ValueError(
                "`--train_steps` is split evenly over `--epochs`, so it must "
                "be a multiple of it. Received: "
                f"train_steps={self.train_steps}, epochs={self.epochs}"
            )
        cache.check(self.cache_settings())
        if self.use_synthetic_data and self.cache != "none":
            raise ValueError(
                "`--cache` has nothing to cache with --use_synthetic_data "
                "(one batch, made in memory). Received: "
                f"cache={self.cache!r}"
            )
        if self.use_synthetic_data:
            if self.train_steps is None:
                raise ValueError(
                    "`--use_synthetic_data` has no epoch length: pass "
                    "`--train_steps` too (e.g. --train_steps=100)."
                )
        elif not self.data_dir:
            raise ValueError(
                "Pass `--data_dir` with the dataset, or `--use_synthetic_data`"
                f" for random inputs. Received: data_dir={self.data_dir!r}"
            )

    def _check_compression(self) -> None:
        names = tfgc.compressors.names()
        key = _canonical(self.compressor)
        if key not in names:
            raise ValueError(
                f"`--compressor` must be one of {names}. Received: "
                f"compressor={self.compressor!r}"
            )
        for flag, takers in COMPRESSOR_FLAGS.items():
            value = getattr(self, flag)
            if value is not None and key not in takers:
                raise ValueError(
                    f"`--{flag}` applies only to --compressor in "
                    f"{list(takers)}. Received: compressor="
                    f"{self.compressor!r}, {flag}={value!r}. Drop "
                    f"--{flag}, or use one of those compressors."
                )
        if self.density is not None and not 0 < self.density <= 1:
            raise ValueError(
                "`--density` must be in (0, 1]. Received: "
                f"density={self.density!r}"
            )
        for flag in ("rank", "delay", "bucket_bytes"):
            _check_positive_int(flag, getattr(self, flag))
        if self.selection is not None and (
            self.selection not in REDSYNC_SELECTIONS
        ):
            raise ValueError(
                f"`--selection` must be one of {list(REDSYNC_SELECTIONS)}"
                f". Received: selection={self.selection!r}"
            )
        if self.warmup_steps is not None and (
            isinstance(self.warmup_steps, bool)
            or not isinstance(self.warmup_steps, int)
            or self.warmup_steps < 0
        ):
            raise ValueError(
                "`--warmup_steps` must be an integer >= 0. Received: "
                f"warmup_steps={self.warmup_steps!r}"
            )
        # Let the library have the last word on its own arguments.
        compressor = tfgc.compressors.get(
            self.compressor, **self.compressor_kwargs()
        )
        if compressor.spec.has_error_feedback and not self.error_feedback:
            raise ValueError(
                "`--noerror_feedback` cannot be used with "
                f"--compressor={key}: it always keeps its own residual "
                "(the accumulated gradient it has not sent yet). Received: "
                f"compressor={self.compressor!r}, error_feedback=False. Drop "
                "--noerror_feedback, or use another compressor."
            )

    def _check_communicator(self) -> None:
        names = tfgc.communicators.names()
        key = _canonical(self.communicator)
        if key not in names:
            raise ValueError(
                f"`--communicator` must be one of {names}. Received: "
                f"communicator={self.communicator!r}"
            )
        hierarchical = key == HIERARCHICAL
        if self.workers_per_host is not None:
            if not hierarchical:
                raise ValueError(
                    "`--workers_per_host` applies only to "
                    "--communicator=hierarchical. Received: "
                    f"communicator={self.communicator!r}, "
                    f"workers_per_host={self.workers_per_host!r}. Drop "
                    "--workers_per_host, or use --communicator=hierarchical."
                )
            _check_positive_int("workers_per_host", self.workers_per_host)
        if hierarchical and self.distribution_strategy == "one_device":
            raise ValueError(
                "`--communicator=hierarchical` needs at least 2 workers, and "
                "--distribution_strategy=one_device runs one. Received: "
                f"communicator={self.communicator!r}, "
                f"distribution_strategy={self.distribution_strategy!r}. Use "
                "--communicator=auto, or start several workers "
                "(python -m tfgc.launch -n 4 --hosts 2 -- python -m ...)."
            )
        compressor = tfgc.compressors.get(
            self.compressor, **self.compressor_kwargs()
        )
        communicator = self.make_communicator()
        for collective in compressor.spec.collectives:
            if not communicator.supports(collective):
                raise ValueError(
                    f"`--communicator={self.communicator}` cannot carry "
                    f"what --compressor={self.compressor} sends "
                    f"({collective}). Received: communicator="
                    f"{self.communicator!r}, compressor={self.compressor!r}. "
                    "Use --communicator=auto, or a compressor it can carry."
                )

    @property
    def compressor_name(self) -> str:
        """`--compressor` as `tfgc.compressors.names()` spells it."""
        return _canonical(self.compressor)

    def compressor_kwargs(self) -> dict:
        """Constructor arguments for `tfgc.compressors.get`.

        RedSync's `momentum` is not among them: `training.compressed_
        optimizer` takes it from the inner optimizer.
        """
        return {
            flag: getattr(self, flag)
            for flag in COMPRESSOR_FLAGS
            if getattr(self, flag) is not None
        }

    def make_communicator(self, options=None):
        """The `tfgc.communicators.Communicator` `--communicator` names.

        Args:
            options: `tf.distribute.experimental.CommunicationOptions` for
                its collectives, or `None`.
        """
        if self.workers_per_host is not None:
            return tfgc.communicators.Hierarchical(
                workers_per_host=self.workers_per_host, options=options
            )
        return tfgc.communicators.get(self.communicator, options=options)

    def steps_per_epoch(self, examples_steps: int | None = None) -> int:
        """Steps in one epoch.

        Args:
            examples_steps: steps in one pass over the training data, or
                `None` for synthetic data.

        Returns:
            `train_steps // epochs` when `train_steps` is set, else
            `examples_steps`.
        """
        if self.train_steps is not None:
            return self.train_steps // (self.epochs or 1)
        if examples_steps is None:
            raise ValueError("steps_per_epoch needs `--train_steps`.")
        return examples_steps

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
