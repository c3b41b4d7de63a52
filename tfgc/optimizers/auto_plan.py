"""The planner behind `tfgc.compressors.Auto`: a codec per exchange bucket,
chosen from measurements of this cluster, the same on every worker.

When the optimizer is built, the gradients are cut into planning units as
the exchange cuts them (`bucket_bytes` of gradients, from the last variable
backwards).
The planner then measures this cluster's all-reduce and all-gather
(`probe.collective_costs`) and each candidate's compute on this device
(`codec_timing`: compress, local decompress and error feedback, on two
synthetic workloads of heavy-tailed values), averages every number over the
workers, predicts each unit's exchange time under every candidate
(`tfgc.core.bucket_costs`) and gives the unit the fastest, unless
that one compresses and is within `Auto.min_speedup` of the fastest
dense one; or, where that takes fewer predicted seconds in all, the
codec which sizes its own buckets (ACP-SGD, by what it sends) that its
neighbours share (`choose_joined`). Neighbouring units that chose such a
codec are then joined as that codec joins them on its own (`join`): the
exchange buckets. Every worker computes the same choices from the same
numbers.

See docs/algorithms.md, "The planner".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from tfgc import compressors as compressors_lib
from tfgc.communicators import exchange, probe
from tfgc.communicators import topology as topology_lib
from tfgc.compressors import switchable
from tfgc.core import bucket_costs
from tfgc.core.bucket_costs import CodecCosts, CollectiveCosts, TensorLoad
from tfgc.core.compressor import Compressor, Network
from tfgc.core.wire import ALL_REDUCE, num_elements
from tfgc.optimizers import codec_timing, planning

#: The most plans tried in the first steps (`contenders`): one per
#: default candidate. Plans that differ from the predicted best in one
#: small bucket are predicted close and would crowd out the other
#: candidates' plans under a lower cap (ResNet-50 at 1 Gbit/s).
MAX_CONTENDERS = 6


class BucketChoice(NamedTuple):
    """One bucket of the plan.

    Attributes:
        variables: indices of its variables in the optimizer's list, in
            exchange order (last first).
        elements: its gradients' elements.
        nbytes: its gradients' bytes.
        seconds: per candidate, its predicted exchange seconds (empty
            where the choices were given, not measured).
        dense_seconds: its predicted exchange seconds in dense fp32 (None
            where nothing was measured).
        choice: the index of its candidate.
        compute: per candidate, the part of `seconds` its codec computes
            on the device (the rest is its collectives); empty where not
            measured.
        units: the planning units it joins (`join`), in exchange order.
    """

    variables: tuple[int, ...]
    elements: int
    nbytes: int
    seconds: tuple[float, ...]
    dense_seconds: float | None
    choice: int
    compute: tuple[float, ...] = ()
    units: int = 1


class AutoPlan(NamedTuple):
    """The codec of every bucket, and why (`table()`).

    Attributes:
        candidates: the candidates, as `Auto` holds them.
        buckets: one `BucketChoice` per bucket, in exchange order.
        num_peers: the workers that exchange the gradients.
        collectives: the measured collective costs (None: not measured).
        codecs: per candidate, its measured compute (empty: not measured).
        reason: how the choices were made, in words.
        contenders: the plans (choices per bucket) to try in the first
            steps, the predicted best first (`contenders`); empty: none.
    """

    candidates: tuple[Compressor, ...]
    buckets: tuple[BucketChoice, ...]
    num_peers: int
    collectives: CollectiveCosts | None
    codecs: tuple[CodecCosts, ...]
    reason: str
    contenders: tuple[tuple[int, ...], ...] = ()

    @property
    def choices(self) -> tuple[int, ...]:
        """Per planning unit (the function `buckets`: `bucket_bytes` of
        gradients each), the index of its candidate: `Auto(choices=...)`
        keeps this plan in another run."""
        return tuple(b.choice for b in self.buckets for _ in range(b.units))

    @property
    def bucket_choices(self) -> tuple[int, ...]:
        """Per exchange bucket, the index of its candidate."""
        return tuple(b.choice for b in self.buckets)

    @property
    def labels(self) -> tuple[str, ...]:
        return labels(self.candidates)

    def predicted_seconds(self) -> float | None:
        """Predicted exchange seconds per step of the chosen codecs, the
        buckets one after another (None: not measured)."""
        if self.collectives is None:
            return None
        return sum(b.seconds[b.choice] for b in self.buckets)

    def predicted_dense_seconds(self) -> float | None:
        """The same in dense fp32 (None: not measured)."""
        if self.collectives is None:
            return None
        return sum(b.dense_seconds for b in self.buckets)

    def table(self) -> str:
        """The plan as a Markdown table, with its totals."""
        names = self.labels
        measured = self.collectives is not None
        head = ["bucket", "units", "tensors", "elements", "MiB"]
        if measured:
            head += [f"{n} ms" for n in names] + ["dense fp32 ms"]
        head.append("choice")
        # Under the hierarchical communicator the payloads travel among
        # the hosts (its host routes measured).
        among = (
            "hosts (hierarchical)"
            if measured and self.collectives.host_reduce is not None
            else "workers"
        )
        rows = [
            f"tfgc Auto plan, {self.num_peers} {among}, "
            f"{len(self.buckets)} buckets: {self.reason}.",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for number, b in enumerate(self.buckets):
            cells = [
                str(number),
                str(b.units),
                str(len(b.variables)),
                f"{b.elements:,}",
                f"{b.nbytes / 2**20:.2f}",
            ]
            if measured:
                cells += [f"{1e3 * s:.2f}" for s in b.seconds]
                cells.append(f"{1e3 * b.dense_seconds:.2f}")
            cells.append(names[b.choice])
            rows.append("| " + " | ".join(cells) + " |")
        if len(self.contenders) > 1:
            tried = "; ".join(
                ", ".join(names[c] for c in sorted(set(plan)))
                for plan in self.contenders
            )
            rows += [
                "",
                f"Tried step by step in turn before settling (the shortest "
                f"median step period wins), {len(self.contenders)} plans: "
                f"{tried}.",
            ]
        if measured:
            chosen = self.predicted_seconds()
            dense = self.predicted_dense_seconds()
            speedup = dense / chosen if chosen > 0 else float("inf")
            rows += [
                "",
                f"Predicted exchange per step, buckets one after another: "
                f"{1e3 * chosen:.2f} ms; dense fp32 {1e3 * dense:.2f} ms "
                f"({speedup:.2f}x).",
            ]
        return "\n".join(rows)


def labels(candidates: Sequence[Compressor]) -> tuple[str, ...]:
    """A short name per candidate: its class, or its repr where two
    candidates share a class."""
    kinds = [type(c).__name__ for c in candidates]
    return tuple(
        kind if kinds.count(kind) == 1 else repr(c)
        for kind, c in zip(kinds, candidates)
    )


def check_arguments(auto, communicator, error_feedback: bool) -> None:
    """Refuses a communicator the planner cannot predict, one that cannot
    carry a candidate's payloads, and re-planning without error feedback
    (its codecs share one residual per variable); before anything is
    measured."""
    if auto.replan_every is not None and not error_feedback:
        raise ValueError(
            "Auto(replan_every=...) keeps one error-feedback residual per "
            "variable, which carries what one codec left unsent over to "
            "the next, and error_feedback=False asks for none. Drop "
            "error_feedback=False, or replan_every."
        )
    for candidate in auto.candidates:
        for collective in candidate.spec.collectives:
            if not communicator.supports(collective):
                raise ValueError(
                    f"Auto's candidate {candidate!r} sends a payload that "
                    f"needs {collective!r}, which communicator "
                    f"{communicator.name!r} cannot carry. Leave it out of "
                    "`candidates` or use communicator='auto'."
                )


def buckets(var_list, bucket_bytes: int | None) -> list[list[int]]:
    """The planning units: the exchange's buckets of the variables whose
    gradients travel, as indices into `var_list` (`exchange.buckets` by
    gradient bytes)."""
    travel = [
        i
        for i, v in enumerate(var_list)
        if not planning.overwrites_with_gradient(v)
    ]
    specs = [
        tf.TensorSpec(tuple(var_list[i].shape), var_list[i].dtype)
        for i in travel
    ]
    identity = [compressors_lib.Identity()] * len(specs)
    groups = exchange.buckets(identity, specs, bucket_bytes)
    return [[travel[j] for j in group] for group in groups]


def _loads(settings, candidate, variables, communicator, num_peers):
    """Per phase of `candidate`, a `TensorLoad` per variable."""
    chosen = settings._replace(compressor=candidate)
    net = Network(num_peers, None)
    per_variable = []
    for variable in variables:
        shape = tuple(variable.shape)
        part = communicator.compressed_shape(shape)
        phases, _ = planning.compressors_for(chosen, variable, part, net)
        per_variable.append((phases, shape, part, variable.dtype))
    count = max(len(p) for p, _, _, _ in per_variable)
    out = []
    for j in range(count):
        loads = []
        for phases, shape, part, dtype in per_variable:
            phase = phases[j % len(phases)]
            compressed = not isinstance(phase, compressors_lib.Identity)
            loads.append(
                TensorLoad(
                    communicator.route(shape, phase.spec.collectives[0]),
                    phase.spec.rounds,
                    int(phase.payload_bytes(part, dtype)),
                    num_elements(part) if compressed else 0,
                )
            )
            loads += communicator.host_loads(shape, dtype)
        out.append(loads)
    return out


def _dense_loads(variables, communicator) -> list[list[TensorLoad]]:
    """Dense fp32 through `communicator`: each gradient (or its shard)
    all-reduced, and what the communicator adds inside the host."""
    loads = []
    for v in variables:
        shape = tuple(v.shape)
        part = communicator.compressed_shape(shape)
        nbytes = num_elements(part) * tf.as_dtype(v.dtype).size
        route = communicator.route(shape, ALL_REDUCE)
        loads.append(TensorLoad(route, 1, nbytes, 0))
        loads += communicator.host_loads(shape, v.dtype)
    return [loads]


def make(settings, var_list, communicator, bucket_bytes) -> AutoPlan:
    """The plan for `var_list` (call where the optimizer is built: in a
    cross-replica context, outside `tf.function`, on every worker)."""
    auto = settings.compressor
    units = buckets(var_list, bucket_bytes)
    peers = communicator.num_peers

    def unmeasured(choices, reason):
        joined = join(settings, var_list, units, choices, communicator)
        chosen = tuple(
            _bucket(var_list, g, (), None, c, units=n) for g, c, n in joined
        )
        return AutoPlan(auto.candidates, chosen, peers, None, (), reason)

    if auto.choices is not None:
        if len(auto.choices) != len(units):
            raise ValueError(
                f"Auto(choices=...) names {len(auto.choices)} buckets and "
                f"this model's gradients make {len(units)} (bucket_bytes="
                f"{bucket_bytes}). Pass the plan made for this model and "
                "bucket_bytes, or choices=None to plan again."
            )
        return unmeasured(auto.choices, "given")
    if peers == 1:
        fixed = [_fallback(auto.candidates)] * len(units)
        return unmeasured(fixed, "one worker, nothing to exchange")
    if len(auto.candidates) == 1:
        return unmeasured([0] * len(units), "one candidate")
    _refuse_in_function()
    strategy = tf.distribute.get_strategy()
    options = communicator.options
    collectives = probe.collective_costs(
        strategy, codec_timing.REPEATS, options, communicator
    )
    topology = topology_lib.current(strategy)
    local = [
        codec_timing.measure_codec(settings, c, communicator, topology)
        for c in auto.candidates
    ]
    agreed = probe.agree_values(
        [x for codec in local for x in codec], strategy, options
    )
    codecs = tuple(
        CodecCosts(*agreed[2 * i : 2 * i + 2])
        for i in range(len(auto.candidates))
    )
    per_unit = choose(
        settings, var_list, units, communicator, collectives, codecs
    )
    choices = choose_joined(
        settings, var_list, units, communicator, collectives, codecs, per_unit
    )
    joined = join(settings, var_list, units, choices, communicator)
    # A unit left alone keeps its prices; joined units are priced again.
    alone = {b.variables: b for b in per_unit}
    chosen = []
    for g, c, n in joined:
        if n == 1:
            chosen.append(alone[tuple(g)]._replace(choice=c))
            continue
        seconds, dense, compute = price(
            settings, var_list, g, communicator, collectives, codecs
        )
        chosen.append(_bucket(var_list, g, seconds, dense, c, compute, n))
    chosen = tuple(chosen)
    return AutoPlan(
        auto.candidates,
        chosen,
        peers,
        collectives,
        codecs,
        "measured on this cluster, the fastest predicted per bucket",
        contenders(auto, chosen) if auto.trial_steps else (),
    )


def choose_joined(
    settings, var_list, units, communicator, collectives, codecs, per_unit
) -> list[int]:
    """Per planning unit, its candidate, counting what a join saves.

    A unit alone takes its own choice (`per_unit`, from `choose`). Units
    side by side may instead share a codec that sizes its own buckets
    (ACP-SGD), priced as the one bucket `join` makes of them: one
    collective per round for all of them, so fewer fixed costs, which on
    many workers or a slow collective can outweigh a faster codec per
    unit. Of all such plans, the one whose buckets take the fewest
    predicted seconds in all, a compressing bucket counted
    `Auto.min_speedup` times where a dense candidate exists (as `pick`
    weighs them); dynamic programming over the units in exchange order.
    """
    auto = settings.compressor
    candidates = auto.candidates
    joining = [c for c, x in enumerate(candidates) if x.spec.bucket_bytes]
    choices = [b.choice for b in per_unit]
    if not joining or len(units) < 2 or not communicator.joins_buckets:
        return choices
    has_dense = any(is_dense(x) for x in candidates)
    weight = [
        auto.min_speedup if has_dense and not is_dense(x) else 1.0
        for x in candidates
    ]
    peers = communicator.num_peers
    loads, sizes = {}, {}
    for c in joining:
        for u, group in enumerate(units):
            variables = [var_list[i] for i in group]
            loads[u, c] = _loads(
                settings, candidates[c], variables, communicator, peers
            )
            sizes[u, c] = _own_sizes(
                settings, candidates[c], var_list, group, communicator
            )

    def joined_seconds(c, start, end):
        count = max(len(loads[u, c]) for u in range(start, end))
        phases = [
            [t for u in range(start, end) for t in _nth(loads[u, c], j)]
            for j in range(count)
        ]
        return bucket_costs.bucket_seconds(phases, codecs[c], collectives)

    # best[k]: the fewest weighted seconds of the first k units; last[k]:
    # where their last bucket starts and its candidate (None: one unit
    # with its own choice).
    best = [0.0]
    last: list[tuple[int, int | None]] = [(0, None)]
    for end in range(1, len(units) + 1):
        own = per_unit[end - 1]
        best.append(best[-1] + weight[own.choice] * own.seconds[own.choice])
        last.append((end - 1, None))
        for c in joining:
            size = sizes[end - 1, c]
            for start in range(end - 2, -1, -1):
                size = [a + b for a, b in zip(size, sizes[start, c])]
                if max(size) > candidates[c].spec.bucket_bytes:
                    break
                cost = best[start] + weight[c] * joined_seconds(c, start, end)
                if cost < best[end]:
                    best[end], last[end] = cost, (start, c)
    end = len(units)
    while end > 0:
        start, c = last[end]
        if c is not None:
            choices[start:end] = [c] * (end - start)
        end = start
    return choices


def _nth(phases, j):
    """Phase j of a codec's loads, its phases taken in turn."""
    return phases[j % len(phases)]


