"""Strategy factory, chief detection and per-worker output directories."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

import tensorflow as tf

from models.common import cluster as cluster_lib
from models.common import logs
from models.common.config import CommonConfig

_Implementation = tf.distribute.experimental.CommunicationImplementation
# Placeholder "GPUs" per node for SlurmClusterResolver on CPU-only nodes: an
# upper bound on tasks per node.
_CPU_TASK_SLOTS = 4096


def communication_options(
    config: CommonConfig,
) -> tf.distribute.experimental.CommunicationOptions | None:
    """`--all_reduce_alg` as `CommunicationOptions` (`None`: TF's default)."""
    if config.all_reduce_alg is None:
        return None
    implementation = {
        "ring": _Implementation.RING,
        "nccl": _Implementation.NCCL,
    }[config.all_reduce_alg]
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation
    )


def slurm_cluster_resolver(
    port_base: int = 8888,
) -> tf.distribute.cluster_resolver.SlurmClusterResolver:
    """TensorFlow's `SlurmClusterResolver`, also on nodes without GPUs.

    Reads `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`, `SLURM_STEP_NODELIST` and
    `SLURM_STEP_TASKS_PER_NODE`; task i of a node listens on
    `port_base + i`. On GPU nodes the resolver splits the node's GPUs among
    its tasks. Without `nvidia-smi` or `CUDA_VISIBLE_DEVICES` it would fail
    while counting GPUs, so there every task gets a placeholder slot and the
    visible devices are left alone.
    """
    resolver_cls = tf.distribute.cluster_resolver.SlurmClusterResolver
    if shutil.which("nvidia-smi") or os.environ.get("CUDA_VISIBLE_DEVICES"):
        return resolver_cls(port_base=port_base)
    return resolver_cls(
        port_base=port_base,
        gpus_per_node=_CPU_TASK_SLOTS,
        gpus_per_task=1,
        auto_set_gpu=False,
    )


def make_strategy(config: CommonConfig) -> tf.distribute.Strategy:
    """Builds the strategy `--distribution_strategy` names.

    A multi-worker strategy waits at most `--startup_timeout` seconds for
    every task of the cluster to start. Without `--verbose`, the workers
    other than the chief log warnings and errors only.

    Raises:
        ValueError: `--all_reduce_alg=nccl` without a GPU.
        cluster_lib.ClusterError: tasks of the cluster did not start in time
            (it names them).
    """
    resolver = None
    if config.cluster_resolver == "slurm":
        resolver = slurm_cluster_resolver(config.slurm_port_base)
        # Resolving sets this task's CUDA_VISIBLE_DEVICES; do it before
        # TensorFlow enumerates the GPUs.
        resolver.cluster_spec()
    # Physical, not logical: listing logical devices initialises the eager
    # context, after which MultiWorkerMirroredStrategy can no longer
    # configure its collectives.
    gpus = tf.config.list_physical_devices("GPU")
    if config.all_reduce_alg == "nccl" and not gpus:
        raise ValueError(
            "`--all_reduce_alg=nccl` needs GPUs and none is visible. Use "
            "--all_reduce_alg=ring (or leave it out) on CPUs."
        )
    name = config.distribution_strategy
    if name == "one_device":
        device = "/gpu:0" if gpus else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)
    if name == "mirrored":
        cross_device_ops = None
        if config.all_reduce_alg == "nccl":
            cross_device_ops = tf.distribute.NcclAllReduce()
        elif config.all_reduce_alg == "ring":
            # MirroredStrategy has no ring; reduce on one device instead.
            cross_device_ops = tf.distribute.ReductionToOneDevice()
        return tf.distribute.MirroredStrategy(cross_device_ops=cross_device_ops)
    strategy = cluster_lib.multi_worker_strategy(
        resolver, config.startup_timeout, communication_options(config)
    )
    if not config.verbose and not is_chief(strategy):
        logs.show_warnings_only()
    return strategy


def task_info(strategy: tf.distribute.Strategy) -> tuple[str | None, int]:
    """This process's `(task_type, task_id)`; `(None, 0)` without a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return None, 0
    return resolver.task_type, int(resolver.task_id or 0)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints, summaries and the summary.

    The chief is the "chief" task if the cluster has one, else worker 0, and
    the only process of a single-process strategy.
    """
    task_type, task_id = task_info(strategy)
    if task_type is None or task_type == "chief":
        return True
    cluster = strategy.cluster_resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and "chief" not in cluster


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Number of worker processes in the cluster (1 without one)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return 1
    cluster = resolver.cluster_spec().as_dict()
    return sum(len(cluster.get(t, [])) for t in ("chief", "worker")) or 1


def output_dir(model_dir: str, strategy: tf.distribute.Strategy) -> str:
    """`model_dir` on the chief; a fresh temporary directory elsewhere.

    Every worker must run the same callbacks (some of them read values in
    collectives), but only the chief's files are kept: the others write
    into a directory of their own that the caller may delete afterwards.
    """
    if is_chief(strategy):
        os.makedirs(model_dir, exist_ok=True)
        return model_dir
    task_type, task_id = task_info(strategy)
    return tempfile.mkdtemp(prefix=f"tfgc_{task_type}{task_id}_")


def distribute_dataset(
    strategy: tf.distribute.Strategy,
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
):
    """Calls `dataset_fn` once per worker input pipeline.

    `dataset_fn` gets a `tf.distribute.InputContext`; it shards by
    `input_pipeline_id` and batches with
    `get_per_replica_batch_size(global_batch)`.
    """
    return strategy.distribute_datasets_from_function(dataset_fn)
