"""The program every lab worker runs: time each case's training step.

    python -m benchmarks.lab.worker SPEC.json   (TF_CONFIG in the environment)

SPEC names the model (`BATCH`), the cases, the steps and where to write
this worker's results (`result_dir/worker<i>.json`). All cases run in one
process under one MultiWorkerMirroredStrategy (a second strategy in a
process would reuse collective keys; the runner starts another set of
workers for a case that needs other strategy options):
- `dense_fp32`: the plain Keras optimizer, which all-reduces fp32 through
  the strategy (with the spec's `bytes_per_pack`, in packs that start
  during the backward pass: TensorFlow's own overlap);
- `compressed`: `tfgc.CompressedOptimizer` with the case's compressor,
  through the case's communicator ("auto", or "hierarchical":
  `tfgc.communicators.Hierarchical(workers_per_host)`, HiTopKComm);
- `compressed_per_tensor`: the same with one optimizer per variable, so
  one collective per tensor instead of tfgc's fused ones (`PerTensor`);
- `floor`: the same model and step outside the strategy, no collective;
- `local_compressed`: the floor's step through `CompressedOptimizer`,
  which compresses and decompresses without communicating (one worker; a
  compressor that weighs the network's costs per tensor, RedSync, is told
  `cost_model=None` so that it compresses every tensor as it does with
  peers).
A case with `plan_of` runs the plan that the named `auto` case kept,
built fixed (`Auto(choices=...)`, no trials' switch). Each case:
`warmup` steps (under `compressor="auto"` at least until its trials have
chosen), two barriers, the timed steps (each fetched to the host), two
barriers; with `interleave`, every case that communicates is prepared
first and their timed steps take turns, one per case in each round (each
keeps its model in memory until the last; the local cases follow one
after another). A compressor with a communication delay d (SBC)
communicates once per d steps, so its step time is reported as the mean
over the timed steps (whole rounds when `warmup` and `steps` are
multiples of d), not the median, which would be a local step's. With
`netdev`, the host's veth counters are read inside its namespace
between the barriers of each pair.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

import tfgc
from tfgc.compressors import ALL_GATHER, ALL_GATHER_RAGGED, ALL_REDUCE
from tfgc.core.wire import BROADCAST
from tfgc.optimizers import auto_plan, replan

#: Batch per worker of each model.
BATCH = {
    "standin": 8,
    "standin-small": 8,
    # Backward compute comparable to the all-reduce at 1 Gbit/s on one
    # core, so that overlapping them shows.
    "standin-compute": 128,
    "lstm-medium": 20,  # Zaremba medium: 20 x 35 tokens
    "resnet50": 2,  # 224 x 224 images: small enough for 2 cores
}
LEARNING_RATE = 1e-3
PER_TENSOR = "compressed_per_tensor"
COMPRESSED = ("compressed", "local_compressed", PER_TENSOR)
LOCAL = ("floor", "local_compressed")
# The floor's step, synchronised: what any exchange pays before a byte.
BARRIER = "barrier"


def transport_factor(collective: str, workers: int) -> float | None:
    """Bytes a worker sends per byte of its own payload, ring algorithms.

    A ring all-reduce sends 2(n-1)/n of the buffer; a ring all-gather
    sends its own payload and forwards n-2 others: n-1 times its own size
    when all sizes are equal. A broadcast (a tree) delivers the root's
    payload once to each of the n-1 others: (n-1)/n on average over the
    workers. Others: None, not modelled.
    """
    if collective == ALL_REDUCE:
        return 2 * (workers - 1) / workers
    if collective in (ALL_GATHER, ALL_GATHER_RAGGED):
        return float(workers - 1)
    if collective == BROADCAST:
        return (workers - 1) / workers
    return None


def _standin(width: int, layers: int, activation=None) -> keras.Model:
    """A Dense stack; every tensor has >= 1024 elements, so all are
    compressed."""
    inputs = keras.Input((width,))
    x = inputs
    for i in range(layers):
        # Without an activation the values do not matter, only the shapes.
        x = keras.layers.Dense(width, activation, name=f"dense{i}")(x)
    return keras.Model(inputs, x)


def build(name: str, rng: np.random.Generator):
    """(model, inputs, targets, loss) of one worker for model `name`."""
    batch = BATCH[name]
    if name.startswith("standin"):
        # 4 x (2500^2 + 2500) = 25.01 M; small: 2 x (1024^2 + 1024) = 2.1 M;
        # compute: 6 x (2048^2 + 2048) = 25.18 M at batch 128.
        width, layers, activation = {
            "standin": (2500, 4, None),
            "standin-small": (1024, 2, None),
            "standin-compute": (2048, 6, "relu"),
        }[name]
        x = rng.standard_normal((batch, width), "float32")
        y = rng.standard_normal((batch, width), "float32")
        model = _standin(width, layers, activation)
        return model, x, y, keras.losses.MeanSquaredError()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if name == "lstm-medium":
        from models.lstm_lm import model as lstm

        size = lstm.SIZES["medium"]
        shape = (batch, size.num_steps)
        x = rng.integers(0, size.vocab_size, shape, dtype="int32")
        y = rng.integers(0, size.vocab_size, shape, dtype="int32")
        model = lstm.build_model(size, size.vocab_size, size.num_steps)
        return model, x, y, loss
    if name == "resnet50":
        from models.resnet50_imagenet import resnet

        x = rng.standard_normal((batch, 224, 224, 3), "float32")
        y = rng.integers(0, 1000, (batch,), dtype="int32")
        return resnet.resnet((224, 224, 3), 1000), x, y, loss
    raise ValueError(f"Unknown model {name!r}. Use one of {sorted(BATCH)}.")


def after_barrier(grads: list) -> list:
    """`grads`, once every worker has computed its own: a 4-byte all-reduce
    of a value read from each gradient, so that the step waits for the
    slowest worker, as every exchange makes it, and sends nothing else."""
    token = tf.add_n([tf.reshape(g, [-1])[0] for g in grads])
    total = tf.distribute.get_replica_context().all_reduce("sum", token)
    with tf.control_dependencies([total]):
        return [tf.identity(g) for g in grads]


def make_optimizer(case: dict, workers_per_host: int = 1):
    """The case's optimizer; plain SGD (no momentum: RedSync applies its
    own) under tfgc's wrapper for the compressed kinds."""
    sgd = keras.optimizers.SGD(LEARNING_RATE)
    if case["kind"] not in COMPRESSED:
        return sgd
    kwargs = dict(case["kwargs"])
    communicator = case.get("communicator", "auto")
    if case["kind"] == "local_compressed":
        communicator = "auto"  # one worker: nothing to arrange
        if case["compressor"].lower() == "redsync":
            kwargs["cost_model"] = None  # see the module docstring
    elif communicator == "hierarchical":
        communicator = tfgc.communicators.Hierarchical(
            workers_per_host=workers_per_host
        )
    options = {}
    if "bucket_bytes" in case:  # else tfgc's default
        options["bucket_bytes"] = case["bucket_bytes"]
    return tfgc.CompressedOptimizer(
        sgd,
        compressor=tfgc.compressors.get(case["compressor"], **kwargs),
        error_feedback=case["error_feedback"],
        communicator=communicator,
        **options,
    )


