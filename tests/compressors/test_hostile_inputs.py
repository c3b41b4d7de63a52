"""Hostile input through every compressor: property-based (hypothesis).

One worker (`local_step`, as in tests/compressors/test_contract.py), with the
compiled ops and with the pure-TF references, over shapes (0-d, 1-d, 2-d,
4-d, a zero dimension, up to a few 100k elements), dtypes (float32,
float16, bfloat16, float64), densities across (0, 1] (k = 1 and k = n
included) and data: Gaussian at several scales, all zero, constant,
subnormal, a mix, and NaN / +-Inf scattered in. Properties:

* nothing crashes; the result and the local estimate have x's shape and
  dtype, the state keeps its structure, shapes and dtypes;
* decompressing one worker's payload gives its local estimate, bit for bit;
* finite input gives finite result, estimate and state;
* k = ceil(density n) entries are selected (k..n for RedSync's threshold),
  at distinct positions in [0, n); the bytes measured from the payload
  are `payload_bytes` (its bound for data-dependent sizes);
* error feedback: x + residual_before == local_estimate + residual_after
  wherever both sides are finite (to the dtype's rounding and flushed
  subnormals), and the new residual is finite wherever x + residual_before
  is (RedSync: U and V obey the same with its momentum);
* a dtype a compressor does not support, and every bad constructor
  argument, is a ValueError naming the argument and the value received.

`pytest --hypothesis-show-statistics
tests/compressors/test_hostile_inputs.py` prints how many examples each
test ran.
"""

import functools
import math

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from tests import backends
from tests.compressors.test_contract import local_step
from tests.ops.test_ops_hostile import DTYPES, data, f64, property_settings
from tfgc import compressors
from tfgc.core.compressor import Compressor
from tfgc.core.wire import ALL_GATHER_RAGGED, payload_nbytes


@pytest.fixture(params=backends.BACKENDS)
def backend(request, monkeypatch):
    """Runs the test with the compiled ops, then with the pure-TF ones."""
    backends.use(request.param, monkeypatch)
    return request.param


# Selection by `tfgc.ops.top_k_sample`: float32, float16 and bfloat16 only.
NO_FLOAT64 = {"mstopk", "redsync", "redsync_trimmed"}
OWN_RESIDUAL = {"redsync", "redsync_trimmed"}


def make(name: str, density: float, rank: int) -> Compressor:
    c = compressors
    return {
        "identity": lambda: c.Identity(),
        "fp16": lambda: c.FP16(),
        "bf16": lambda: c.BF16(),
        "topk": lambda: c.TopK(density),
        "randomk": lambda: c.RandomK(density),
        "signsgd": lambda: c.SignSGD(),
        "signsgd_vote": lambda: c.SignSGD(scaled=False),
        "powersgd": lambda: c.PowerSGD(rank),
        "mstopk": lambda: c.MSTopK(density),
        "redsync": lambda: c.RedSync(density, cost_model=None),
        "redsync_trimmed": lambda: c.RedSync(
            density, selection="trimmed", cost_model=None
        ),
        "sbc": lambda: c.SBC(density),
        "sbc_unbinarized": lambda: c.SBC(density, binarize=False),
        "importance": lambda: c.ImportancePruning(density),
        "acpsgd": lambda: c.ACPSGD(rank),
        "acpsgd_q": lambda: c.ACPSGD(rank, factor="q"),
    }[name]()


NAMES = [
    "identity",
    "fp16",
    "bf16",
    "topk",
    "randomk",
    "signsgd",
    "signsgd_vote",
    "powersgd",
    "mstopk",
    "redsync",
    "redsync_trimmed",
    "sbc",
    "sbc_unbinarized",
    "importance",
    "acpsgd",
    "acpsgd_q",
]
# (name, with error feedback): every compressor bare, and wrapped where it
# does not keep its own residual.
VARIANTS = [(n, False) for n in NAMES] + [
    (n, True) for n in NAMES if n not in OWN_RESIDUAL
]
KINDS = ("normal", "zeros", "constant", "subnormal", "mixed", "nonfinite")

shapes = st.one_of(
    st.just(()),
    st.tuples(st.integers(0, 3000)),
    st.tuples(st.integers(0, 60), st.integers(0, 60)),
    st.tuples(*[st.integers(0, 6)] * 4),
)
# Tiny densities give k = 1, 1.0 gives k = n.
densities = st.one_of(
    st.sampled_from([1e-9, 1.0]), st.floats(1e-6, 1.0, exclude_min=False)
)


