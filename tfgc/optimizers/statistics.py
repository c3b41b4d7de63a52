"""What the optimizer counts of its traffic, for `compression_stats`."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfgc.core.wire import Traffic


class Counters(NamedTuple):
    """int64 scalar variables, one value per replica.

    Attributes:
        last: the `Traffic` of the last step.
        run_bytes: bytes on the wire (sent + overhead) since the build.
        run_steps: steps since the build.
        skipped_steps: steps skipped everywhere for a non-finite gradient.
    """

    last: Traffic
    run_bytes: tf.Variable
    run_steps: tf.Variable
    skipped_steps: tf.Variable

    @classmethod
    def create(cls, add_variable: Callable[..., tf.Variable]) -> Counters:
        """The counters, made by `add_variable` (the optimizer's)."""

        def counter(name):
            return add_variable(
                shape=(), dtype="int64", aggregation="none", name=name
            )

        last = Traffic(
            *map(counter, ("sent_bytes", "overhead_bytes", "intra_host_bytes"))
        )
        return cls(
            last, counter("run_bytes"), counter("run_steps"),
            counter("skipped_steps"),
        )  # fmt: skip

    def count(self, traffic: Traffic) -> None:
        """Records one step's traffic."""
        for variable, value in zip(self.last, traffic):
            variable.assign(value)
        self.run_bytes.assign_add(traffic.sent + traffic.overhead)
        self.run_steps.assign_add(1)

    def stats(self, dense_bytes: int) -> dict[str, float]:
        """`CompressedOptimizer.compression_stats`' values (eagerly)."""
        sent, overhead, intra_host = (int(v.numpy()) for v in self.last)
        steps = int(self.run_steps.numpy())
        run_mean = int(self.run_bytes.numpy()) / max(steps, 1)
        return {
            "sent_bytes": float(sent),
            "overhead_bytes": float(overhead),
            "intra_host_bytes": float(intra_host),
            "dense_bytes": float(dense_bytes),
            "compression_ratio": dense_bytes / max(sent + overhead, 1),
            "run_steps": float(steps),
            "run_mean_bytes": float(run_mean),
            "run_compression_ratio": dense_bytes / max(run_mean, 1e-9),
        }