class PerTensor:
    """One `CompressedOptimizer` per variable, applied one after another:
    a collective per tensor where one optimizer fuses them all. tfgc has
    no switch that turns its fusion off, so the lab builds this from the
    public API."""

    def __init__(self, case: dict, workers_per_host: int = 1):
        self.case = case
        self.workers_per_host = workers_per_host
        self.parts = []

    def build(self, variables) -> None:
        self.parts = [
            make_optimizer(self.case, self.workers_per_host) for _ in variables
        ]
        for part, variable in zip(self.parts, variables):
            part.build([variable])

    #: What `analytic_bytes` reads: the same in every part.
    _SHARED = (
        "compressor",
        "min_compress_size",
        "communicator",
        "network_cost",
    )

    def __getattr__(self, name):
        if name in self._SHARED and self.parts:
            return getattr(self.parts[0], name)
        raise AttributeError(name)

    def apply(self, grads, variables) -> None:
        for part, grad, variable in zip(self.parts, grads, variables):
            part.apply([grad], [variable])

    def compression_stats(self) -> dict:
        stats = [part.compression_stats() for part in self.parts]
        return {
            key: sum(s[key] for s in stats)
            for key in ("sent_bytes", "overhead_bytes", "dense_bytes")
        }


def _rounds(compressor, shape, dtype) -> list[tuple[float, str]]:
    """(bytes, collective) of each round of a compressed tensor's exchange,
    per worker and step, as the compressor states them."""
    phases = compressor.phases()
    # Phases take turns (ACP-SGD's P and Q steps): their mean per step.
    nbytes = sum(c.payload_bytes(shape, dtype) for c in phases) / len(phases)
    # A communication delay (SBC) sends once per `delay` steps.
    nbytes /= compressor.spec.delay
    collectives = compressor.spec.collectives
    if len(set(collectives)) == 1:
        return [(nbytes, collectives[0])]
    if isinstance(compressor, tfgc.compressors.ImportancePruning):
        # The root's positions (int32, broadcast), then the values.
        positions = compressor.num_selected(shape) * 4
        return [(positions, BROADCAST), (nbytes - positions, ALL_REDUCE)]
    return [(nbytes, None)]  # rounds of several kinds: not modelled


