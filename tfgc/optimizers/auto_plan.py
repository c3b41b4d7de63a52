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
dense one. Neighbouring units that chose a codec which sizes its own
buckets (ACP-SGD, by what it sends) are exchanged as one bucket, as that
codec joins its tensors on its own (`join`; a `Join` counts only in the
steps where each of its units runs its codec). Every worker computes the
same choices from the same numbers.

See docs/algorithms.md, "The planner".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from tfgc import compressors as compressors_lib
from tfgc.communicators import exchange, probe
from tfgc.communicators import topology as topology_lib
from tfgc.communicators.hierarchical import Hierarchical
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
    """One planning unit of the plan (its bucket unless joined).

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
    """

    variables: tuple[int, ...]
    elements: int
    nbytes: int
    seconds: tuple[float, ...]
    dense_seconds: float | None
    choice: int
    compute: tuple[float, ...] = ()


class Join(NamedTuple):
    """Neighbouring planning units that `candidate` (a codec sizing its
    own buckets) exchanges as one bucket, in the steps where each of
    them runs it; in others each unit is exchanged on its own.

    Attributes:
        units: the units, in exchange order (the last is ready last).
        candidate: the index of the codec.
        seconds: the bucket's predicted exchange seconds (None where not
            measured).
        compute: the part of `seconds` the codec computes (None: idem).
    """

    units: tuple[int, ...]
    candidate: int
    seconds: float | None = None
    compute: float | None = None


