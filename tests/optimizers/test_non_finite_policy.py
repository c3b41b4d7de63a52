"""`CompressedOptimizer(non_finite=...)` in plain float32 training: a NaN
or Inf on one replica leads every replica to the same decision.

docs/algorithms.md, "Non-finite gradients". The multi-worker runs (real
processes, the value injected on one worker only) are in
tests/multiworker/test_non_finite_policy.py.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests.keras_models import GLOBAL_BATCH, data, fit
from tfgc import compressors


def _poisoned(strategy, value=np.inf):
    """The data with `value` in the last replica's share of the second
    batch, the same data without that batch, and the batch's rows."""
    x, y = data()
    per_replica = GLOBAL_BATCH // strategy.num_replicas_in_sync
    bad = slice(GLOBAL_BATCH, 2 * GLOBAL_BATCH)
    x[2 * GLOBAL_BATCH - per_replica] = value
    keep = np.ones(len(x), bool)
    keep[bad] = False
    return (x, y), (x[keep], y[keep])


# One exchange, and a bucket per tensor: the verdicts travel with each.
BUCKETS = [None, 4]


def _optimizer(non_finite, compressor=None, options=None, **inner):
    """`options` go to the CompressedOptimizer, `inner` to SGD."""

    def make():
        return tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9, **inner),
            compressor or compressors.TopK(density=0.25),
            min_compress_size=0,
            non_finite=non_finite,
            **(options or {}),
        )

    return make


def _assert_replicas_agree(model):
    for w in model.weights:
        copies = [c.numpy() for c in w.value.values]
        for c in copies[1:]:
            np.testing.assert_array_equal(c, copies[0])


def _residuals(model):
    return [
        v.numpy() for v in model.optimizer.variables if "residual" in v.path
    ]


@pytest.mark.parametrize("bucket_bytes", BUCKETS)
@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_skip_is_the_run_without_that_batch(mirrored, value, bucket_bytes):
    """Skipping leaves weights, residuals, momentum and the step counter
    as they were: the result is the run that never saw the batch."""
    poisoned, clean = _poisoned(mirrored, value)
    options = {"bucket_bytes": bucket_bytes}
    model = fit(mirrored, _optimizer("skip", options=options), *poisoned)
    expected = fit(mirrored, _optimizer("skip", options=options), *clean)
    for a, b in zip(model.get_weights(), expected.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_residuals(model), _residuals(expected)):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)
    assert model.optimizer.skipped_steps == 1
    assert expected.optimizer.skipped_steps == 0
    assert int(model.optimizer.iterations.numpy()) == 3
    _assert_replicas_agree(model)


@pytest.mark.parametrize(
    "name, make",
    [
        (
            "accumulation",
            lambda: _optimizer("skip", gradient_accumulation_steps=2),
        ),
        (
            "sbc_rounds",
            lambda: _optimizer("skip", compressors.SBC(0.25, delay=3)),
        ),
    ],
)
def test_skip_with_accumulation_and_local_rounds(mirrored, name, make):
    """The skip wraps the other apply paths too: the accumulated micro-
    batch and the local step of a round are left out as a whole (the 3
    steps applied make one whole SBC round, after which replicas agree)."""
    poisoned, clean = _poisoned(mirrored)
    model = fit(mirrored, make(), *poisoned)
    expected = fit(mirrored, make(), *clean)
    for a, b in zip(model.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=name)
    assert model.optimizer.skipped_steps == 1
    _assert_replicas_agree(model)


@pytest.mark.parametrize("bucket_bytes", BUCKETS)
def test_raise_names_the_replica_and_the_variable(mirrored, bucket_bytes):
    poisoned, _ = _poisoned(mirrored)
    last = mirrored.num_replicas_in_sync - 1
    options = {"bucket_bytes": bucket_bytes}
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        fit(mirrored, _optimizer("raise", options=options), *poisoned)
    message = str(error.value)
    assert "Non-finite gradient" in message
    # Keras numbers the names of models built earlier in the session.
    named = rf"replica {last}: sequential(_\d+)?/dense(_\d+)?/kernel"
    assert re.search(named, message), message[-2000:]
    assert "replica 0" not in message


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_checked_finite_steps_are_the_unchecked_ones(mirrored, policy):
    _, clean = _poisoned(mirrored)
    options = {"bucket_bytes": 4}
    checked = fit(mirrored, _optimizer(policy, options=options), *clean)
    plain = fit(mirrored, _optimizer("propagate", options=options), *clean)
    for a, b in zip(checked.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_propagate_applies_the_value_the_same_everywhere(mirrored):
    poisoned, _ = _poisoned(mirrored)
    model = fit(mirrored, _optimizer("propagate"), *poisoned)
    assert not all(np.all(np.isfinite(w)) for w in model.get_weights())
    assert model.optimizer.skipped_steps == 0
    _assert_replicas_agree(model)


def test_policy_is_checked_and_serialized():
    with pytest.raises(ValueError, match=r"`non_finite` must be one of"):
        tfgc.CompressedOptimizer(keras.optimizers.SGD(), non_finite="ignore")
    optimizer = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(), non_finite="skip"
    )
    config = optimizer.get_config()
    assert config["non_finite"] == "skip"
    assert tfgc.CompressedOptimizer.from_config(config).non_finite == "skip"
