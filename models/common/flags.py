"""The absl flags every main shares, reading them once into a config, and
`run`, which runs a main.

A main calls `define_common_flags()` at import time, defines its own flags,
in `main()` calls `common_config_from_flags()` exactly once, and starts
with `run(main)`. Nothing outside the mains reads `FLAGS`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from absl import app, flags

import tfgc
from models.common import cache, cluster, logs
from models.common.config import (
    ALL_REDUCE_ALGS,
    CLUSTER_RESOLVERS,
    PRECISIONS,
    REDSYNC_SELECTIONS,
    STRATEGIES,
    CommonConfig,
)

_Config = TypeVar("_Config")


def define_common_flags() -> None:
    """Defines the shared flags on `absl.flags.FLAGS` (once per process)."""
    if "compressor" in flags.FLAGS:
        return
    flags.DEFINE_string(
        "model_dir",
        None,
        "Directory for the backup of an unfinished run, TensorBoard "
        "summaries, the trained model (model.keras, model.weights.h5) and "
        "summary.json. Only the chief writes here. The same command run "
        "again resumes an unfinished run.",
    )
    flags.DEFINE_bool(
        "overwrite",
        False,
        "Train again from scratch when --model_dir holds a finished run "
        "(its files are removed). Without it, a finished run is reported "
        "and not trained again.",
    )
    flags.DEFINE_integer(
        "backup_steps",
        None,
        "Also back up every N steps, inside epochs (each backup gathers "
        "every worker's state and writes it). Default: at every epoch's "
        "end and when a signal stops the run.",
    )
    flags.DEFINE_float(
        "stop_timeout",
        30.0,
        "Seconds after SIGTERM or SIGINT within which every worker stops "
        "after the same step and saves a backup; past them the main exits "
        "without a new backup.",
    )
    flags.DEFINE_enum(
        "compressor",
        "identity",
        tfgc.compressors.names(),
        "Gradient compressor ('identity' sends dense gradients).",
    )
    flags.DEFINE_float(
        "density",
        None,
        "Fraction of gradient entries sent, for topk, randomk, mstopk, "
        "redsync, sbc (per sign) and importance.",
    )
    flags.DEFINE_integer(
        "rank", None, "Rank of the powersgd and acpsgd approximations."
    )
    flags.DEFINE_bool(
        "error_feedback",
        True,
        "Add what compression dropped to the next step's gradient (redsync "
        "always does: --noerror_feedback is refused with it).",
    )
    flags.DEFINE_integer(
        "min_compress_size",
        1024,
        "Gradients with fewer elements are sent dense.",
    )
    flags.DEFINE_enum(
        "selection",
        None,
        list(REDSYNC_SELECTIONS),
        "RedSync's selection, with --compressor=redsync only: threshold "
        "(k to 2k entries per worker; the default) or trimmed (exactly k).",
    )
    flags.DEFINE_integer(
        "warmup_steps",
        None,
        "Steps at the start that send every gradient dense, with "
        "--compressor=redsync, powersgd or acpsgd (default 0).",
    )
    flags.DEFINE_integer(
        "delay",
        None,
        "SBC's communication delay: local steps per round, with "
        "--compressor=sbc only (default 1).",
    )
    flags.DEFINE_bool(
        "binarize",
        None,
        "SBC keeps one sign with one value (the paper's; default) or, with "
        "--nobinarize, sends top-k values; --compressor=sbc only.",
    )
    flags.DEFINE_integer(
        "bucket_bytes",
        None,
        "Gradient bytes per exchange bucket, with --compressor=acpsgd only "
        "(default 25 MiB).",
    )
    flags.DEFINE_enum(
        "communicator",
        "auto",
        tfgc.communicators.names(),
        "How tfgc exchanges payloads: auto (all-reduce for linear payloads, "
        "all-gather for the rest), allreduce, allgather, or hierarchical "
        "(HiTopKComm: sum inside each host, compress only between hosts; "
        "needs >= 2 workers).",
    )
    flags.DEFINE_integer(
        "workers_per_host",
        None,
        "Workers per host for --communicator=hierarchical only. Default: "
        "the host names of the cluster spec.",
    )
    flags.DEFINE_enum(
        "distribution_strategy",
        "multi_worker_mirrored",
        list(STRATEGIES),
        "tf.distribute strategy. multi_worker_mirrored reads TF_CONFIG "
        "(a single local worker without it).",
    )
    flags.DEFINE_enum(
        "all_reduce_alg",
        None,
        list(ALL_REDUCE_ALGS),
        "Collective implementation: CommunicationOptions of tfgc's "
        "collectives (and of multi_worker_mirrored's own); NcclAllReduce / "
        "ReductionToOneDevice for mirrored's own. Default: TensorFlow's "
        "choice.",
    )
    flags.DEFINE_enum(
        "cluster_resolver",
        "tf_config",
        list(CLUSTER_RESOLVERS),
        "How multi_worker_mirrored finds its cluster: the TF_CONFIG "
        "variable, or SLURM's environment (SlurmClusterResolver).",
    )
    flags.DEFINE_integer(
        "slurm_port_base",
        8888,
        "With --cluster_resolver=slurm, task i of a node listens on this "
        "port + i.",
    )
    flags.DEFINE_integer(
        "train_steps",
        None,
        "Total training steps (split evenly over --epochs). Default: "
        "whole epochs of the training data.",
    )
    flags.DEFINE_integer(
        "epochs", None, "Number of epochs. Default: the model's own."
    )
    flags.DEFINE_integer(
        "eval_steps",
        None,
        "Evaluation steps. Default: the whole evaluation split.",
    )
    flags.DEFINE_bool("skip_eval", False, "Do not evaluate after training.")
    flags.DEFINE_integer(
        "log_steps",
        100,
        "Log throughput and write TensorBoard batch summaries every N steps.",
    )
    flags.DEFINE_integer(
        "batch_size",
        None,
        "Batch size per replica (the global batch is this times the number "
        "of replicas). Default: the model's own.",
    )
    flags.DEFINE_float(
        "learning_rate",
        None,
        "Base learning rate. Default: the model's own.",
    )
    flags.DEFINE_bool(
        "use_synthetic_data",
        False,
        "Train and evaluate on random inputs of the real shapes.",
    )
    flags.DEFINE_string("data_dir", None, "Directory of the real dataset.")
    flags.DEFINE_enum(
        "cache",
        "none",
        list(cache.LEVELS),
        "Keep each worker's input records after the first epoch: in "
        "memory, on the node's local disk (--cache_dir), or auto: in memory "
        "up to --cache_memory_mb, the rest on disk. For data on slow "
        "network storage.",
    )
    flags.DEFINE_string(
        "cache_dir",
        None,
        "Directory on the node's local disk for --cache=disk or auto (one "
        "subdirectory per worker shard; one run at a time).",
    )
    flags.DEFINE_integer(
        "cache_memory_mb", 1024, "Memory budget of --cache=auto, in MiB."
    )
    flags.DEFINE_integer("seed", 0, "Random seed.")
    flags.DEFINE_enum(
        "precision",
        "float32",
        list(PRECISIONS),
        "Keras dtype policy: float32, or compute in bfloat16 / float16 "
        "with float32 variables (mixed_float16 adds dynamic loss scaling).",
    )
    flags.DEFINE_float(
        "startup_timeout",
        300.0,
        "Seconds a worker waits for the other tasks of its cluster to "
        "start (and, at the end, to finish) before it fails naming them.",
    )
    flags.DEFINE_bool(
        "verbose",
        False,
        "Show TensorFlow's INFO logs and every worker's log lines, not just "
        "the chief's progress and warnings.",
    )


def common_config_from_flags(
    flag_values: flags.FlagValues = flags.FLAGS,
) -> CommonConfig:
    """Reads the shared flags once into a validated `CommonConfig`.

    Raises:
        ValueError: a value or a combination of values is invalid.
    """
    f = flag_values
    return CommonConfig(
        model_dir=f.model_dir,
        compressor=f.compressor,
        density=f.density,
        rank=f.rank,
        error_feedback=f.error_feedback,
        min_compress_size=f.min_compress_size,
        communicator=f.communicator,
        workers_per_host=f.workers_per_host,
        selection=f.selection,
        warmup_steps=f.warmup_steps,
        delay=f.delay,
        binarize=f.binarize,
        bucket_bytes=f.bucket_bytes,
        distribution_strategy=f.distribution_strategy,
        all_reduce_alg=f.all_reduce_alg,
        cluster_resolver=f.cluster_resolver,
        slurm_port_base=f.slurm_port_base,
        train_steps=f.train_steps,
        epochs=f.epochs,
        eval_steps=f.eval_steps,
        skip_eval=f.skip_eval,
        log_steps=f.log_steps,
        batch_size=f.batch_size,
        learning_rate=f.learning_rate,
        use_synthetic_data=f.use_synthetic_data,
        data_dir=f.data_dir,
        seed=f.seed,
        precision=f.precision,
        startup_timeout=f.startup_timeout,
        verbose=f.verbose,
        overwrite=f.overwrite,
        backup_steps=f.backup_steps,
        stop_timeout=f.stop_timeout,
        cache=f.cache,
        cache_dir=f.cache_dir,
        cache_memory_mb=f.cache_memory_mb,
    )


def config_for_main(
    argv: list[str], config_from_flags: Callable[[], _Config]
) -> _Config:
    """The validated config of a main's run: `config_from_flags()`.

    Raises:
        app.UsageError: `argv` has arguments besides the program name, or
            `config_from_flags` raised a ValueError (its message).
    """
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        return config_from_flags()
    except ValueError as err:
        raise app.UsageError(str(err)) from err


def _program() -> str:
    """How the running main was started, e.g. `python -m models.x.main`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return f"python -m {spec.name}"
    return f"python {sys.argv[0]}"


