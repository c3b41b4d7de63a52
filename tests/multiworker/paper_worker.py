"""Runs inside every worker of tests/multiworker/test_paper_algorithms.py.

Started by `tfgc.launch.run` (TF_CONFIG set, `hosts=` hosts on loopback
addresses). Every scenario trains a few variables with
`CompressedOptimizer(SGD)` on gradients fed directly: heavy-tailed float32
data that differs per worker, step and variable. It records, per step,
the gradients it fed, the summed update the inner optimizer received, the
variables and the optimizer's state variables after the step and
`compression_stats()`. Everything goes to `<out>/worker<i>.npz` under
"<scenario>/..." keys; the test replays the gradients through
tests/numpy_reference.py.

Every `tfgc.communicators.collectives.Group` collective is recorded when
it is called (at trace time): the group's members, the buffer's static
byte size and dtype (see `record_collectives`). What SBC, ImportancePruning
and ACP-SGD compute inside a step (positions, values, coded bytes, the
root, the local factors) is written to probe variables while the step runs
and saved after it (see `record_compressors`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import threading
import time

import keras
import numpy as np
import tensorflow as tf

import tfgc
from tests.multiworker.test_paper_algorithms import (
    ACP_BUCKET_BYTES,
    ACP_RANK,
    DENSITY,
    HIER_DENSE_THRESHOLD,
    LR,
    MIN_COMPRESS_SIZE,
    MOMENTUM,
    MSTOPK_ROUNDS,
    POWERSGD_RANK,
    SBC_RUNS,
    SBC_ZEROS,
    SEED,
    SHAPES,
    STEPS,
)
from tfgc.communicators import collectives, probe
from tfgc.communicators import topology as topology_lib
from tfgc.compressors import (
    ACPSGD,
    BF16,
    FP16,
    SBC,
    Identity,
    ImportancePruning,
    MSTopK,
    Network,
    PowerSGD,
    RandomK,
    RedSync,
    SignSGD,
    TopK,
    importance,
)
from tfgc.optimizers import fused_apply

# --- recording the collectives -----------------------------------------------

COLLECTIVE_LOG: list[dict] = []
_nesting = threading.local()


def record_collectives() -> None:
    """Wraps Group.all_reduce, .all_gather and .all_gather_unequal so that
    every call (not the all_gather inside all_gather_unequal) is logged."""

    def wrap(name):
        original = getattr(collectives.Group, name)

        def recorded(self, buffer):
            depth = getattr(_nesting, "depth", 0)
            if depth == 0:
                shape = buffer.shape
                COLLECTIVE_LOG.append(
                    {
                        "op": name,
                        "members": list(self.members),
                        "bytes": shape.num_elements() * buffer.dtype.size
                        if shape.is_fully_defined()
                        else None,
                        "dtype": buffer.dtype.name,
                    }
                )
            _nesting.depth = depth + 1
            try:
                return original(self, buffer)
            finally:
                _nesting.depth = depth

        setattr(collectives.Group, name, recorded)

    for name in ("all_reduce", "all_gather", "all_gather_unequal"):
        wrap(name)


# --- probes: what a compressor computed inside a step ------------------------

#: name -> (variable, its initial value); written by the patched compressor
#: methods while a step runs (when the name is there), read after the step.
PROBES: dict[str, tuple[tf.Variable, np.ndarray]] = {}


def set_probes(specs) -> None:
    """New probe variables, {name: (size, dtype, fill)}, outside any
    strategy scope: plain local variables of this worker."""
    PROBES.clear()
    for name, (size, dtype, fill) in specs.items():
        value = np.full([size], fill, dtype)
        PROBES[name] = (tf.Variable(value, trainable=False), value)


def reset_probes() -> None:
    for variable, value in PROBES.values():
        variable.assign(value)


def write_probe(name: str, tensor) -> None:
    """Writes the flattened tensor at the start of probe `name`."""
    if name not in PROBES:
        return
    variable, value = PROBES[name]
    flat = tf.cast(tf.reshape(tensor, [-1]), variable.dtype)
    pad = tf.fill([value.size - tf.size(flat)], tf.constant(value[0]))
    variable.assign(tf.concat([flat, pad], 0))


def var_index(shape) -> int:
    return SHAPES.index(tuple(shape))


def record_compressors() -> None:
    """Wraps SBC.compress, ImportancePruning.compress / next_round, the
    root draw and ACPSGD.compress so that they write probes."""
    sbc_compress = SBC.compress

    def sbc_recorded(self, x, state, key):
        payload, ctx = sbc_compress(self, x, state, key)
        i = var_index(x.shape)
        write_probe(f"sbc/{i}/indices", ctx.indices)
        write_probe(f"sbc/{i}/values", ctx.values)
        write_probe(f"sbc/{i}/count", payload.count)
        write_probe(f"sbc/{i}/payload_values", payload.values)
        write_probe(f"sbc/{i}/positions", payload.positions)
        write_probe(f"sbc/{i}/num_bytes", tf.size(payload.positions))
        return payload, ctx

    SBC.compress = sbc_recorded

    root_worker = importance.root_worker

    def root_recorded(step, num_peers):
        root = root_worker(step, num_peers)
        write_probe("importance/root", root)
        return root

    importance.root_worker = root_recorded

    def importance_sent(x, payload):
        i = var_index(x.shape)
        write_probe(f"importance/{i}/sent", payload.indices)
        write_probe(f"importance/{i}/payload_root", payload.root[None])

    importance_compress = ImportancePruning.compress

    def importance_recorded(self, x, state, key, info=None):
        payload, ctx = importance_compress(self, x, state, key, info)
        importance_sent(x, payload)
        return payload, ctx

    ImportancePruning.compress = importance_recorded

    # Under error feedback the fused path compresses instead.
    importance_fused = ImportancePruning.compress_with_residual

    def importance_fused_recorded(self, x, residual, state, key, info=None):
        fused = importance_fused(self, x, residual, state, key, info)
        if fused is not None:
            importance_sent(x, fused[0])
        return fused

    ImportancePruning.compress_with_residual = importance_fused_recorded

    importance_next = ImportancePruning.next_round

    def importance_next_recorded(self, reduced, ctx):
        write_probe(
            f"importance/{var_index(ctx.shape)}/agreed", reduced.indices
        )
        return importance_next(self, reduced, ctx)

    ImportancePruning.next_round = importance_next_recorded

    acp_compress = ACPSGD.compress

    def acp_recorded(self, x, state, key):
        payload, ctx = acp_compress(self, x, state, key)
        i = var_index(x.shape)
        write_probe(f"acp/{i}/{self.factor}", payload.factor)
        write_probe(f"acp/{i}/fixed_{self.factor}", ctx.fixed)
        return payload, ctx

    ACPSGD.compress = acp_recorded


# --- data --------------------------------------------------------------------


def initial_weights() -> list[np.ndarray]:
    rng = np.random.default_rng(1234)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def gradient(data_seed: int, task: int, step: int, index: int) -> np.ndarray:
    """Heavy-tailed (Student-t, 3 degrees of freedom) float32, no
    subnormals; different for every worker, step and variable."""
    rng = np.random.default_rng([data_seed, task, step, index])
    x = rng.standard_t(3, size=SHAPES[index]).astype(np.float32)
    tiny = np.float32(2.0**-20)
    return np.where(np.abs(x) < tiny, np.copysign(tiny, x), x)


def cost_fields(cost) -> np.ndarray:
    return np.array([getattr(cost, f.name) for f in dataclasses.fields(cost)])


def compressor_name(plan) -> str:
    """Type name of the compressor a variable's gradient goes through after
    the warm-up (its only phase for MSTopK and RedSync; "+"-joined phases:
    ACP-SGD's P and Q steps)."""
    return "+".join(type(c).__name__ for c in plan.phases)


# --- one training run --------------------------------------------------------

# What the fused update (tfgc.optimizers.fused_apply) applied last.
_FUSED_APPLIED: list = []
_fused_apply = fused_apply.apply


def _record_fused(optimizer, rule, grads, trainable_variables, buckets):
    _FUSED_APPLIED[:] = list(grads)
    return _fused_apply(optimizer, rule, grads, trainable_variables, buckets)


fused_apply.apply = _record_fused


def train(
    strategy,
    task,
    results,
    name,
    make_optimizer,
    data_seed,
    steps=STEPS,
    zeros=(),
):
    """`steps` steps of `make_optimizer()` on SHAPES; records under `name/`.

    `zeros`: (task, step, var) whose gradient is all zeros.
    """
    with strategy.scope():
        variables = [
            keras.Variable(w, name=f"{name}_v{i}")
            for i, w in enumerate(initial_weights())
        ]
        opt = make_optimizer()
        opt.build(variables)

    # The gradients the inner optimizer applies (summed, or SBC's local),
    # by Keras's update or by the fused one (`_record_fused`).
    summed = _FUSED_APPLIED
    inner_apply = opt.inner_optimizer.apply

    def apply_and_record(grads, trainable_variables=None):
        summed[:] = list(grads)
        return inner_apply(grads, trainable_variables)

    opt.inner_optimizer.apply = apply_and_record

    # Without autograph: tfgc uses explicit tf.cond / tf.switch_case, and
    # converting the library's code took most of each scenario's time
    # (model.fit's autograph path is tested in tests/multiworker/).
    @tf.function(autograph=False)
    def step(grads):
        def replica_fn(grads):
            opt.apply(list(grads), variables)
            return list(summed)

        out = strategy.run(replica_fn, args=(grads,))
        return [strategy.experimental_local_results(t)[0] for t in out]

    log_start = len(COLLECTIVE_LOG)
    results[f"{name}/plans"] = np.array(
        [compressor_name(plan) for plan in opt._plans]
    )
    for i, w in enumerate(initial_weights()):
        results[f"{name}/initial/{i}"] = w
        for j, v in enumerate(opt._plans[i].state_variables):
            results[f"{name}/initial_state/{i}/{j}"] = v.numpy()
    for s in range(steps):
        grads = [gradient(data_seed, task, s, i) for i in range(len(SHAPES))]
        grads = [
            np.zeros_like(g) if (task, s, i) in zeros else g
            for i, g in enumerate(grads)
        ]
        reset_probes()
        totals = step([tf.constant(g) for g in grads])
        for i, g in enumerate(grads):
            results[f"{name}/grads/{s}/{i}"] = g
            results[f"{name}/totals/{s}/{i}"] = totals[i].numpy()
            results[f"{name}/weights/{s}/{i}"] = variables[i].numpy()
            for j, v in enumerate(opt._plans[i].state_variables):
                results[f"{name}/state/{s}/{i}/{j}"] = v.numpy()
            results[f"{name}/num_states/{i}"] = np.array(
                len(opt._plans[i].state_variables)
            )
            if opt._plans[i].round_start is not None:
                results[f"{name}/round_start/{s}/{i}"] = opt._plans[
                    i
                ].round_start.numpy()
        for key, (variable, _) in PROBES.items():
            results[f"{name}/probe/{s}/{key}"] = variable.numpy()
        stats = opt.compression_stats()
        results[f"{name}/stats/{s}"] = np.array(
            [
                stats["sent_bytes"],
                stats["overhead_bytes"],
                stats["intra_host_bytes"],
                stats["dense_bytes"],
            ]
        )
    PROBES.clear()
    results[f"{name}/tracing_count"] = np.array(
        step.experimental_get_tracing_count()
    )
    results[f"{name}/collectives"] = np.array(
        json.dumps(COLLECTIVE_LOG[log_start:])
    )
    results[f"{name}/config"] = np.array(
        json.dumps({"data_seed": data_seed, "steps": steps, "lr": LR})
    )


def optimizer(compressor, **kwargs):
    def make():
        return tfgc.CompressedOptimizer(
            keras.optimizers.SGD(LR),
            compressor=compressor(),
            min_compress_size=MIN_COMPRESS_SIZE,
            seed=SEED,
            **kwargs,
        )

    return make


# --- scenarios ---------------------------------------------------------------


def mstopk_flat(strategy, task, results):
    train(
        strategy,
        task,
        results,
        "mstopk",
        optimizer(lambda: MSTopK(DENSITY, rounds=MSTOPK_ROUNDS)),
        data_seed=1,
    )


def redsync_flat(strategy, task, results):
    for selection, data_seed in (("threshold", 2), ("trimmed", 3)):
        train(
            strategy,
            task,
            results,
            f"redsync_{selection}",
            optimizer(
                lambda selection=selection: RedSync(
                    DENSITY,
                    momentum=MOMENTUM,
                    selection=selection,
                    rounds=20,
                    cost_model=None,
                )
            ),
            data_seed=data_seed,
        )


def redsync_warmup(strategy, task, results):
    train(
        strategy,
        task,
        results,
        "redsync_warmup",
        optimizer(
            lambda: RedSync(
                DENSITY,
                momentum=MOMENTUM,
                selection="threshold",
                warmup_steps=2,
                cost_model=None,
            )
        ),
        data_seed=4,
    )


def _hierarchical(strategy, task, results, name, communicator):
    """MSTopK + error feedback under HiTopKComm; the same data as the flat
    "mstopk" scenario."""
    train(
        strategy,
        task,
        results,
        name,
        optimizer(
            lambda: MSTopK(DENSITY, rounds=MSTOPK_ROUNDS),
            communicator=communicator,
        ),
        data_seed=1,
    )


def hierarchical_from_cluster_spec(strategy, task, results):
    """Hosts read from TF_CONFIG (hosts=2: 2 hosts of 2 workers)."""
    communicator = tfgc.communicators.Hierarchical(
        dense_threshold=HIER_DENSE_THRESHOLD
    )
    _hierarchical(strategy, task, results, "hier", communicator)


def hierarchical_one_per_host(strategy, task, results):
    """workers_per_host=1 (one worker per host, as the cluster spec says),
    with the flat run's dense threshold: must equal flat MSTopK."""
    communicator = tfgc.communicators.Hierarchical(
        workers_per_host=1, dense_threshold=MIN_COMPRESS_SIZE
    )
    _hierarchical(strategy, task, results, "hier_g1", communicator)


def cost_model_agreement(strategy, task, results):
    """Per-worker measurements skewed on purpose; agreed decisions."""
    p = strategy.num_replicas_in_sync
    local = probe.measure_local(strategy, repeats=3)
    # Density 0.3: past some size n* the sparse exchange costs more than
    # the dense one (more bytes per element, plus selection), and n* grows
    # with the latency. A factor of 100 between workers outweighs how much
    # their own measurements differ, so their n* fall between different
    # powers of two. (A latency of 0, a noisy fit, would give n* = 0.)
    factor = 100.0**task
    skewed = dataclasses.replace(
        local, latency=max(local.latency, 1e-6) * factor
    )
    agreed = probe.agree(skewed, strategy)
    redsync = RedSync(density=0.3, cost_model="probe")
    shapes = [(2**j,) for j in range(48)] + [(300, 70), (1000, 1000)]
    results["cost/shapes"] = np.array([int(np.prod(s)) for s in shapes])
    results["cost/local"] = cost_fields(local)
    results["cost/skewed"] = cost_fields(skewed)
    results["cost/agreed"] = cost_fields(agreed)
    results["cost/local_decisions"] = np.array(
        [
            redsync.should_compress(s, "float32", Network(p, skewed))
            for s in shapes
        ]
    )
    results["cost/agreed_decisions"] = np.array(
        [
            redsync.should_compress(s, "float32", Network(p, agreed))
            for s in shapes
        ]
    )

    # The optimizer's own start-up probe, then one step.
    sizes = [2**j for j in range(8, 21, 2)]
    with strategy.scope():
        variables = [
            keras.Variable(np.zeros(n, np.float32), name=f"probe_v{n}")
            for n in sizes
        ]
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(LR),
            compressor=RedSync(density=0.3, cost_model="probe"),
            min_compress_size=0,
        )
        opt.build(variables)
    results["cost/optimizer_sizes"] = np.array(sizes)
    results["cost/optimizer_plans"] = np.array(
        [compressor_name(plan) for plan in opt._plans]
    )
    results["cost/optimizer_cost"] = cost_fields(opt.network_cost)
    results["cost/optimizer_replanned"] = np.array(
        [
            redsync.should_compress(
                (n,), "float32", Network(p, opt.network_cost)
            )
            for n in sizes
        ]
    )

    @tf.function(autograph=False)
    def step(grads):
        strategy.run(lambda g: opt.apply(list(g), variables), args=(grads,))

    rng = np.random.default_rng([5, task])
    step([tf.constant(rng.standard_t(3, n).astype(np.float32)) for n in sizes])
    results["cost/optimizer_weights"] = np.concatenate(
        [v.numpy() for v in variables]
    )