def analytic_bytes(
    case: dict, optimizer, variables, workers: int, workers_per_host: int = 1
) -> dict:
    """Payload bytes per step per worker as tfgc states them, and what a
    host's link should carry: payloads times each collective's transport
    factor.

    With the workers ordered by host, a ring has one edge leaving each
    host, so a host's link carries what one worker of a flat ring sends.
    Under the hierarchical communicator (m hosts of g workers) a
    compressed tensor is split into g shards; each worker exchanges its
    compressed shard with its m - 1 peers of the same local rank, so the
    link carries g shards' exchanges among m; the sums inside a host stay
    on its loopback, and the tensors it sends dense go in one ring
    all-reduce among all workers. A broadcast among all workers of
    several hosts (importance pruning's positions, flat) is a tree whose
    host crossings depend on where each worker sits: not modelled (None).
    """
    if case["kind"] == BARRIER:  # one float32, all-reduced
        return {
            "payload_bytes": 4.0,
            "wire_bytes": 4.0 * transport_factor(ALL_REDUCE, workers),
        }
    compressed = case["kind"] in ("compressed", PER_TENSOR)
    communicator = optimizer.communicator if compressed else None
    hierarchical = (
        communicator is not None and communicator.name == "hierarchical"
    )
    peers = workers // workers_per_host if hierarchical else workers
    flat_across_hosts = workers_per_host > 1 and not hierarchical
    links = workers_per_host if hierarchical else 1
    network = tfgc.compressors.Network(
        peers, optimizer.network_cost if compressed else None
    )
    # A compressor with a delay (SBC) exchanges once per round, the
    # tensors it sends dense too (CompressedOptimizer's rounds).
    delay = optimizer.compressor.spec.delay if compressed else 1
    chosen = _compressors(optimizer, len(variables)) if compressed else None
    payload, wire = 0.0, 0.0
    for i, v in enumerate(variables):
        shape, dtype = tuple(v.shape), tf.as_dtype(v.dtype)
        size = int(np.prod(shape))
        dense = [(size * dtype.size / delay, ALL_REDUCE, workers, 1)]
        rounds = dense
        if compressed:
            compressor = chosen[i]
            part = communicator.compressed_shape(shape)
            if (
                size >= optimizer.min_compress_size
                and not communicator.sends_dense(shape)
                and compressor.should_compress(part, dtype, network)
            ):
                rounds = [
                    (nbytes, collective, peers, links)
                    for nbytes, collective in _rounds(compressor, part, dtype)
                ]
        for nbytes, collective, n, copies in rounds:
            factor = transport_factor(collective, n)
            if collective == BROADCAST and flat_across_hosts:
                factor = None  # a tree over several hosts' workers
            payload += nbytes * copies
            wire = (
                None
                if wire is None or factor is None
                else wire + nbytes * factor * copies
            )
    return {"payload_bytes": payload, "wire_bytes": wire}


def _compressors(optimizer, count: int) -> list:
    """Each variable's compressor: the planner's choice for its bucket
    under `compressor="auto"`, else the optimizer's."""
    plan = getattr(optimizer, "plan", None)
    if plan is None:
        return [optimizer.compressor] * count
    return [
        a.compressor or tfgc.compressors.Identity()
        for a in auto_plan.assignments(plan, count)
    ]


def warmup_steps(spec: dict, optimizer) -> int:
    """The spec's untimed steps, or more under `compressor="auto"` until
    its trials have chosen (the timed steps measure the plan it keeps)."""
    plan = getattr(optimizer, "plan", None)
    if plan is None:
        return spec["warmup"]
    trials = replan.trial_exchanges(optimizer.compressor, plan)
    return max(spec["warmup"], trials)