def join(
    settings, var_list, units, choices, communicator
) -> list[tuple[list[int], int, int]]:
    """The exchange buckets of `units` (planning units, indices into
    `var_list`) given each one's candidate (`choices`), as (variables,
    candidate, units joined). A codec that sizes its own buckets
    (`spec.bucket_bytes`: ACP-SGD, by what it sends) is not cut by the
    gradient bytes of the units: neighbouring units that chose it are
    joined, whole, while what it counts of them stays within its size in
    each of its phases, as it joins its tensors on its own. Every other
    unit is an exchange bucket of its own, and every unit where the
    communicator also moves whole gradients (`joins_buckets` False: the
    hierarchical one's sum inside the host)."""
    out: list[tuple[list[int], int, int]] = []
    size: list[int] = []  # the last bucket's, per phase
    for group, choice in zip(units, choices):
        candidate = settings.compressor.candidates[choice]
        limit = candidate.spec.bucket_bytes
        own = _own_sizes(settings, candidate, var_list, group, communicator)
        if (
            out
            and limit
            and communicator.joins_buckets
            and out[-1][1] == choice
        ):
            together = [a + b for a, b in zip(size, own)]
            if max(together) <= limit:
                variables, _, count = out[-1]
                out[-1] = (variables + list(group), choice, count + 1)
                size = together
                continue
        out.append((list(group), choice, 1))
        size = own
    return out