def bad_setups(strategy, task, results):
    """Hierarchical layouts that do not fit: a ValueError on every worker,
    before any collective."""
    layouts = {"g3": 3, "g4": 4}
    for name, workers_per_host in layouts.items():
        before = len(COLLECTIVE_LOG)
        message = ""
        with strategy.scope():
            v = keras.Variable(np.zeros((64, 64), np.float32), name=name)
            opt = tfgc.CompressedOptimizer(
                keras.optimizers.SGD(LR),
                compressor=MSTopK(0.01),
                communicator=tfgc.communicators.Hierarchical(
                    workers_per_host=workers_per_host
                ),
            )
            variables_before = len(opt.variables)
            try:
                opt.build([v])
            except ValueError as err:
                message = str(err)
            new_variables = len(opt.variables) - variables_before
        results[f"bad/{name}/error"] = np.array(message)
        results[f"bad/{name}/collectives"] = np.array(
            len(COLLECTIVE_LOG) - before
        )
        results[f"bad/{name}/new_variables"] = np.array(new_variables)
        results[f"bad/{name}/built"] = np.array(bool(opt.built))


# --- SBC, importance-weighted pruning, ACP-SGD -------------------------------


def sbc_runs(strategy, task, results):
    for name, (kwargs, steps, data_seed) in SBC_RUNS.items():
        specs = {}
        for i in (0, 1, 3):  # the compressed tensors
            n = int(np.prod(SHAPES[i]))
            specs.update(
                {
                    f"sbc/{i}/indices": (n, np.int32, -1),
                    f"sbc/{i}/values": (n, np.float32, np.nan),
                    f"sbc/{i}/payload_values": (n, np.float32, np.nan),
                    f"sbc/{i}/count": (1, np.int32, -1),
                    f"sbc/{i}/positions": (n, np.uint8, 0),
                    f"sbc/{i}/num_bytes": (1, np.int32, -1),
                }
            )
        set_probes(specs)
        train(
            strategy,
            task,
            results,
            name,
            optimizer(lambda kwargs=kwargs: SBC(**kwargs)),
            data_seed=data_seed,
            steps=steps,
            zeros=SBC_ZEROS if name == "sbc" else (),
        )