def _finfo(np_dtype):
    return ml_dtypes.finfo(np_dtype)


def gradient(shape, dtype_name, kind, seed, scale) -> np.ndarray:
    """Hostile data of `kind`, as a numpy array of the dtype."""
    return data(shape, dtype_name, kind, seed, scale, (-3.5, 0.25, 1.0, 7e-3))


def same_bits(a, b) -> bool:
    """Equal values, NaN equal to NaN (compared as float64)."""
    return np.array_equal(f64(a), f64(b), equal_nan=True)


def rounding_tolerance(dtype_name, *magnitudes):
    """What rounding in the dtype and flushed subnormals may change in
    x + residual - estimate: a few ulps of the operands' magnitudes and a
    few smallest normals."""
    info = _finfo(DTYPES[dtype_name][1])
    total = sum(
        np.abs(np.nan_to_num(m, posinf=0, neginf=0)) for m in magnitudes
    )
    return 4 * float(info.eps) * total + 4 * float(info.tiny)


def _key(step):
    return tf.constant([7, step], tf.int64)


def _selected_positions(name, payloads, n):
    """(positions, k_min, k_max) of a selecting compressor, else None."""
    payload = payloads[0]
    if name in ("topk", "mstopk", "redsync", "redsync_trimmed", "importance"):
        return payload.indices.numpy()
    if name.startswith("sbc"):
        return None  # Golomb coded: checked through the round trip
    return None


def _check_selection(name, compressor, payloads, n):
    k = compressor.num_selected((n,)) if hasattr(compressor, "density") else n
    if name == "randomk":
        assert payloads[0].values.shape == (k,)
        return
    if name.startswith("sbc"):
        count = int(payloads[0].count.numpy()[0])
        assert 0 <= count <= k
        if name == "sbc_unbinarized":
            assert count == k
        return
    positions = _selected_positions(name, payloads, n)
    if positions is None:
        return
    assert len(set(positions.tolist())) == len(positions), "distinct"
    assert ((positions >= 0) & (positions < max(n, 1))).all()
    if name == "redsync":  # threshold selection: k..n entries
        assert k <= len(positions) <= n
    else:
        assert len(positions) == k


def run_step(compressor, x, state, step):
    total, new_state, payloads, ctx = local_step(
        compressor, x, state, _key(step)
    )
    estimate = compressor.local_estimate(payloads[-1], ctx)
    return total, new_state, payloads, estimate


def _structure(state):
    return tf.nest.map_structure(lambda t: (tuple(t.shape), t.dtype), state)


def check_compressor(
    name, error_feedback, shape, dtype_name, kind, density, rank, seed, scale
):
    """Every property above for one compressor and input; returns nothing,
    raises AssertionError on a violation."""
    inner = make(name, density, rank)
    compressor = compressors.ErrorFeedback(inner) if error_feedback else inner
    dtype = DTYPES[dtype_name][0]
    if dtype_name == "float64" and name in NO_FLOAT64:
        with pytest.raises(ValueError) as raised:
            compressor.init_state(shape, dtype, _key(-1))
        message = str(raised.value)
        assert "`dtype`" in message and "float64" in message
        assert "float32" in message  # the fix
        return
    state = compressor.init_state(shape, dtype, _key(-1))
    structure = _structure(state)
    n = math.prod(shape)
    for step in range(2):
        x_np = gradient(shape, dtype_name, kind, seed + step, scale)
        x = tf.constant(x_np, dtype)
        before = state
        total, state, payloads, estimate = run_step(compressor, x, state, step)
        for out in (total, estimate):
            assert tuple(out.shape) == shape and out.dtype == dtype
        assert _structure(state) == structure
        assert same_bits(total, estimate), "decompress(own) != estimate"
        finite_in = np.isfinite(f64(x_np)).all() and all(
            np.isfinite(f64(t)).all() for t in tf.nest.flatten(before)
        )
        if finite_in:
            assert np.isfinite(f64(total)).all()
            for t in tf.nest.flatten(state):
                assert np.isfinite(f64(t)).all(), "state not finite"
        _check_selection(name, inner, payloads, n)
        measured = sum(int(payload_nbytes(p)) for p in payloads)
        bound = compressor.payload_bytes(shape, dtype)
        if ALL_GATHER_RAGGED in compressor.spec.collectives:
            assert measured <= bound
        elif name != "redsync":  # threshold: may exceed 2k (ties)
            assert measured == bound
        _check_residual(
            name,
            error_feedback,
            inner,
            x_np,
            dtype_name,
            before,
            state,
            estimate,
        )


