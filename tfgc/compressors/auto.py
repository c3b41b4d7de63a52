"""`Auto`: let the optimizer pick a codec per exchange bucket.

Not a codec itself: `CompressedOptimizer` measures this cluster when it
is built and gives each bucket the candidate predicted to exchange it
fastest (`tfgc.optimizers.auto_plan`; docs/algorithms.md, "The planner").
"""

from __future__ import annotations

import keras

from tfgc import _arguments
from tfgc.compressors import base, registry
from tfgc.compressors.acpsgd import ACPSGD
from tfgc.compressors.dense import FP16, Identity
from tfgc.compressors.mstopk import MSTopK
from tfgc.compressors.powersgd import PowerSGD
from tfgc.compressors.topk import TopK
from tfgc.core.compressor import Compressor, Spec
from tfgc.core.wire import ALL_GATHER, ALL_REDUCE


def default_candidates() -> tuple[Compressor, ...]:
    """Dense fp32 and fp16, and the compressors whose convergence
    docs/benchmarks/convergence.md shows within 2 % of dense on the LSTM
    LM: TopK and MSTopK at 1 % with error feedback, PowerSGD and ACP-SGD
    at rank 4."""
    return (
        Identity(),
        FP16(),
        TopK(density=0.01),
        MSTopK(density=0.01),
        PowerSGD(rank=4),
        ACPSGD(rank=4),
    )


def _optional_count(name: str, value) -> int | None:
    """None, or an integer >= 1."""
    return None if value is None else base.check_positive_int(name, value)


def _at_least_one(name: str, value, meaning: str) -> float:
    """A number >= 1; `meaning` says what it is, for the message."""
    number = _arguments.check_number(name, value, "a number >= 1")
    if number < 1:
        raise ValueError(
            f"`{name}` must be a number >= 1 ({meaning}). Received: "
            f"{name}={value!r}"
        )
    return number


def refusal(candidate: Compressor) -> str | None:
    """Why `candidate` cannot be planned per bucket, or None if it can.

    The planner predicts a bucket's time from fixed-size payloads that
    travel through one kind of collective, every step alike.
    """
    spec = candidate.spec
    if isinstance(candidate, Auto):
        return "it is Auto itself"
    if spec.compresses_updates:
        return "it compresses weight updates over several local steps"
    if spec.warmup_steps:
        return "it has warm-up steps (give warmup_steps=0)"
    if spec.local_momentum:
        return "it applies momentum itself"
    if spec.reads_step_info:
        return "it reads the weights"
    if len(set(spec.collectives)) != 1 or spec.collectives[0] not in (
        ALL_REDUCE,
        ALL_GATHER,
    ):
        return (
            "its payloads do not travel through one fixed-size all-reduce "
            "or all-gather"
        )
    return None