class AutoPlan(NamedTuple):
    """The codec of every bucket, and why (`table()`).

    Attributes:
        candidates: the candidates, as `Auto` holds them.
        buckets: one `BucketChoice` per planning unit, in exchange order.
        num_peers: the workers that exchange the gradients.
        collectives: the measured collective costs (None: not measured).
        codecs: per candidate, its measured compute (empty: not measured).
        reason: how the choices were made, in words.
        contenders: the plans (choices per unit) to try in the first
            steps, the predicted best first (`contenders`); empty: none.
        joins: the units exchanged as one bucket where each runs the
            join's codec (`Join`), in exchange order.
    """

    candidates: tuple[Compressor, ...]
    buckets: tuple[BucketChoice, ...]
    num_peers: int
    collectives: CollectiveCosts | None
    codecs: tuple[CodecCosts, ...]
    reason: str
    contenders: tuple[tuple[int, ...], ...] = ()
    joins: tuple[Join, ...] = ()

    @property
    def choices(self) -> tuple[int, ...]:
        """Per planning unit (the function `buckets`: `bucket_bytes` of
        gradients each), the index of its candidate: `Auto(choices=...)`
        keeps this plan in another run."""
        return tuple(b.choice for b in self.buckets)

    def joined(self) -> tuple[Join, ...]:
        """The joins in force under the plan's choices."""
        return complete(self.joins, self.choices)

    @property
    def labels(self) -> tuple[str, ...]:
        return labels(self.candidates)

    def predicted_seconds(self) -> float | None:
        """Predicted exchange seconds per step of the chosen codecs, the
        buckets one after another (None: not measured)."""
        if self.collectives is None:
            return None
        return sum(unit_seconds(self, self.choices))

    def predicted_dense_seconds(self) -> float | None:
        """The same in dense fp32 (None: not measured)."""
        if self.collectives is None:
            return None
        return sum(b.dense_seconds for b in self.buckets)

    def table(self) -> str:
        """The plan as a Markdown table, with its totals."""
        names = self.labels
        measured = self.collectives is not None
        head = ["unit", "tensors", "elements", "MiB"]
        if measured:
            head += [f"{n} ms" for n in names] + ["dense fp32 ms"]
        head.append("choice")
        rows = [
            f"tfgc Auto plan, {self.num_peers} workers, "
            f"{len(self.buckets)} units: {self.reason}.",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for number, b in enumerate(self.buckets):
            cells = [
                str(number),
                str(len(b.variables)),
                f"{b.elements:,}",
                f"{b.nbytes / 2**20:.2f}",
            ]
            if measured:
                cells += [f"{1e3 * s:.2f}" for s in b.seconds]
                cells.append(f"{1e3 * b.dense_seconds:.2f}")
            cells.append(names[b.choice])
            rows.append("| " + " | ".join(cells) + " |")
        in_force = self.joined()
        if self.joins:
            rows.append("")
        for j in self.joins:
            line = (
                f"Units {j.units[0]}-{j.units[-1]} travel as one bucket "
                f"under {names[j.candidate]}"
            )
            line += " (in force)" if j in in_force else " where each runs it"
            if j.seconds is not None:
                apart = sum(
                    self.buckets[u].seconds[j.candidate] for u in j.units
                )
                line += (
                    f": {1e3 * j.seconds:.2f} ms predicted, "
                    f"{1e3 * apart:.2f} ms apart"
                )
            rows.append(line + ".")
        if len(self.contenders) > 1:
            tried = "; ".join(
                ", ".join(names[c] for c in sorted(set(plan)))
                for plan in self.contenders
            )
            rows += [
                "",
                f"Tried step by step in turn before settling (the shortest "
                f"median exchange span wins), {len(self.contenders)} plans: "
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
    if isinstance(communicator, Hierarchical):
        raise ValueError(
            "compressor='auto' plans flat exchanges only; the hierarchical "
            "communicator compresses between hosts. Use communicator="
            "'auto', or a fixed compressor with 'hierarchical'."
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
        per_variable.append((phases, part, variable.dtype))
    count = max(len(p) for p, _, _ in per_variable)
    out = []
    for j in range(count):
        loads = []
        for phases, part, dtype in per_variable:
            phase = phases[j % len(phases)]
            collective = phase.spec.collectives[0]
            route = (
                communicator.linear_via
                if collective == ALL_REDUCE
                else collective
            )
            compressed = not isinstance(phase, compressors_lib.Identity)
            loads.append(
                TensorLoad(
                    route,
                    phase.spec.rounds,
                    int(phase.payload_bytes(part, dtype)),
                    num_elements(part) if compressed else 0,
                )
            )
        out.append(loads)
    return out


def _dense_loads(variables, communicator) -> list[list[TensorLoad]]:
    return [
        [
            TensorLoad(
                communicator.linear_via,
                1,
                num_elements(tuple(v.shape)) * tf.as_dtype(v.dtype).size,
                0,
            )
            for v in variables
        ]
    ]


def make(settings, var_list, communicator, bucket_bytes) -> AutoPlan:
    """The plan for `var_list` (call where the optimizer is built: in a
    cross-replica context, outside `tf.function`, on every worker)."""
    auto = settings.compressor
    units = buckets(var_list, bucket_bytes)
    peers = communicator.num_peers

    def unmeasured(choices, reason):
        chosen = tuple(
            _bucket(var_list, g, (), None, c) for g, c in zip(units, choices)
        )
        joins = join(settings, var_list, units, choices, communicator)
        return AutoPlan(
            auto.candidates, chosen, peers, None, (), reason, (), joins
        )

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
        strategy, codec_timing.REPEATS, options
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
    chosen = choose(
        settings, var_list, units, communicator, collectives, codecs
    )

    def priced(joins):
        out = []
        for j in joins:
            group = [i for u in j.units for i in units[u]]
            seconds, _, compute = price(
                settings, var_list, group, communicator, collectives, codecs
            )
            c = j.candidate
            out.append(j._replace(seconds=seconds[c], compute=compute[c]))
        return tuple(out)

    predicted = [b.choice for b in chosen]
    joins = priced(join(settings, var_list, units, predicted, communicator))
    tried = contenders(auto, chosen, joins) if auto.trial_steps else ()
    # Units a contender gives a joining codec may be joined for it too.
    for plan in tried[1:]:
        taken = {u for j in joins for u in j.units}
        free = [-1 if u in taken else c for u, c in enumerate(plan)]
        more = join(settings, var_list, units, free, communicator)
        joins = tuple(sorted(joins + priced(more), key=lambda j: j.units))
    return AutoPlan(
        auto.candidates,
        chosen,
        peers,
        collectives,
        codecs,
        "measured on this cluster, the fastest predicted per bucket",
        tried,
        joins,
    )


def join(settings, var_list, units, choices, communicator) -> tuple[Join, ...]:
    """The `Join`s of `units` (planning units, indices into `var_list`)
    given each one's candidate (`choices`; -1: none). A codec that sizes
    its own buckets (`spec.bucket_bytes`: ACP-SGD, by what it sends) is
    not cut by the gradient bytes of the units: neighbouring units that
    chose it are joined, whole, while what it counts of them stays within
    its size in each of its phases, as it joins its tensors on its own.
    Unpriced (`Join.seconds` None)."""
    runs: list[tuple[list[int], int]] = []
    size: list[int] = []  # the last run's, per phase
    for number, (group, choice) in enumerate(zip(units, choices)):
        if choice < 0:
            runs.append(([number], choice))
            continue
        candidate = settings.compressor.candidates[choice]
        limit = candidate.spec.bucket_bytes
        own = _own_sizes(settings, candidate, var_list, group, communicator)
        if runs and limit and runs[-1][1] == choice:
            together = [a + b for a, b in zip(size, own)]
            if max(together) <= limit:
                runs[-1][0].append(number)
                size = together
                continue
        runs.append(([number], choice))
        size = own
    return tuple(Join(tuple(u), c) for u, c in runs if len(u) > 1)


def complete(joins, choices) -> tuple[Join, ...]:
    """The `joins` in force under `choices` (per unit): each of their
    units runs their codec."""
    return tuple(
        j for j in joins if all(choices[u] == j.candidate for u in j.units)
    )


def unit_seconds(plan: AutoPlan, choices) -> list[float]:
    """Per unit, its predicted exchange seconds under `choices`; a join in
    force counts on its last unit (its other units send nothing of their
    own)."""
    out = [b.seconds[c] for b, c in zip(plan.buckets, choices)]
    for j in complete(plan.joins, choices):
        for u in j.units:
            out[u] = 0.0
        out[j.units[-1]] = j.seconds
    return out


def effective_seconds(buckets, joins) -> tuple[tuple[float, ...], ...]:
    """Per unit and candidate, its predicted seconds, a join's codec in
    its units counted as the joined bucket's, shared among them by their
    seconds apart: what choosing per unit compares."""
    table = [list(b.seconds) for b in buckets]
    for j in joins:
        apart = [buckets[u].seconds[j.candidate] for u in j.units]
        total = sum(apart)
        for u, alone in zip(j.units, apart):
            share = alone / total if total > 0 else 1 / len(j.units)
            table[u][j.candidate] = j.seconds * share
    return tuple(tuple(row) for row in table)


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


def contenders(auto, buckets, joins=()) -> tuple[tuple[int, ...], ...]:
    """The plans worth trying in the step: the predicted best, then per
    other candidate the best with that candidate in every unit where
    its prediction (a join's share, `effective_seconds`) is within
    `auto.trial_margin` of the chosen one's (where the start-up
    measurement cannot tell them apart), each plan once, at most
    `MAX_CONTENDERS`, by predicted total."""
    table = effective_seconds(buckets, joins)
    best = tuple(b.choice for b in buckets)
    plans = {best}
    for c in range(len(auto.candidates)):
        plan = tuple(
            c if _close(row[c], row[b.choice], auto) else b.choice
            for b, row in zip(buckets, table)
        )
        plans.add(plan)

    def total(plan):
        return sum(row[c] for row, c in zip(table, plan))

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
    var_list, group, seconds, dense, choice, compute=()
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
    """`plan` with each unit's candidate replaced by `choices`."""
    buckets = tuple(
        b._replace(choice=int(c)) for b, c in zip(plan.buckets, choices)
    )
    return plan._replace(buckets=buckets)


def assignments(plan: AutoPlan, count: int) -> list:
    """Per variable index, its unit and the unit's candidate
    (`planning.Assignment`); the default for variables in no unit
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
    change: `selector` (int32 [units]) picks a candidate per unit and
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