def _check_residual(
    name, error_feedback, inner, x_np, dtype_name, before, after, estimate
):
    x = f64(x_np)
    est = f64(estimate)
    if error_feedback:
        r0, r1 = f64(before.residual), f64(after.residual)
        lhs, rhs = x + r0, est + r1
        tol = rounding_tolerance(dtype_name, x, r0, est)
    elif name in OWN_RESIDUAL:
        # U' + V' + sent == m U + g + V, with U zeroed where V was sent.
        u0, v0 = f64(before.momentum), f64(before.accumulation)
        v1 = f64(after.accumulation)
        u = inner.momentum * u0 + x
        lhs, rhs = u + v0, est + v1
        r1 = v1
        tol = rounding_tolerance(dtype_name, u0, x, v0, est)
    else:
        return
    both = np.isfinite(lhs) & np.isfinite(rhs)
    with np.errstate(invalid="ignore"):
        excess = np.abs(lhs - rhs) - tol
    assert (excess[both] <= 0).all(), (
        f"mass not conserved by {np.max(excess[both])}"
    )
    assert np.isfinite(r1[np.isfinite(lhs)]).all(), "residual not finite"


compressor_cases = dict(
    variant=st.sampled_from(VARIANTS),
    shape=shapes,
    dtype_name=st.sampled_from(sorted(DTYPES)),
    kind=st.sampled_from(KINDS),
    density=densities,
    rank=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1e-3, 1.0, 100.0]),
)


@property_settings(max_examples=250)
@given(**compressor_cases)
def test_every_compressor_on_hostile_input(
    monkeypatch, variant, shape, dtype_name, kind, density, rank, seed, scale
):
    """With the compiled ops."""
    backends.use("custom", monkeypatch)
    check_compressor(
        *variant, shape, dtype_name, kind, density, rank, seed, scale
    )


@property_settings(max_examples=80)
@given(**compressor_cases)
def test_every_compressor_on_hostile_input_pure_tf(
    monkeypatch, variant, shape, dtype_name, kind, density, rank, seed, scale
):
    """With the pure-TF references (slower: fewer examples)."""
    backends.use("reference", monkeypatch)
    check_compressor(
        *variant, shape, dtype_name, kind, density, rank, seed, scale
    )


