"""FP16 and BF16 by value: the nearest 16-bit number on the wire, the
16-bit sum of every replica's over the real all-reduce.

The expected values are written out by hand for the edge cases (ties,
subnormals of the 16-bit type, values too small for it, overflow) and come
from the numpy roundings of tests/numpy_reference.py for random data.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests import numpy_reference as ref
from tfgc.core.compressor import NoState

INF = np.inf
# (input, the nearest float16 / bfloat16): ties go to the even neighbour;
# past the largest finite value (65504 / 3.3895314e38) by half a step or
# more is inf.
EDGE_CASES = {
    "float16": [
        (1.0, 1.0),
        (-2.5, -2.5),
        (1 + 2**-11, 1.0),  # tie, down to even
        (1 + 3 * 2**-11, 1 + 2**-9),  # tie, up to even
        (1e-6, 17 * 2**-24),  # subnormal: multiples of 2^-24
        (-(2**-24), -(2**-24)),  # the smallest subnormal
        (1.5 * 2**-25, 2**-24),
        (2**-25, 0.0),  # tie with 0
        (2**-26, 0.0),  # too small
        (2**-14, 2**-14),  # the smallest normal
        (65504.0, 65504.0),  # the largest
        (65519.0, 65504.0),
        (65520.0, INF),  # overflow
        (-1e5, -INF),
        (3e38, INF),
    ],
    "bfloat16": [
        (1.0, 1.0),
        (-2.5, -2.5),
        (1 + 2**-8, 1.0),  # tie, down to even
        (1 + 3 * 2**-8, 1 + 2**-6),  # tie, up to even
        (3.0e-39, 33 * 2.0**-133),  # float32 subnormal: multiples of 2^-133
        (2.0**-133, 2.0**-133),  # the smallest subnormal
        (2.0**-134, 0.0),  # tie with 0
        (2.0**-126, 2.0**-126),  # the smallest normal
        (65520.0, 65536.0),  # no overflow where float16 overflows
        (3.3895314e38, 3.3895314e38),  # the largest
        (3.4e38, INF),  # overflow
        (-np.finfo(np.float32).max, -INF),
    ],
}
CASTS = {"float16": tfgc.compressors.FP16, "bfloat16": tfgc.compressors.BF16}


def _edge_cases(dtype):
    x, want = zip(*EDGE_CASES[dtype])
    return np.array(x, np.float32), np.array(want, np.float32)


@pytest.mark.parametrize("dtype", list(CASTS))
def test_edge_cases_of_the_numpy_roundings(dtype):
    """The oracle the other checks trust, against the table."""
    x, want = _edge_cases(dtype)
    rounding, _ = ref.CASTS[dtype]
    np.testing.assert_array_equal(rounding(x), want)


@pytest.mark.parametrize("dtype", list(CASTS))
def test_cast_round_trip_is_the_nearest_16_bit_value(dtype):
    """compress sends the nearest 16-bit value; decompress of one worker's
    payload and local_estimate give it back as float32."""
    compressor = CASTS[dtype]()
    x, want = _edge_cases(dtype)
    rounding, _ = ref.CASTS[dtype]
    rng = np.random.default_rng(0)
    scales = 10.0 ** rng.integers(-6, 5, size=1000)
    bulk = (rng.standard_normal(1000) * scales).astype(np.float32)
    x, want = np.concatenate([x, bulk]), np.concatenate([want, rounding(bulk)])
    key = tf.constant([0, 0], tf.int64)
    payload, ctx = compressor.compress(tf.constant(x), NoState(), key)
    assert payload.values.dtype == tf.as_dtype(dtype)
    sent = tf.cast(payload.values, tf.float32).numpy()
    np.testing.assert_array_equal(sent, want)
    total, _ = compressor.decompress(payload, ctx)
    assert total.dtype == tf.float32
    np.testing.assert_array_equal(total.numpy(), want)
    np.testing.assert_array_equal(
        compressor.local_estimate(payload, ctx).numpy(), want
    )


# Per replica r (columns), with a sum that no order of addition changes:
# (inputs, the 16-bit sum). TF flushes float32 subnormals to zero in
# arithmetic (x + x is 0 for x = 2^-133), so bfloat16's subnormals, which
# are float32's, are checked in the round trip above only.
EXACT_SUMS = {
    "float16": [
        ([(r + 1) * 2**-24 for r in range(4)], 10 * 2**-24),  # subnormals
        ([2**-26] * 4, 0.0),  # each rounds to 0 (float32 would sum 2^-24)
        ([2e4] * 4, INF),  # overflow in the sum
        ([-2e4] * 4, -INF),
        ([1e5, 1.0, 1.0, 1.0], INF),  # overflow in one cast
        ([1 + 2**-11] * 4, 4.0),  # rounded before the sum
    ],
    "bfloat16": [
        ([(r + 1) * 2.0**-120 for r in range(4)], 10 * 2.0**-120),
        ([1.5e38] * 4, INF),  # overflow in the sum
        ([-1.5e38] * 4, -INF),
        ([3.4e38, 1.0, 1.0, 1.0], INF),  # overflow in one cast
        ([1 + 2**-8] * 4, 4.0),  # rounded before the sum
        ([1e5, 1.0, 1.0, 1.0], 99840.0),  # float16 would overflow
    ],
}


def _one_step_total(strategy, compressor, grads):
    """What `CompressedOptimizer(SGD(1), compressor)` adds to zero weights
    in one step where replica r feeds grads[r] (no error feedback)."""
    with strategy.scope():
        w = keras.Variable(np.zeros(grads.shape[1], np.float32))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(1.0),
            compressor=compressor,
            error_feedback=False,
            min_compress_size=0,
        )
        opt.build([w])
    assert [type(p.compressor) for p in opt._plans] == [type(compressor)]
    per_replica = tf.constant(grads)

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            opt.apply([tf.gather(per_replica, r)], [w])

        strategy.run(replica_fn)

    step()
    copies = [v.numpy() for v in w.value.values]
    for c in copies[1:]:
        np.testing.assert_array_equal(c, copies[0])
    return -copies[0]


@pytest.mark.parametrize("dtype", list(CASTS))
def test_cast_total_over_replicas_is_the_16_bit_sum(mirrored, dtype):
    """Four replicas with their own data, through the real all-reduce: the
    edge cases exactly, random data within the rounding of a 16-bit sum
    in any order (the exact sum of the rounded inputs, off by at most
    (p - 1) roundings of partial sums)."""
    p = mirrored.num_replicas_in_sync
    assert p == 4
    columns, sums = zip(*EXACT_SUMS[dtype])
    exact = np.array(columns, np.float32).T  # [p, cases]
    rng = np.random.default_rng(1)
    scales = 10.0 ** rng.integers(-3, 4, size=(p, 2000))
    bulk = (rng.standard_normal((p, 2000)) * scales).astype(np.float32)
    total = _one_step_total(
        mirrored, CASTS[dtype](), np.concatenate([exact, bulk], axis=1)
    )
    np.testing.assert_array_equal(total[: exact.shape[1]], sums)
    rounding, unit = ref.CASTS[dtype]
    rounded = rounding(bulk).astype(np.float64)
    bound = 2 * (p - 1) * unit * np.abs(rounded).sum(axis=0)
    error = np.abs(total[exact.shape[1] :] - rounded.sum(axis=0))
    assert np.all(error <= bound), np.max(error - bound)