def importance_run(strategy, task, results):
    specs = {"importance/root": (1, np.int32, -1)}
    for i in (0, 1, 3):
        k = int(np.ceil(DENSITY * np.prod(SHAPES[i])))
        specs[f"importance/{i}/sent"] = (k, np.int32, -1)
        specs[f"importance/{i}/agreed"] = (k, np.int32, -1)
        specs[f"importance/{i}/payload_root"] = (1, np.int32, -1)
    set_probes(specs)
    train(
        strategy,
        task,
        results,
        "importance",
        optimizer(lambda: ImportancePruning(DENSITY)),
        data_seed=8,
    )


def acpsgd_run(strategy, task, results):
    """Rank 3, one warm-up step, then P, Q, P, Q; buckets of 8000 bytes:
    [(33, 17), (7,)], [(3001,)], [(41, 50)]."""
    specs = {}
    for i in (0, 3):
        rows, cols = int(np.prod(SHAPES[i][:-1])), SHAPES[i][-1]
        for factor, side in (("p", rows), ("q", cols)):
            specs[f"acp/{i}/{factor}"] = (side * ACP_RANK, np.float32, np.nan)
            specs[f"acp/{i}/fixed_{factor}"] = (
                (cols if factor == "p" else rows) * ACP_RANK,
                np.float32,
                np.nan,
            )
    set_probes(specs)
    train(
        strategy,
        task,
        results,
        "acpsgd",
        optimizer(
            lambda: ACPSGD(
                rank=ACP_RANK, warmup_steps=1, bucket_bytes=ACP_BUCKET_BYTES
            )
        ),
        data_seed=9,
    )


