"""Tests of tfgc.ops.subtract_at and zero_at: the bits of the
`tf.tensor_scatter_nd_update` they stand for, in every float dtype, with
values that are not finite, eagerly, in a graph and under XLA; the
buffer-reusing op only where it gives those bits."""

import numpy as np
import pytest
import tensorflow as tf

from tfgc import ops

DTYPES = [tf.float32, tf.float16, tf.bfloat16, tf.float64]
MODES = {
    "eager": lambda f: f,
    "graph": tf.function,
    "xla": lambda f: tf.function(f, jit_compile=True),
}
UINT = {2: tf.uint16, 4: tf.uint32, 8: tf.uint64}


def bits(t):
    return tf.bitcast(t, UINT[t.dtype.size]).numpy()


def case(dtype, seed=0, n=4000, k=300):
    """Entries over 16 orders of magnitude (with +-0 and subnormals of
    float32), distinct indices and values of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n) * 10.0 ** rng.integers(-40, 8, n)
    x[:4] = [0.0, -0.0, 1e-42, -1e-44]
    indices = np.concatenate([[0, 1, 2, 3], 4 + rng.permutation(n - 4)])[:k]
    values = rng.normal(size=k)
    values[:2] = [0.0, -0.0]
    # Some values equal to their entry: the difference is +0 either way.
    values[4:8] = x[indices[4:8]]
    return (
        tf.cast(x, dtype),
        tf.constant(indices, tf.int32),
        tf.cast(values, dtype),
    )


def subtract_reference(x, indices, values):
    kept = tf.where(
        tf.math.is_finite(values),
        tf.gather(x, indices) - values,
        tf.zeros_like(values),
    )
    return tf.tensor_scatter_nd_update(x, indices[:, None], kept)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("special", [None, np.inf, -np.inf, np.nan])
def test_subtract_at_writes_the_bits_of_the_scatter(mode, dtype, special):
    x, indices, values = case(dtype)
    if special is not None:
        # One value that is not finite: 0 there, the rest subtracted.
        values = tf.tensor_scatter_nd_update(
            values, [[9]], tf.constant([special], dtype)
        )
    out = MODES[mode](ops.subtract_at)(x, indices, values)
    np.testing.assert_array_equal(
        bits(out), bits(subtract_reference(x, indices, values))
    )
    if special is not None:
        assert float(out[int(indices[9])]) == 0.0


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("special", [None, np.inf, np.nan])
def test_zero_at_writes_plus_zero_and_leaves_the_rest(mode, dtype, special):
    x, indices, _ = case(dtype, seed=1)
    if special is not None:
        # An entry that is not finite among the zeroed ones.
        x = tf.tensor_scatter_nd_update(
            x, indices[5:6, None], tf.constant([special], dtype)
        )
    out = MODES[mode](ops.zero_at)(x, indices)
    expected = tf.tensor_scatter_nd_update(
        x, indices[:, None], tf.zeros(indices.shape, dtype)
    )
    np.testing.assert_array_equal(bits(out), bits(expected))


def _op_types(f, *args):
    graph = tf.function(f).get_concrete_function(*args).graph
    types = set()
    for op in graph.get_operations():
        types.add(op.type)
        for name in ("then_branch", "else_branch"):
            if name in op.node_def.attr:
                branch = graph._get_function(op.get_attr(name).name)
                types |= {o.type for o in branch.graph.get_operations()}
    return types


def test_the_buffer_reusing_op_runs_unless_a_value_is_not_finite():
    """The addition is the branch taken when every value is finite (the
    copy otherwise); without the custom library too: it is TensorFlow's."""
    x, indices, values = case(tf.float32)
    types = _op_types(ops.subtract_at, x, indices, values)
    assert {"ScatterNdNonAliasingAdd", "TensorScatterUpdate"} <= types
    assert "ScatterNdNonAliasingAdd" in _op_types(ops.zero_at, x, indices)