def _own_sizes(settings, candidate, var_list, group, communicator):
    """Per phase of `candidate`, the bytes it counts against its own
    bucket size for the variables of `group`: what it sends, or their
    gradients ([0]: it sizes no buckets of its own)."""
    spec = candidate.spec
    variables = [var_list[i] for i in group]
    if not spec.bucket_bytes:
        return [0]
    if not spec.buckets_by_payload:
        return [planning.dense_bytes(variables)]
    peers = communicator.num_peers
    phases = _loads(settings, candidate, variables, communicator, peers)
    return [sum(t.nbytes for t in loads) for loads in phases]


def contenders(auto, buckets) -> tuple[tuple[int, ...], ...]:
    """The plans worth trying in the step: the predicted best, then per
    other candidate the best with that candidate in every bucket where
    its prediction is within `auto.trial_margin` of the chosen one's
    (where the start-up measurement cannot tell them apart), each plan
    once, at most `MAX_CONTENDERS`, by predicted total."""
    best = tuple(b.choice for b in buckets)
    plans = {best}
    for c in range(len(auto.candidates)):
        plan = tuple(
            c if _close(b.seconds[c], b.seconds[b.choice], auto) else b.choice
            for b in buckets
        )
        plans.add(plan)

    def total(plan):
        return sum(b.seconds[c] for b, c in zip(buckets, plan))

    others = sorted(plans - {best}, key=lambda p: (total(p), p))
    return (best, *others[: MAX_CONTENDERS - 1])


