"""Compile-independent training driver: optimizer, fit, evaluate, summary."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import keras
import tensorflow as tf
from absl import logging

import tfgc
from models.common import backup as backup_lib
from models.common import callbacks as callbacks_lib
from models.common import distribution, stopping
from models.common.config import CommonConfig


@contextlib.contextmanager
def precision_policy(precision: str) -> Iterator[None]:
    """Sets Keras's global dtype policy to `precision` inside the block.

    Build and compile the model inside it: each layer keeps the policy it
    was created under (so training may run outside), and with
    "mixed_float16" `model.compile` wraps the optimizer in a
    `keras.optimizers.LossScaleOptimizer` (tfgc makes every worker skip
    the same non-finite steps). The previous policy is restored on the way
    out, also after an error.

    Args:
        precision: one of `models.common.config.PRECISIONS`.
    """
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def compressed_optimizer(
    config: CommonConfig, inner: keras.optimizers.Optimizer
) -> tfgc.CompressedOptimizer:
    """Wraps `inner` as the compression and communicator flags ask.

    `--compressor=redsync` applies momentum itself (momentum correction:
    each worker accumulates its own momentum before selecting), so the
    inner optimizer's momentum moves into it: `inner` must be a
    `keras.optimizers.SGD` without Nesterov; RedSync gets
    `momentum=inner.momentum`, and `inner` is replaced by an SGD with the
    same learning rate (or schedule), clipping and weight decay but
    momentum 0, which applies the summed update as it is. With plain SGD
    (the LSTM) RedSync's momentum is 0; with ResNet-50's SGD it is 0.9.

    `--all_reduce_alg` reaches tfgc's collectives as the optimizer's
    `communication_options` (RING or NCCL). tfgc runs its own collective
    ops, so the strategy's `communication_options` (multi-worker) or
    `cross_device_ops` (mirrored) cover only the strategy's own reductions
    (metrics, losses), not the gradients.

    Raises:
        ValueError: `--compressor=redsync` with an inner optimizer other
            than SGD, or with Nesterov momentum.
    """
    kwargs = config.compressor_kwargs()
    if config.compressor_name == "redsync":
        kwargs["momentum"], inner = _momentum_moved_out(inner)
    options = distribution.communication_options(config)
    if config.workers_per_host is not None:
        # A communicator instance carries its own options.
        communicator, options = config.make_communicator(options), None
    else:
        communicator = config.communicator
    return tfgc.CompressedOptimizer(
        inner,
        compressor=tfgc.compressors.get(config.compressor, **kwargs),
        error_feedback=config.error_feedback,
        communicator=communicator,
        communication_options=options,
        min_compress_size=config.min_compress_size,
        seed=config.seed,
    )


def _momentum_moved_out(
    inner: keras.optimizers.Optimizer,
) -> tuple[float, keras.optimizers.SGD]:
    """`(momentum, the same SGD with momentum 0)` for RedSync."""
    if type(inner) is not keras.optimizers.SGD:
        raise ValueError(
            "--compressor=redsync applies the momentum of the model's "
            "optimizer itself, so that optimizer must be "
            "keras.optimizers.SGD. Received: "
            f"{type(inner).__name__}. Use another --compressor."
        )
    if inner.nesterov:
        raise ValueError(
            "--compressor=redsync applies plain (heavy-ball) momentum; the "
            "model's SGD uses Nesterov momentum. Received: "
            f"SGD(momentum={inner.momentum}, nesterov=True). Use another "
            "--compressor."
        )
    sgd_config = inner.get_config()
    sgd_config.update(momentum=0.0, nesterov=False)
    return float(inner.momentum), keras.optimizers.SGD.from_config(sgd_config)


def _floats(logs: Mapping[str, Any] | None) -> dict[str, float]:
    return {k: float(v) for k, v in (logs or {}).items()}


def train_and_evaluate(
    *,
    name: str,
    config: CommonConfig,
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    train_data: Callable[[int], Any],
    steps_per_epoch: int,
    epochs: int,
    global_batch_size: int,
    eval_sets: Mapping[str, tuple[Any, int]] | None = None,
    extra_callbacks: tuple[keras.callbacks.Callback, ...] = (),
    derived: Callable[[dict[str, float]], None] | None = None,
    model_config: Mapping[str, Any] | None = None,
    units_per_example: Mapping[str, int] | None = None,
    signals: stopping.Signals | None = None,
) -> dict[str, Any]:
    """Trains (or resumes), saves the model, evaluates, writes the summary.

    Every worker runs this whole function (fit, the model save and
    evaluate are collective); only the chief's outputs land in
    `config.model_dir` (see `models.common.backup` for its layout). A
    backup left there by an interrupted run is restored first, and
    training goes on from its step as if it had never stopped. The backup
    is removed only after `summary.json` (with `"finished": true`) is
    written.

    Args:
        name: the model's name, for the summary.
        config: the shared settings.
        strategy: the strategy `model` was built and compiled under.
        model: a compiled model whose optimizer is a `CompressedOptimizer`
            (or a `LossScaleOptimizer` around one, under "mixed_float16").
        train_data: `start_step -> dataset`: a (distributed) dataset that
            does not run out, whose first batch is the one of global step
            `start_step` (0-based) of a run that never stopped.
        steps_per_epoch: steps in one epoch.
        epochs: number of epochs.
        global_batch_size: examples per step over all replicas.
        eval_sets: name -> `(dataset, steps)` to evaluate after training,
            e.g. `{"valid": ..., "test": ...}`.
        extra_callbacks: model-specific callbacks that add to the logs.
        derived: adds derived metrics (e.g. perplexity) to a dict of
            results in place; applied to the final train and eval results.
        model_config: model-specific settings for the summary.
        units_per_example: other throughput units, e.g. `{"tokens": 35}`
            adds `tokens_per_second` to the summary.
        signals: the main's `stopping.Signals`: SIGTERM or SIGINT during
            `fit` then stops every worker after the same step with a
            backup (`stopping.Stopped`).

    Returns:
        The run summary (also written as JSON to `<output dir>/summary.json`).

    Raises:
        stopping.Stopped: a signal stopped the run (the backup is kept).
        tfgc.callbacks.BackupError: the backup is damaged beyond use.
        ValueError: the backup was written with other settings.
    """
    chief = distribution.is_chief(strategy)
    out_dir = distribution.output_dir(config.model_dir, strategy)
    settings = {
        "config": config.as_dict(),
        "model_config": dict(model_config or {}),
        "steps_per_epoch": steps_per_epoch,
        "global_batch_size": global_batch_size,
    }
    run = callbacks_lib.make_callbacks(
        model_dir=config.model_dir,
        output_dir=out_dir,
        global_batch_size=global_batch_size,
        log_steps=config.log_steps,
        settings=settings,
        extra=extra_callbacks,
        backup_steps=config.backup_steps,
        signals=signals,
        num_workers=distribution.num_workers(strategy),
    )
    with strategy.scope():
        restored = run.backup.restore(model)
    run.run_state.resume(restored)
    epoch, batch = run.backup.position
    # A live progress bar for a terminal, one line per epoch in log files.
    verbose = (1 if sys.stdout.isatty() else 2) if chief else 0
    try:
        model.fit(
            train_data(epoch * steps_per_epoch + batch),
            epochs=epochs,
            initial_epoch=epoch,
            steps_per_epoch=steps_per_epoch,
            callbacks=run.callbacks,
            shuffle=False,  # the input pipelines shuffle themselves
            verbose=verbose,
        )
    finally:
        if signals is not None:
            signals.training = False
    throughput = run.throughput
    train_seconds = run.run_state.train_seconds
    loss_scale = None
    optimizer = model.optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        loss_scale = float(optimizer.dynamic_scale.numpy())
        optimizer = optimizer.inner_optimizer
    stats = optimizer.compression_stats()
    model_path, weights_path = backup_lib.save_model(model, out_dir)
    history = run.run_state.history
    train_metrics = _floats(
        {k: v[-1] for k, v in history.items() if v and k != "lr"}
    )
    if derived is not None:
        derived(train_metrics)
    eval_metrics = {}
    eval_writer = tf.summary.create_file_writer(
        os.path.join(out_dir, backup_lib.TENSORBOARD_DIR, "eval")
    )
    for split, (data, steps) in (eval_sets or {}).items():
        results = _floats(
            model.evaluate(data, steps=steps, return_dict=True, verbose=verbose)
        )
        if derived is not None:
            derived(results)
        results["steps"] = steps
        eval_metrics[split] = results
        callbacks_lib.write_scalars(
            eval_writer, results, throughput.step, f"eval/{split}/"
        )
        if chief:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in results.items())
            print(f"{name} {split}: {shown}", flush=True)
    steps_run = throughput.step
    summary = {
        "model": name,
        # Written last: a rerun of a finished run does not train again.
        "finished": True,
        "chief": chief,
        "num_workers": distribution.num_workers(strategy),
        "num_replicas": strategy.num_replicas_in_sync,
        "global_batch_size": global_batch_size,
        "epochs": epochs,
        "steps_per_epoch": steps_per_epoch,
        "train_steps": steps_run,
        # Over every process of the run, resumed ones included.
        "train_seconds": train_seconds,
        "examples_per_second": throughput.steady_examples_per_second(),
        "examples_per_second_overall": (
            steps_run * global_batch_size / train_seconds if steps_run else None
        ),
        "throughput": [
            {"step": s, "examples_per_second": r, "step_time": t}
            for s, r, t in throughput.records
        ],
        # Per worker, before the collective's own ring factor.
        "bytes_per_step": {
            "compressed": stats.get("sent_bytes"),
            "overhead": stats.get("overhead_bytes"),
            # Stayed inside the host (hierarchical communicator).
            "intra_host": stats.get("intra_host_bytes"),
            "dense": stats.get("dense_bytes"),
            "compression_ratio": stats.get("compression_ratio"),
        },
        "train": train_metrics,
        "history": history,
        "eval": eval_metrics,
        "saved_model": os.path.basename(model_path),
        "saved_weights": os.path.basename(weights_path),
        "num_parameters": int(model.count_params()),
        # The dtype policy the model computed in, and the final dynamic
        # loss scale under "mixed_float16" (else None).
        "precision": model.dtype_policy.name,
        "loss_scale": loss_scale,
        "config": config.as_dict(),
        "model_config": dict(model_config or {}),
    }
    rate = summary["examples_per_second"]
    for unit, count in (units_per_example or {}).items():
        summary[f"{unit}_per_second"] = rate * count if rate else None
    eval_writer.close()
    path = os.path.join(out_dir, backup_lib.SUMMARY_FILE)
    backup_lib.write_summary(path, summary)
    if chief:
        shutil.rmtree(run.backup.backup_dir, ignore_errors=True)
        logging.info(
            "Run summary written to %s; the model to %s and %s",
            path,
            model_path,
            weights_path,
        )
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
    return summary