def plan_record(optimizer) -> dict | None:
    """What `compressor="auto"` planned and how its prediction held:
    the table, the choices by label, the predicted exchange, and
    `plan_report()` (means over the steps so far), for the results."""
    plan = getattr(optimizer, "plan", None)
    if plan is None:
        return None
    found = optimizer.plan_report()
    return {
        "table": plan.table(),
        "choices": [plan.labels[c] for c in plan.choices],
        "predicted_exchange_s": plan.predicted_seconds(),
        "predicted_dense_exchange_s": plan.predicted_dense_seconds(),
        "report": None if found is None else found._asdict(),
    }


def read_counters(netdev: str | None) -> dict | None:
    if not netdev:
        return None
    stats = f"/sys/class/net/{netdev}/statistics"
    out = {}
    for key in ("tx_bytes", "rx_bytes"):
        with open(f"{stats}/{key}") as f:
            out[key] = int(f.read())
    return out


class Prepared(NamedTuple):
    """A case built and warmed up, ready for its timed steps.

    Attributes:
        case: the spec's case.
        optimizer: its optimizer (tfgc's or Keras's).
        variables: the model's trainable variables.
        one_step: runs one training step, returns its seconds.
        local: whether it runs outside the strategy (`LOCAL`).
    """

    case: dict
    optimizer: object
    variables: list
    one_step: Callable[[], float]
    local: bool


def prepare(case: dict, spec: dict, strategy, plans: dict) -> Prepared:
    """Builds the case's model, optimizer and step, and runs its warm-up
    steps. A case with `plan_of` runs the plan that the `auto` case it
    names kept (`plans`: name -> choices of the cases prepared so far),
    fixed; an `auto` case's plan is added to `plans`."""
    if case.get("plan_of"):
        kwargs = dict(case["kwargs"], verbose=False)
        kwargs["choices"] = plans[case["plan_of"]]
        case = dict(case, kwargs=kwargs)
    workers = strategy.num_replicas_in_sync
    rng = np.random.default_rng(1 + int(os.environ.get("TFGC_WORKER_INDEX", 0)))
    local = case["kind"] in LOCAL

    per_host = spec.get("workers_per_host", 1)
    if local:
        model, x, y, loss_fn = build(spec["model"], rng)
        optimizer = make_optimizer(case)
        optimizer.build(model.trainable_variables)
    else:
        with strategy.scope():
            model, x, y, loss_fn = build(spec["model"], rng)
            optimizer = (
                PerTensor(case, per_host)
                if case["kind"] == PER_TENSOR
                else make_optimizer(case, per_host)
            )
            optimizer.build(model.trainable_variables)
    x, y = tf.constant(x), tf.constant(y)
    replicas = 1 if local else workers

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / replicas
        grads = tape.gradient(loss, model.trainable_variables)
        # Dense like tfgc's, so that every case sends the embedding's
        # gradient whole (Keras would all-gather its IndexedSlices).
        grads = [tf.convert_to_tensor(g) for g in grads]
        if case["kind"] in COMPRESSED:
            optimizer.apply(grads, model.trainable_variables)
        elif case["kind"] == BARRIER:
            # Keras's SGD update, but of this worker's own gradients:
            # under the strategy its apply_gradients would sum them.
            for v, g in zip(model.trainable_variables, after_barrier(grads)):
                v.assign_sub(g * LEARNING_RATE)
        else:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if local:
        step = tf.function(replica_step)
    else:
        step = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))

    def one_step():
        t0 = time.perf_counter()
        loss = step(x, y)
        loss = (
            strategy.experimental_local_results(loss)[0] if not local else loss
        )
        loss.numpy()  # wait for the step, collectives included
        return time.perf_counter() - t0

    for _ in range(warmup_steps(spec, optimizer)):
        one_step()
    plan = getattr(optimizer, "plan", None)
    if plan is not None:
        plans[case["name"]] = list(plan.choices)
    return Prepared(case, optimizer, model.trainable_variables, one_step, local)


def timed(prepared: Prepared, steps: int, barrier, netdev) -> tuple:
    """`steps` timed steps of a prepared case: (their seconds, the host's
    veth counters' change over them or None)."""
    # Each host's counters are read between two barriers, so that the
    # host's other workers start no timed step (and send nothing of it)
    # before the first read, nor the next case's steps before the second.
    # Read after one barrier only, a late reader on a loaded machine could
    # miss what the other worker had sent of the first step (a 2-step run
    # under load measured 8 % fewer bytes than the analytic count). After
    # the timed steps' barrier every step's data has arrived, so it has
    # also left this host (a worker may finish its step before its last
    # sends leave the queue); each barrier adds a few hundred bytes.
    barrier()
    before = read_counters(netdev)
    barrier()
    times = [prepared.one_step() for _ in range(steps)]
    barrier()
    after = read_counters(netdev)
    barrier()
    delta = (
        None if before is None else {k: after[k] - before[k] for k in before}
    )
    return times, delta