def choose(
    settings, var_list, groups, communicator, collectives, codecs
) -> tuple[BucketChoice, ...]:
    """Per bucket (`groups`, indices into `var_list`), every candidate's
    predicted exchange seconds from the measured costs (`price`), and the
    fastest (`pick`)."""
    chosen = []
    for g in groups:
        seconds, dense, compute = price(
            settings, var_list, g, communicator, collectives, codecs
        )
        choice = pick(settings.compressor, seconds)
        chosen.append(_bucket(var_list, g, seconds, dense, choice, compute))
    return tuple(chosen)


def price(settings, var_list, group, communicator, collectives, codecs):
    """The bucket of `group`'s predicted exchange seconds: (per candidate,
    in dense fp32, per candidate the part its codec computes)."""
    peers = communicator.num_peers
    variables = [var_list[i] for i in group]
    loads = [
        _loads(settings, c, variables, communicator, peers)
        for c in settings.compressor.candidates
    ]
    seconds = tuple(
        bucket_costs.bucket_seconds(load, codec, collectives)
        for load, codec in zip(loads, codecs)
    )
    compute = tuple(
        bucket_costs.codec_seconds(load, codec)
        for load, codec in zip(loads, codecs)
    )
    dense = bucket_costs.bucket_seconds(
        _dense_loads(variables, communicator),
        CodecCosts(0.0, 0.0),
        collectives,
    )
    return seconds, dense, compute