# --- The basic compressors --------------------------------------------------

BASIC_RUNS = {
    # name: (compressor, data seed)
    "identity": (Identity, 10),
    "fp16": (FP16, 11),
    "bf16": (BF16, 12),
    "topk": (lambda: TopK(DENSITY), 13),
    "randomk": (lambda: RandomK(DENSITY), 14),
    "signsgd": (lambda: SignSGD(scaled=True), 15),
    "signsgd_vote": (lambda: SignSGD(scaled=False), 17),
    "powersgd": (lambda: PowerSGD(rank=POWERSGD_RANK), 16),
}
BASIC_STEPS = 4


def basic_runs(strategy, task, results):
    for name, (make, data_seed) in BASIC_RUNS.items():
        train(
            strategy,
            task,
            results,
            name,
            optimizer(make),
            data_seed=data_seed,
            steps=BASIC_STEPS,
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    record_collectives()
    record_compressors()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id
    p = strategy.num_replicas_in_sync
    topology = topology_lib.current(strategy)
    results = {
        "num_workers": np.array(p),
        "hosts": np.array(topology.hosts),
        "task": np.array(task),
        "ladder": np.array(collectives.LADDER),
    }

    scenarios = [mstopk_flat, redsync_flat, redsync_warmup]
    scenarios += [sbc_runs, importance_run, acpsgd_run, basic_runs]
    if topology.num_hosts == p:  # one worker per host
        scenarios.append(hierarchical_one_per_host)
    else:
        scenarios.append(hierarchical_from_cluster_spec)
    scenarios.append(cost_model_agreement)
    if p == 4:
        scenarios.append(bad_setups)
    for scenario in scenarios:
        start = time.perf_counter()
        scenario(strategy, task, results)
        seconds = time.perf_counter() - start
        print(f"worker {task}: {scenario.__name__} took {seconds:.1f} s")

    np.savez(os.path.join(args.out, f"worker{task}.npz"), **results)
    print(f"worker {task} done: {len(results)} arrays")


if __name__ == "__main__":
    main()
