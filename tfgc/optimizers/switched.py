"""The exchange of a planning unit whose codec the plan changes between
steps (`Auto`'s trials and revisions): a branch of one `tf.switch_case`
per candidate and phase, the candidate that the unit's entry of the
plan's choices holds.

Where a `Join`'s units (`auto_plan.Join`) all run its codec, they travel
as one bucket, as that codec alone would send them: each unit but the
last takes a branch that sends nothing, and the last, whose gradients
are ready last, takes one that exchanges every unit's tensors together.
Each unit keeps its own switch, so a step whose units run codecs that
are not joined still starts each unit's exchange as soon as its own
gradients exist.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgc.core.wire import no_traffic


class Unit(NamedTuple):
    """One unit's part of the step's exchange.

    Attributes:
        plans: its variables' `planning.Plan`s (their `options` per
            candidate).
        inputs: their gradients.
        states: their compressor states (read at the step's start).
        keys: their stateless keys.
    """

    plans: list
    inputs: list
    states: list
    keys: list


class Joined(NamedTuple):
    """What a unit that ends a join sends back for the join's other units.

    Attributes:
        in_force: bool scalar: the join ran (every unit chose its codec).
        totals: the other units' sums, in order (where it ran).
        states: their new states (their old ones where it did not).
    """

    in_force: tf.Tensor
    totals: list
    states: list


def in_force(join, choices) -> tf.Tensor:
    """Whether every unit of `join` runs its codec under `choices`."""
    chosen = tf.gather(choices, list(join.units))
    return tf.reduce_all(tf.equal(chosen, join.candidate))


def exchange(
    communicator, number: int, unit: Unit, choices, step, joins, earlier
):
    """Unit `number`'s exchange under `choices` (int32 [units]) at `step`.

    Args:
        joins: the `Join`s the plan may run (their codecs have slots).
        earlier: the units before this one, by number (those of the joins
            it ends).

    Returns:
        (its totals, its new states, its `Traffic`, a `Joined` per join
        it ends, in `joins` order).
    """
    ends = [j for j in joins if j.units[-1] == number]
    defers = [j for j in joins if number in j.units[:-1]]
    others = [[earlier[u] for u in j.units[:-1]] for j in ends]

    def run(codecs, units):
        def joined(field):
            return [x for u in units for x in getattr(u, field)]

        result = communicator.step(
            codecs, joined("inputs"), joined("states"), joined("keys")
        )
        return tuple(result)

    def untouched():
        # Placeholders of the right structure, never used (the caller
        # takes them only where the join ran): forwarded, not allocated.
        return [
            (
                [x for u in us for x in u.inputs],
                [s for u in us for s in u.states],
            )
            for us in others
        ]

    def alone(c, phase):
        def branch():
            codecs = [_phase(p.options[c], phase) for p in unit.plans]
            totals, states, traffic = run(codecs, [unit])
            return totals, states, traffic, untouched()

        return branch

    def deferred():
        # The join's last unit sends these; placeholders, as above.
        return list(unit.inputs), list(unit.states), no_traffic(), untouched()

    def together(k, phase):
        units = others[k] + [unit]

        def branch():
            c = ends[k].candidate
            codecs = [
                _phase(p.options[c], phase) for u in units for p in u.plans
            ]
            totals, states, traffic = run(codecs, units)
            n = sum(len(u.inputs) for u in others[k])
            out = untouched()
            out[k] = (totals[:n], states[:n])
            return totals[n:], states[n:], traffic, out

        return branch

    branches, first, counts = [], [], []
    for c, option in enumerate(unit.plans[0].options):
        if option is None:  # never chosen: no branch
            first.append(0)
            counts.append(1)
            continue
        count = max(len(p.options[c]) for p in unit.plans)
        first.append(len(branches))
        counts.append(count)
        branches += [alone(c, phase) for phase in range(count)]
    choice = choices[number]
    phase = step % tf.gather(tf.constant(counts, tf.int64), choice)
    index = tf.gather(first, choice) + tf.cast(phase, tf.int32)
    if defers:
        branches.append(deferred)
        for j in defers:
            index = tf.where(in_force(j, choices), len(branches) - 1, index)
    for k, j in enumerate(ends):
        units = others[k] + [unit]
        count = max(len(p.options[j.candidate]) for u in units for p in u.plans)
        start = len(branches)
        branches += [together(k, phase) for phase in range(count)]
        joined = start + tf.cast(step % count, tf.int32)
        index = tf.where(in_force(j, choices), joined, index)
    totals, states, traffic, back = tf.switch_case(index, branches)
    joined = [
        Joined(in_force(j, choices), list(t), list(s))
        for j, (t, s) in zip(ends, back)
    ]
    return list(totals), list(states), traffic, joined


def _phase(options, phase: int):
    """A candidate's compressor for the step's `phase` (its phases in turn)."""
    return options[phase % len(options)]
