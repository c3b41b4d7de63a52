"""The alpha-beta cost model that decides dense or sparse per tensor.

RedSync (Fang et al., 2019) sends a tensor sparse only where the model
predicts that a sparse all-gather plus selection and decompression beats a
dense ring all-reduce; see docs/algorithms.md, section "RedSync".
"""

from __future__ import annotations

import dataclasses
import math

from tfgc import _arguments


def _check(name: str, value, positive: bool) -> float:
    bound = "> 0" if positive else ">= 0"
    requirement = f"a finite number {bound}"
    number = _arguments.check_number(name, value, requirement)
    if not (number > 0 if positive else number >= 0):
        raise ValueError(
            f"`{name}` must be {requirement}. Received: {name}={value!r}"
        )
    return number


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Costs of one exchange step, in seconds.

    Defaults of the compute costs were measured on this project's CI
    machine (2 x86 cores, the compiled ops; benchmarks/results/ops_cpu.md):
    threshold selection runs at 0.3-0.7 ns per element at 17-25 M elements
    and densities 0.1-1 %, on Gaussian and heavy-tailed data and on real
    gradients, up to 0.9 ns with one huge outlier, and decompression
    writes every element of the dense result.

    Attributes:
        latency: alpha, seconds per message step of a collective.
        bandwidth: bytes per second of one worker's link (1 / beta).
        select_time: seconds per element to select from a tensor.
        scatter_time: seconds per element to decompress into a tensor.
    """

    latency: float
    bandwidth: float
    select_time: float = 1e-9
    scatter_time: float = 2e-10

    def __new__(cls, *args, **kwargs):
        # A misspelled field is named with the closest valid one.
        del args
        _arguments.check_keywords(cls.__name__, cls.__init__, kwargs)
        return super().__new__(cls)

    def __post_init__(self):
        for name, positive in (
            ("latency", False),
            ("bandwidth", True),
            ("select_time", False),
            ("scatter_time", False),
        ):
            object.__setattr__(
                self, name, _check(name, getattr(self, name), positive)
            )

    def dense_time(self, nbytes: float, num_peers: int) -> float:
        """Ring all-reduce: 2(p-1) alpha + 2 (p-1)/p M beta."""
        p = num_peers
        return 2 * (p - 1) * self.latency + 2 * (p - 1) / p * (
            nbytes / self.bandwidth
        )

    def sparse_time(
        self, num_elements: int, sent_bytes: float, num_peers: int
    ) -> float:
        """All-gather of `sent_bytes` per worker, plus select and scatter:
        ceil(log2 p) alpha + (p-1) s beta + (select + scatter) n."""
        p = num_peers
        steps = math.ceil(math.log2(p)) if p > 1 else 0
        return (
            steps * self.latency
            + (p - 1) * sent_bytes / self.bandwidth
            + (self.select_time + self.scatter_time) * num_elements
        )

    def get_config(self) -> dict:
        return dataclasses.asdict(self)
