"""`tfgc.ops.fused_update` (`Tfgc>FusedUpdate`): the update of many
variables in one op, bit for bit Keras's own update step for every rule,
in eager mode and in a `tf.function`; its checks; copy on write."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgc.ops import fused_update as fu

pytestmark = pytest.mark.skipif(
    not fu.available(), reason="the compiled op library is not built"
)

# Shapes of a small network: empty, scalar-like, odd, and one large enough
# to be cut into chunks on several threads.
SHAPES = [(3, 5), (7,), (0, 4), (1,), (300, 257), (70_001,)]

OPTIMIZERS = {
    "sgd": (lambda: keras.optimizers.SGD(0.1), "sgd"),
    "momentum": (lambda: keras.optimizers.SGD(0.1, momentum=0.9), "momentum"),
    "nesterov": (
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
        "nesterov",
    ),
    "adam": (lambda: keras.optimizers.Adam(1e-3), "adam"),
    "adamw": (
        lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.004),
        "adam",
    ),
    "sgd_decay": (
        lambda: keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=0.01),
        "momentum",
    ),
}


def _values(seed):
    rng = np.random.default_rng(seed)
    values = [rng.normal(0, 0.1, s).astype(np.float32) for s in SHAPES]
    # Values whose updates underflow, and exact zeros.
    values[1][:3] = [1e-38, -1e-39, 0.0]
    return values


def _gradients(steps, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        grads = [rng.normal(0, 1e-2, s).astype(np.float32) for s in SHAPES]
        grads[1][3:5] = [3e-39, -2e-20]
        out.append([tf.constant(g) for g in grads])
    return out


def _slots(optimizer, rule, variables):
    index = optimizer._get_variable_index
    if rule == "sgd":
        return []
    if rule == "adam":
        return [
            [optimizer._momentums[index(v)].value for v in variables],
            [optimizer._velocities[index(v)].value for v in variables],
        ]
    return [[optimizer.momentums[index(v)].value for v in variables]]


def _scalars(optimizer, rule):
    """As Keras's update step computes them."""
    lr = keras.ops.cast(optimizer.learning_rate, "float32")
    if rule == "sgd":
        scalars = [lr]
    elif rule == "adam":
        step = keras.ops.cast(optimizer.iterations + 1, "float32")
        b1 = keras.ops.power(keras.ops.cast(optimizer.beta_1, "float32"), step)
        b2 = keras.ops.power(keras.ops.cast(optimizer.beta_2, "float32"), step)
        alpha = lr * keras.ops.sqrt(1 - b2) / (1 - b1)
        scalars = [
            alpha,
            1 - optimizer.beta_1,
            1 - optimizer.beta_2,
            optimizer.epsilon,
        ]
    else:
        scalars = [lr, optimizer.momentum]
    if optimizer.weight_decay is not None:
        scalars += [optimizer.weight_decay, lr]
    return scalars


def _fused_step(optimizer, rule, variables, grads):
    fu.fused_update(
        rule,
        [v.value for v in variables],
        _slots(optimizer, rule, variables),
        grads,
        _scalars(optimizer, rule),
        weight_decay=optimizer.weight_decay is not None,
    )
    optimizer._iterations.assign_add(1)


@contextlib.contextmanager
def written_order():
    """Grappler's arithmetic optimizer off: in a `tf.function` it may
    reassociate Keras's weight decay `w * wd * lr` into `w * (wd * lr)`
    (its broadcast-minimising stage), so Keras's compiled step can differ
    from its eager one by an ulp; the fused update computes in the order
    Keras's code writes (docs/algorithms.md, "The fused update")."""
    previous = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options(
        {"arithmetic_optimization": False}
    )
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": True, **previous}
        )


def _bits(variables):
    return [v.numpy().view(np.int32) for v in variables]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_rule_is_keras_update_bit_for_bit(name, graph):
    make, rule = OPTIMIZERS[name]
    start = _values(0)
    keras_vars = [keras.Variable(v) for v in start]
    fused_vars = [keras.Variable(v) for v in start]
    keras_opt, fused_opt = make(), make()
    keras_opt.build(keras_vars)
    fused_opt.build(fused_vars)

    def keras_step(grads):
        keras_opt.apply(grads, keras_vars)

    def fused_step(grads):
        _fused_step(fused_opt, rule, fused_vars, grads)

    if graph:
        keras_step, fused_step = (
            tf.function(keras_step),
            tf.function(fused_step),
        )
    for grads in _gradients(4, 1):
        with written_order():
            keras_step(grads)
        fused_step(grads)
        for a, b in zip(_bits(keras_vars), _bits(fused_vars)):
            np.testing.assert_array_equal(a, b)
    # The slots too, and the weights moved.
    for a, b in zip(keras_opt.variables, fused_opt.variables):
        np.testing.assert_array_equal(
            np.atleast_1d(a.numpy()).view(np.uint8),
            np.atleast_1d(b.numpy()).view(np.uint8),
        )
    assert not np.array_equal(keras_vars[4].numpy(), start[4])


def test_a_value_read_before_the_update_keeps_its_bits():
    """Copy on write: a read that is still alive when the op runs sees the
    old value, as after TensorFlow's own update ops."""
    variable = tf.Variable(np.arange(5, dtype=np.float32))
    before = variable.read_value()
    fu.fused_update("sgd", [variable], [], [tf.ones([5])], [0.5])
    np.testing.assert_array_equal(before.numpy(), np.arange(5))
    np.testing.assert_array_equal(variable.numpy(), np.arange(5) - 0.5)


def test_no_variables_is_a_no_op():
    fu.fused_update("adam", [], [[], []], [], [1.0, 0.1, 0.001, 1e-7])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rule="adamax"), "`rule` must be one of"),
        (dict(slots=[]), "takes 1 slot list"),
        (dict(scalars=[0.1]), "2 scalars"),
        (dict(gradients=[]), "one gradient per variable"),
    ],
)
def test_wrong_arguments_say_what_the_rule_takes(kwargs, match):
    variable, momentum = tf.Variable([1.0, 2.0]), tf.Variable([0.0, 0.0])
    args = dict(
        rule="momentum",
        variables=[variable],
        slots=[[momentum]],
        gradients=[tf.ones([2])],
        scalars=[0.1, 0.9],
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fu.fused_update(**args)


def test_a_gradient_of_another_shape_is_refused_with_both_shapes():
    variable = tf.Variable(tf.zeros([2, 3]))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"\[2,3\].*gradients\[0\].*\[6\]"
    ):
        fu.fused_update("sgd", [variable], [], [tf.ones([6])], [0.1])
    np.testing.assert_array_equal(variable.numpy(), np.zeros([2, 3]))


def test_a_float64_variable_is_refused():
    variable = tf.Variable(tf.zeros([2], tf.float64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="dtype"):
        fu.fused_update("sgd", [variable], [], [tf.ones([2])], [0.1])
