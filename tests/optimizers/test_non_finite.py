"""Non-finite gradients: one behaviour with the compiled ops and without.

docs/algorithms.md, "Non-finite gradients": selection by magnitude takes
NaN and +-Inf first, so they are sent and reach the optimizer; compressors
that send every entry carry them into their result; under error feedback
the residual is 0 wherever what a worker sent is not finite, so nothing
non-finite stays behind in it.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import backends
from tests.compressors.test_contract import local_step
from tfgc import compressors

SHAPE = (20, 10)
SPECIALS = [np.nan, np.inf, -np.inf]
# Where the special values go (flat positions).
POSITIONS = [5, 77]


def _make(name):
    c = compressors
    return {
        "topk": lambda: c.ErrorFeedback(c.TopK(0.05)),
        "mstopk": lambda: c.ErrorFeedback(c.MSTopK(0.05)),
        "redsync": lambda: c.RedSync(0.05, cost_model=None),
        "redsync_trimmed": lambda: c.RedSync(
            0.05, selection="trimmed", cost_model=None
        ),
        "sbc": lambda: c.ErrorFeedback(c.SBC(0.05)),
        "sbc_unbinarized": lambda: c.ErrorFeedback(c.SBC(0.05, binarize=False)),
        "importance": lambda: c.ErrorFeedback(c.ImportancePruning(0.05)),
        "signsgd": lambda: c.ErrorFeedback(c.SignSGD()),
        "signsgd_vote": lambda: c.ErrorFeedback(c.SignSGD(scaled=False)),
        "powersgd": lambda: c.ErrorFeedback(c.PowerSGD(rank=2)),
        "acpsgd": lambda: c.ErrorFeedback(c.ACPSGD(rank=2)),
        "acpsgd_q": lambda: c.ErrorFeedback(c.ACPSGD(rank=2, factor="q")),
        "randomk_all": lambda: c.ErrorFeedback(c.RandomK(1.0)),
    }[name]()


NAMES = [
    "topk",
    "mstopk",
    "redsync",
    "redsync_trimmed",
    "sbc",
    "sbc_unbinarized",
    "importance",
    "signsgd",
    "signsgd_vote",
    "powersgd",
    "acpsgd",
    "acpsgd_q",
    "randomk_all",
]


@pytest.fixture(params=backends.BACKENDS)
def backend(request, monkeypatch):
    """Runs the test with the compiled ops, then with the pure-TF ones."""
    backends.use(request.param, monkeypatch)


def _key(step):
    return tf.constant([7, step], tf.int64)


def _gradient(seed, special=None):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=SHAPE).astype(np.float32).ravel()
    if special is not None:
        x[POSITIONS] = special
    return tf.constant(x.reshape(SHAPE))


def _leftovers(state):
    """What a compressor keeps between steps, as numpy arrays."""
    return [np.asarray(t) for t in tf.nest.flatten(state)]


def _steps(name, special):
    """A step on a gradient with `special` at POSITIONS, then a finite one:
    (total, state) of each, on one worker."""
    c = _make(name)
    state = c.init_state(SHAPE, tf.float32, _key(-1))
    out = []
    for step, x in enumerate((_gradient(0, special), _gradient(1))):
        total, state, _, _ = local_step(c, x, state, _key(step))
        out.append((total.numpy(), _leftovers(state)))
    return out


@pytest.mark.parametrize("special", SPECIALS, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_non_finite_is_sent_and_leaves_no_trace(backend, name, special):
    del backend
    (total, kept), (next_total, next_kept) = _steps(name, special)
    flat = total.ravel()
    assert not np.isfinite(flat[POSITIONS]).any(), "sent to the optimizer"
    if not np.isnan(special):
        for p in POSITIONS:  # an infinity keeps its sign where it is alone
            assert np.isnan(flat[p]) or np.sign(flat[p]) == np.sign(special)
    for t in kept:
        assert np.isfinite(t).all(), "nothing non-finite is kept"
    assert np.isfinite(next_total).all(), "the next step is unaffected"
    for t in next_kept:
        assert np.isfinite(t).all()


@pytest.mark.parametrize("special", SPECIALS, ids=str)
@pytest.mark.parametrize("name", ["topk", "mstopk", "sbc", "redsync"])
def test_compiled_and_pure_tf_agree(monkeypatch, name, special):
    backends.use("custom", monkeypatch)
    compiled = _steps(name, special)
    backends.use("reference", monkeypatch)
    pure_tf = _steps(name, special)
    for (total_a, kept_a), (total_b, kept_b) in zip(compiled, pure_tf):
        np.testing.assert_array_equal(total_a, total_b)
        for a, b in zip(kept_a, kept_b):
            np.testing.assert_array_equal(a, b)


def test_randomk_sends_what_it_draws_and_keeps_the_rest(backend):
    """Random-k's positions do not depend on the values: a non-finite entry
    at an undrawn position waits in the residual until it is drawn."""
    del backend
    c = compressors.RandomK(0.3)
    ef = compressors.ErrorFeedback(c)
    n = SHAPE[0] * SHAPE[1]
    drawn = set(c.indices(n, _key(0)).numpy().tolist())
    sent_at = min(drawn)
    kept_at = min(set(range(n)) - drawn)
    x = _gradient(0).numpy().ravel()
    x[[sent_at, kept_at]] = np.nan
    state = ef.init_state(SHAPE, tf.float32, _key(-1))
    total, state, _, _ = local_step(
        ef, tf.constant(x.reshape(SHAPE)), state, _key(0)
    )
    assert np.isnan(total.numpy().ravel()[sent_at])
    residual = state.residual.numpy().ravel()
    assert residual[sent_at] == 0
    assert np.isnan(residual[kept_at])
    assert np.isfinite(np.delete(residual, kept_at)).all()