def pick(auto, seconds) -> int:
    """The fastest candidate (the first of equals), unless it compresses
    and is not `auto.min_speedup` times as fast as the fastest dense one:
    where they are close, the exact (or fp16) sum is worth more."""
    fastest = min(range(len(seconds)), key=lambda i: (seconds[i], i))
    dense = [i for i, c in enumerate(auto.candidates) if is_dense(c)]
    if not dense or fastest in dense:
        return fastest
    best_dense = min(dense, key=lambda i: (seconds[i], i))
    if seconds[fastest] * auto.min_speedup > seconds[best_dense]:
        return best_dense
    return fastest


def is_dense(candidate) -> bool:
    """Whether `candidate` sends every element (fp32, or cast to 16 bits)."""
    dense = (
        compressors_lib.Identity,
        compressors_lib.FP16,
        compressors_lib.BF16,
    )
    return isinstance(candidate, dense)


def _bucket(
    var_list, group, seconds, dense, choice, compute=(), units=1
) -> BucketChoice:
    variables = [var_list[i] for i in group]
    return BucketChoice(
        tuple(group),
        sum(num_elements(tuple(v.shape)) for v in variables),
        planning.dense_bytes(variables),
        seconds,
        dense,
        choice,
        compute,
        units,
    )


def _fallback(candidates) -> int:
    """With one worker nothing travels: the dense codec if a candidate,
    else the first."""
    for i, c in enumerate(candidates):
        if type(c) is compressors_lib.Identity:
            return i
    return 0