@base.register
class Auto(Compressor):
    """A codec per bucket, chosen by measurement (see the module).

    Args:
        candidates: the codecs a bucket may get (compressors, names or
            Keras config dicts); default `default_candidates()`. Each must
            send fixed-size payloads through one kind of collective every
            step, without warm-up or local steps (`refusal` says why not).
        choices: per planning unit (the gradients cut by the optimizer's
            `bucket_bytes`), the index of its candidate, in exchange order
            (unit 0 holds the last variables): the plan of an earlier run
            (`optimizer.plan.choices`), kept without measuring. None:
            measure and choose when the optimizer is built.
        min_speedup: a compressing candidate gets a bucket only where it
            is predicted at least this many times as fast as the fastest
            dense one (fp32 or a 16-bit cast): where they are close, the
            exact sum is worth more. 1.0: the fastest, whatever it is.
        trial_steps: the start-up measurement sees idle collectives and
            an idle device, and cannot tell apart candidates whose
            predictions are within `trial_margin` of each other; the
            plans that differ by such candidates (at most 6) take turns
            step by step for this many rounds, and the one whose steps'
            periods (first bucket ready to the next step's, the mean
            over the workers) have the shortest median is kept; the
            trials take one step more, which measures the last one's
            period. None:
            the predicted plan, untried.
        trial_margin: how close (a factor) a candidate's prediction for
            a bucket must be to the chosen one's to be tried there. The
            prediction counts a bucket's time on the wire in full, and in
            the step much of it hides under the backward pass while a
            codec's compute does not: candidates predicted up to about
            3x apart can take steps within a few percent of each other.
        replan_every: every this many steps, correct each candidate's
            predictions by what it measured and choose again per bucket
            (a variable's residual is kept across codecs; a codec that
            comes back starts afresh); None: the plan made at build.
        check_after: once this many steps are timed (after a few that
            settle), the chief compares the predicted step time with the
            measured one and warns if they differ by more than 25 %
            (`optimizer.plan_report()` at any time); None: never.
        verbose: the chief prints the plan's table when it is made.
    """

    spec = Spec(collectives=(ALL_REDUCE,))

    def __init__(
        self,
        candidates=None,
        choices=None,
        min_speedup: float = 1.05,
        trial_steps: int | None = 3,
        trial_margin: float = 3.0,
        replan_every: int | None = None,
        check_after: int | None = 50,
        verbose: bool = True,
    ):
        if candidates is None:
            candidates = default_candidates()
        if isinstance(candidates, (str, dict, Compressor)):
            candidates = [candidates]
        self.candidates = tuple(registry.get(c) for c in candidates)
        if not self.candidates:
            raise ValueError(
                "`candidates` must name at least one codec. Received: "
                "candidates=[]"
            )
        for candidate in self.candidates:
            reason = refusal(candidate)
            if reason:
                raise ValueError(
                    f"Auto cannot plan with {candidate!r}: {reason}. "
                    "Leave it out of `candidates`."
                )
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError(
                "`candidates` must differ from each other. Received: "
                f"candidates={list(self.candidates)!r}"
            )
        if choices is not None:
            choices = tuple(
                base.check_positive_int("choices", c, minimum=0)
                for c in choices
            )
            if any(c >= len(self.candidates) for c in choices):
                raise ValueError(
                    "`choices` are indices into `candidates` (0 to "
                    f"{len(self.candidates) - 1}). Received: "
                    f"choices={list(choices)}"
                )
        self.choices = choices
        self.min_speedup = _at_least_one(
            "min_speedup",
            min_speedup,
            "how many times as fast as dense a compressing candidate must be",
        )
        self.trial_steps = _optional_count("trial_steps", trial_steps)
        self.trial_margin = _at_least_one(
            "trial_margin",
            trial_margin,
            "how close to the chosen candidate's prediction another's must "
            "be to be tried",
        )
        self.replan_every = _optional_count("replan_every", replan_every)
        if self.replan_every is not None and choices is not None:
            raise ValueError(
                "`replan_every` corrects the measured predictions, and "
                "`choices` skips measuring. Give one of them. Received: "
                f"replan_every={replan_every!r}, choices={list(choices)}"
            )
        self.check_after = _optional_count("check_after", check_after)
        if not isinstance(verbose, bool):
            raise TypeError(
                f"`verbose` must be a bool. Received: verbose={verbose!r}"
            )
        self.verbose = verbose

    def compress(self, x, state, key):
        raise TypeError(
            "Auto is not a codec: pass it to tfgc.CompressedOptimizer, "
            "which picks a candidate per bucket."
        )

    def payload_bytes(self, shape, dtype):
        self.compress(None, None, None)

    def get_config(self):
        return {
            "candidates": [
                keras.saving.serialize_keras_object(c) for c in self.candidates
            ],
            "choices": None if self.choices is None else list(self.choices),
            "min_speedup": self.min_speedup,
            "trial_steps": self.trial_steps,
            "trial_margin": self.trial_margin,
            "replan_every": self.replan_every,
            "check_after": self.check_after,
            "verbose": self.verbose,
        }
