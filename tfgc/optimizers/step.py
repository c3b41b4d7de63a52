"""One exchange of gradients by their plans, and what the step schedules
(`accumulation`, `local_rounds`, `non_finite`) are given to take a step."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfgc.core.wire import Traffic, no_traffic
from tfgc.optimizers import planning

#: exchange(tensors, trainable_variables, step) -> (totals, traffic)
Exchange = Callable[[list, list, tf.Tensor], tuple[list, Traffic]]


class Steps(NamedTuple):
    """The optimizer's parts a step schedule drives.

    Attributes:
        exchange: compresses, exchanges and decompresses gradients
            (`exchange` below, bound to the optimizer's plans).
        inner_apply: the inner optimizer's step on summed gradients,
            `inner_apply(grads, trainable_variables)`.
        count: records a step's `Traffic` in the statistics.
        plans_of: `plans_of(items, trainable_variables)`: the indices of
            the items that are not None and their variables' plans.
    """

    exchange: Exchange
    inner_apply: Callable[[list, list], None]
    count: Callable[[Traffic], None]
    plans_of: Callable[[list, list], tuple[list[int], list]]

    @classmethod
    def of(cls, optimizer, count: Callable[[Traffic], None]) -> Steps:
        """A built `CompressedOptimizer`'s steps, counted by `count`."""
        return cls(
            functools.partial(
                exchange,
                optimizer.communicator,
                optimizer.compressor.spec.warmup_steps,
                optimizer.bucket_bytes,
                optimizer._plans_of,
            ),
            optimizer._inner_apply,
            count,
            optimizer._plans_of,
        )


def plain(steps: Steps, grads, trainable_variables, step) -> None:
    """Exchanges this step's gradients and applies their sum."""
    exchanged = planning.without_overwritten(grads, trainable_variables)
    summed, traffic = steps.exchange(exchanged, trainable_variables, step)
    steps.count(traffic)
    steps.inner_apply(
        planning.with_overwritten(summed, grads, trainable_variables),
        trainable_variables,
    )


def exchange(
    communicator,
    warmup_steps: int,
    bucket_bytes: int | None,
    plans_of,
    tensors,
    trainable_variables,
    step,
) -> tuple[list, Traffic]:
    """Compresses, exchanges and decompresses `tensors` (None skipped).

    The compressors follow the step, which every worker shares: the
    warm-up compressor for the first `warmup_steps` steps, then the phases
    in turn, each a branch of one `tf.switch_case`. The compressor states
    are read from and written back to their variables; the tensors travel
    in buckets of about `bucket_bytes` (None: all in one exchange).

    Returns:
        (totals, traffic): per tensor the sum over workers (None where the
        tensor was None), and the `Traffic` of the step.
    """
    present, plans = plans_of(tensors, trainable_variables)
    if not present:
        return list(tensors), no_traffic()
    states = [plan.state() for plan in plans]
    inputs = [tensors[i] for i in present]
    keys = [planning.key(plan.seed, step) for plan in plans]
    variables = None
    if any(c.spec.reads_step_info for p in plans for c in p.phases):
        variables = [
            tf.convert_to_tensor(trainable_variables[i]) for i in present
        ]

    def run(compressors):
        return communicator.step(
            compressors, inputs, states, keys, variables, bucket_bytes
        )

    num_phases = max(len(plan.phases) for plan in plans)
    branches = [
        functools.partial(run, [p.phases[i % len(p.phases)] for p in plans])
        for i in range(num_phases)
    ]
    step = tf.cast(step, tf.int64)
    if warmup_steps:
        branches.insert(0, functools.partial(run, [p.warmup for p in plans]))
        index = tf.where(
            step < warmup_steps,
            tf.constant(0, tf.int64),
            1 + (step - warmup_steps) % num_phases,
        )
    else:
        index = step % num_phases
    if len(branches) == 1:
        result = branches[0]()
    else:
        result = tf.switch_case(tf.cast(index, tf.int32), branches)
    totals, new_states, traffic = result
    for plan, state in zip(plans, new_states):
        plan.assign_state(state)
    out = list(tensors)
    for i, total in zip(present, totals):
        out[i] = total
    return out, traffic