def _refuse_in_function() -> None:
    if (
        not tf.executing_eagerly()
        or not tf.distribute.in_cross_replica_context()
    ):
        raise ValueError(
            "compressor='auto' measures the cluster when the optimizer is "
            "built, which must happen outside tf.function: call "
            "`optimizer.build(model.trainable_variables)` inside "
            "`strategy.scope()` before training (model.fit does), or keep "
            "an earlier plan: Auto(choices=optimizer.plan.choices)."
        )


def _close(seconds: float, chosen: float, auto) -> bool:
    """Whether a candidate predicted `seconds` is worth trying in place of
    the chosen one: within `auto.trial_margin`, and not predicted exactly
    the same (a candidate that declines every tensor of the bucket sends
    it as the dense codec does)."""
    return seconds != chosen and seconds <= auto.trial_margin * chosen


def with_choices(plan: AutoPlan, choices) -> AutoPlan:
    """`plan` with each exchange bucket's candidate replaced by `choices`
    (one per bucket, as `AutoPlan.bucket_choices`)."""
    buckets = tuple(
        b._replace(choice=int(c)) for b, c in zip(plan.buckets, choices)
    )
    return plan._replace(buckets=buckets)


def assignments(plan: AutoPlan, count: int) -> list:
    """Per variable index, its bucket and the bucket's candidate
    (`planning.Assignment`); the default for variables in no bucket
    (overwritten with their gradient)."""
    out = [planning.Assignment()] * count
    for number, bucket in enumerate(plan.buckets):
        for i in bucket.variables:
            out[i] = planning.Assignment(plan.candidates[bucket.choice], number)
    return out


def switchable_assignments(
    settings, plan: AutoPlan, var_list, net, selector, used
) -> list:
    """As `assignments`, with the phases of the `used` candidates as
    `Slot`s over one shared state (None for the others), for plans that
    change: `selector` (int32 [buckets]) picks a candidate per bucket and
    step."""
    out = [planning.Assignment()] * len(var_list)
    for number, bucket in enumerate(plan.buckets):
        for i in bucket.variables:
            options = _slots(settings, plan.candidates, var_list[i], net, used)
            out[i] = planning.Assignment(
                None, number, options, selector, bucket.choice
            )
    return out


def _slots(settings, candidates, variable, net, used) -> tuple:
    """Per candidate, its phases for `variable` as `Slot`s (the
    optimizer's dense codec where a candidate declines the tensor); None
    for candidates not `used` (their state is kept, never run)."""
    part = settings.communicator.compressed_shape(tuple(variable.shape))
    bare = settings._replace(error_feedback=False)  # the slots add it
    phases = [
        planning.compressors_for(
            bare._replace(compressor=c), variable, part, net
        )[0]
        for c in candidates
    ]
    inits = tuple(p[0].init_state for p in phases)
    return tuple(
        tuple(switchable.Slot(i, phase, inits) for phase in p)
        if i in used
        else None
        for i, p in enumerate(phases)
    )