def _fail(message: str, see_help: bool = True) -> NoReturn:
    """Ends the process with `message` first (exit code 1)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    if see_help:
        print(f"see {_program()} --help", file=sys.stderr, flush=True)
    sys.exit(1)


def _parse(argv: list[str]) -> list[str]:
    """absl's flag parsing, with its error in one line (no usage)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        _fail(str(err))


def run(main: Callable[[list[str]], None]) -> NoReturn:
    """Runs a main as `absl.app.run(main)` does, errors first.

    Sets up logging (`logs.configure`, `--verbose`) before `main` and ends
    a multi-worker run with `cluster.finish_run()` after it, so that
    the workers leave together and the exit code says whether every worker
    finished. A flag that does not parse, or a value the config refuses
    (`app.UsageError`), prints one line naming the flag and the fix, then
    where the usage is (`--help`); a worker that cannot join its cluster
    or finish with it prints what went wrong. Both exit with code 1.
    """

    def checked(argv: list[str]) -> None:
        logs.configure(verbose=flags.FLAGS.verbose)
        try:
            main(argv)
            cluster.finish_run()
        except app.UsageError as err:
            _fail(str(err))
        except cluster.ClusterError as err:
            _fail(str(err), see_help=False)

    app.run(checked, flags_parser=_parse)