@property_settings(max_examples=8)
@given(
    variant=st.sampled_from(VARIANTS),
    n=st.integers(100_000, 400_000),
    dtype_name=st.sampled_from(["float32", "bfloat16"]),
    kind=st.sampled_from(KINDS),
    density=st.sampled_from([1e-9, 1e-4, 0.01, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_large_tensors(backend, variant, n, dtype_name, kind, density, seed):
    del backend
    name, error_feedback = variant
    shape = (n // 500, 500) if name.startswith(("powersgd", "acp")) else (n,)
    check_compressor(
        name, error_feedback, shape, dtype_name, kind, density, 2, seed, 1.0
    )


HUGE = 2**24 + 3  # past float32's exact integers: counts and means in fp32


@pytest.mark.parametrize("name", ["topk", "mstopk", "randomk", "signsgd"])
def test_huge_tensor(monkeypatch, name):
    """One tensor of 2^24 + 3 elements (float16, 32 MiB), compiled ops
    (the references take seconds here): k entries at the spikes."""
    backends.use("custom", monkeypatch)
    x = np.zeros(HUGE, np.float16)
    spikes = [0, 2**24, HUGE - 1]
    x[spikes] = [3.0, -5.0, np.inf]
    # k = ceil(density n) = 3.
    c = make(name, 2.5 / HUGE, 1)
    compressor = compressors.ErrorFeedback(c)
    state = compressor.init_state(x.shape, tf.float16, _key(-1))
    total, state, payloads, estimate = run_step(
        compressor, tf.constant(x), state, 0
    )
    assert total.shape == x.shape and same_bits(total, estimate)
    residual = f64(state.residual)
    if name == "randomk":  # positions not drawn keep their values
        kept = np.ones(HUGE, bool)
        kept[c.indices(HUGE, _key(0)).numpy()] = False
        assert (~np.isfinite(residual) <= (kept & ~np.isfinite(x))).all()
    else:
        assert np.isfinite(residual).all()
    if name in ("topk", "mstopk"):
        assert sorted(payloads[0].indices.numpy()) == spikes
    if name == "randomk":
        assert payloads[0].values.shape == (3,)


# --- rejections --------------------------------------------------------------

hostile_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**400), 10**400),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
    st.lists(st.integers(0, 3), max_size=2),
    st.sampled_from(["p", "q", "threshold", "trimmed", "probe", 0.5, 2]),
)
ARGUMENTS = [
    (compressors.TopK, "density"),
    (compressors.RandomK, "density"),
    (compressors.MSTopK, "density"),
    (compressors.MSTopK, "rounds"),
    (compressors.SBC, "density"),
    (compressors.SBC, "delay"),
    (compressors.ImportancePruning, "density"),
    (compressors.ImportancePruning, "epsilon"),
    (compressors.PowerSGD, "rank"),
    (compressors.PowerSGD, "warmup_steps"),
    (compressors.ACPSGD, "rank"),
    (compressors.ACPSGD, "warmup_steps"),
    (compressors.ACPSGD, "bucket_bytes"),
    (compressors.ACPSGD, "factor"),
    (compressors.RedSync, "density"),
    (compressors.RedSync, "momentum"),
    (compressors.RedSync, "selection"),
    (compressors.RedSync, "rounds"),
    (compressors.RedSync, "warmup_steps"),
    (compressors.RedSync, "cost_model"),
    (compressors.RedSync, "density_warmup_steps"),
    (compressors.RedSync, "clipnorm"),
    (functools.partial(compressors.CostModel, 1e-4, 1e9), "select_time"),
    (functools.partial(compressors.CostModel, 1e-4, 1e9), "scatter_time"),
    (functools.partial(compressors.CostModel, bandwidth=1e9), "latency"),
    (functools.partial(compressors.CostModel, 1e-4), "bandwidth"),
]


@property_settings(max_examples=400)
@given(argument=st.sampled_from(ARGUMENTS), value=hostile_values)
def test_bad_arguments_are_named(argument, value):
    """Any value: accepted (and the compressor then works on a small
    tensor and survives a config round trip), or a ValueError naming the
    argument and the value received."""
    cls, arg = argument
    try:
        compressor = cls(**{arg: value})
    except ValueError as e:
        message = str(e)
        assert f"`{arg}`" in message and f"{arg}=" in message, message
        return
    if isinstance(compressor, compressors.CostModel):
        return
    if isinstance(compressor, compressors.RedSync):
        assert (
            compressor.cost_model != "probe"
            or arg != "cost_model"
            or (value == "probe")
        )
        compressor = compressors.RedSync(
            **{**compressor.get_config(), "cost_model": None}
        )
    restored = type(compressor).from_config(compressor.get_config())
    assert restored == compressor
    check_compressor_quick(compressor)


def check_compressor_quick(compressor):
    shape = (6, 5)
    x = tf.constant(gradient(shape, "float32", "normal", 0, 1.0))
    state = compressor.init_state(shape, tf.float32, _key(-1))
    total, _, _, estimate = run_step(compressor, x, state, 0)
    assert total.shape == shape and same_bits(total, estimate)


@pytest.mark.parametrize("name", sorted(NO_FLOAT64))
@pytest.mark.parametrize("dtype", [tf.float64, tf.int32, tf.complex64])
def test_unsupported_dtype_is_named_with_the_fix(name, dtype):
    """Refused when the state is made (the optimizer's build) and when
    compressing, naming the dtype and what to use instead."""
    compressor = make(name, 0.1, 1)
    for call in (
        lambda: compressor.init_state((4,), dtype, _key(-1)),
        lambda: compressor.compress(tf.zeros((4,), dtype), (), _key(0)),
    ):
        with pytest.raises(ValueError) as raised:
            call()
        message = str(raised.value)
        assert "`dtype`" in message and dtype.name in message
        assert "float32" in message