def interleaved(prepared: list[Prepared], steps: int, barrier, netdev):
    """`timed` for every prepared case in turn, one step each per round,
    `steps` rounds: a slow spell of the machine falls on every case
    alike. Per case (its seconds, its counters' change summed)."""
    out = [([], None) for _ in prepared]
    for _ in range(steps):
        for n, one in enumerate(prepared):
            times, delta = timed(one, 1, barrier, netdev)
            total = out[n][1]
            if delta is not None and total is not None:
                delta = {k: total[k] + delta[k] for k in delta}
            out[n] = (out[n][0] + times, delta)
    return out


def result(prepared: Prepared, spec: dict, workers: int, times, delta):
    """What the runner reads of one case."""
    case, optimizer, local = prepared.case, prepared.optimizer, prepared.local
    compressor = getattr(optimizer, "compressor", None)
    delay = getattr(compressor, "delay", 1)
    return {
        "name": case["name"],
        "kind": case["kind"],
        "step_times_s": times,
        "median_step_s": statistics.median(times),
        "mean_step_s": statistics.mean(times),
        "delay": delay,
        "analytic": None
        if local
        else analytic_bytes(
            case,
            optimizer,
            prepared.variables,
            workers,
            spec.get("workers_per_host", 1),
        ),
        "tfgc_stats": optimizer.compression_stats()
        if case["kind"] in ("compressed", PER_TENSOR)
        else None,
        "counters_delta": delta,
        "plan": None
        if local or case.get("plan_of")
        else plan_record(optimizer),
    }


def _progress(i: int, spec: dict, found: dict) -> None:
    delta = found["counters_delta"]
    wire = ""
    if delta is not None:
        sent = delta["tx_bytes"] / spec["steps"] / 1e6
        wire = f", {sent:.2f} MB/step sent by host 0"
    statistic = "mean" if found["delay"] > 1 else "median"
    print(
        f"[lab] case {i + 1}/{len(spec['cases'])} {found['name']}: "
        f"{statistic} {found[f'{statistic}_step_s'] * 1e3:.1f} "
        "ms/step over "
        f"{spec['steps']} steps{wire}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    # AutoGraph's notes about tfgc's helpers would drown the progress lines.
    tf.get_logger().setLevel("ERROR")
    options = None
    if spec.get("bytes_per_pack"):
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=spec["bytes_per_pack"]
        )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=options
    )
    index = int(os.environ.get("TFGC_WORKER_INDEX", 0))
    workers = strategy.num_replicas_in_sync

    @tf.function
    def _barrier():
        def fn():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("SUM", tf.ones([]))

        return strategy.run(fn)

    def barrier():
        strategy.experimental_local_results(_barrier())[0].numpy()

    netdev, steps = spec.get("netdev"), spec["steps"]
    results, plans = [], {}
    # Interleaved: the cases that communicate (each keeps its model in
    # memory until the last round); the local ones after, one by one.
    together = [
        n
        for n, case in enumerate(spec["cases"])
        if spec.get("interleave") and case["kind"] not in LOCAL
    ]
    if together:
        prepared = []
        for n in together:
            barrier()
            prepared.append(prepare(spec["cases"][n], spec, strategy, plans))
        measured = interleaved(prepared, steps, barrier, netdev)
        for n, one, (times, delta) in zip(together, prepared, measured):
            results.append(result(one, spec, workers, times, delta))
            if index == 0:
                _progress(n, spec, results[-1])
        del prepared, one
        gc.collect()
    for n, case in enumerate(spec["cases"]):
        if n in together:
            continue
        barrier()
        one = prepare(case, spec, strategy, plans)
        times, delta = timed(one, steps, barrier, netdev)
        results.append(result(one, spec, workers, times, delta))
        del one
        gc.collect()  # the case's model and optimizer, before the next
        if index == 0:
            _progress(n, spec, results[-1])
    out = os.path.join(spec["result_dir"], f"worker{index}.json")
    with open(out, "w") as f:
        json.dump(
            {
                "worker": index,
                "workers": workers,
                "custom_ops": tfgc.ops.using_custom_ops(),
                "cases": results,
            },
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
