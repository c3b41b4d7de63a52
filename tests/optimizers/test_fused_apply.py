"""The inner optimizer's update through one fused op per bucket
(`CompressedOptimizer(fused_update=True)`, `tfgc.optimizers.fused_apply`):
training gives the weights of Keras's own update bit for bit, one op runs
per bucket, and what the fused rule cannot stand in for keeps Keras's
update."""

from unittest import mock

import keras
import numpy as np
import pytest

import tfgc
from tests.ops.test_fused_update import written_order
from tfgc.ops import fused_update as fused_update_op
from tfgc.optimizers import fused_apply

pytestmark = pytest.mark.skipif(
    not fused_update_op.available(),
    reason="the compiled op library is not built",
)


def _adamw_without_bias_decay():
    opt = keras.optimizers.AdamW(1e-2, weight_decay=0.05)
    opt.exclude_from_weight_decay(var_names=["bias"])
    return opt


INNER = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(1e-2),
    "adamw_excluding_bias": _adamw_without_bias_decay,
    "sgd_clipnorm_decay": lambda: keras.optimizers.SGD(
        0.1, momentum=0.9, clipnorm=0.05, weight_decay=0.01
    ),
    "adam_clipvalue_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(1e-2, 2, 0.5),
        clipvalue=1e-3,
    ),
}


def _fit(strategy, make_inner, fused, compressor="topk", bucket_bytes=600):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 12)).astype("float32")
    y = rng.integers(0, 4, size=64)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((12,)),
                keras.layers.Dense(
                    32,
                    activation="relu",
                    kernel_constraint=keras.constraints.MaxNorm(0.5),
                ),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
        opt = tfgc.CompressedOptimizer(
            make_inner(),
            compressor=compressor,
            min_compress_size=0,
            bucket_bytes=bucket_bytes,
            fused_update=fused,
        )
        model.compile(
            opt,
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    with written_order():
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights], opt


def _fit_counting(*args, **kwargs):
    """`_fit`, and the number of variables of every fused op traced."""
    sizes = []
    original = fused_update_op.fused_update

    def counted(rule, variables, *more, **options):
        sizes.append(len(variables))
        return original(rule, variables, *more, **options)

    with mock.patch.object(fused_update_op, "fused_update", counted):
        return _fit(*args, **kwargs), sizes


@pytest.mark.parametrize("name", sorted(INNER))
def test_fused_training_is_keras_update_bit_for_bit(mirrored, name):
    """Four replicas, TopK in buckets of 600 bytes: the weights, slots and
    step counter after two epochs are those of Keras's own update."""
    (fused, fused_opt), calls = _fit_counting(mirrored, INNER[name], True)
    keras_weights, keras_opt = _fit(mirrored, INNER[name], False)
    assert calls, "the fused op was not used"
    assert fused_opt._fusion.rule is not None
    for a, b in zip(fused, keras_weights):
        np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
    for a, b in zip(
        fused_opt.inner_optimizer.variables, keras_opt.inner_optimizer.variables
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_one_fused_op_per_bucket(mirrored):
    """Six variables in buckets of 600 bytes, from the last: the last
    layer's bias and kernel with the second's bias (336 bytes), then the
    second kernel, the first bias and the first kernel alone: four ops per
    replica, every variable in exactly one."""
    _, sizes = _fit_counting(mirrored, INNER["momentum"], True, "identity")
    replicas = mirrored.num_replicas_in_sync
    # Traced once per replica (and possibly again for the last partial
    # batch): whole traces of four ops each.
    assert len(sizes) % (4 * replicas) == 0
    assert sizes[:4] == [3, 1, 1, 1]


def test_without_buckets_one_op_updates_everything(mirrored):
    _, sizes = _fit_counting(mirrored, INNER["adam"], True, bucket_bytes=None)
    assert set(sizes) == {6}


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: keras.optimizers.RMSprop(0.1), "RMSprop has no fused rule"),
        (lambda: keras.optimizers.Adam(amsgrad=True), "amsgrad"),
        (
            lambda: keras.optimizers.SGD(global_clipnorm=1.0),
            "global_clipnorm is set",
        ),
        (lambda: keras.optimizers.Adam(use_ema=True), "use_ema is set"),
        (
            lambda: keras.optimizers.SGD(loss_scale_factor=8.0),
            "loss_scale_factor is set",
        ),
    ],
)
def test_what_has_no_fused_rule_keeps_keras_update(make, reason):
    variables = [keras.Variable(np.ones([3], "float32"))]
    optimizer = make()
    optimizer.build(variables)
    fusion = fused_apply.Fusion.of(optimizer, variables)
    assert fusion.rule is None
    assert reason in fusion.reason


def test_subclasses_and_other_dtypes_keep_keras_update():
    class MySGD(keras.optimizers.SGD):
        pass

    one = [keras.Variable(np.ones([3], "float32"))]
    assert fused_apply.Fusion.of(MySGD(0.1), one).rule is None
    half = [keras.Variable(np.ones([3], "float16"), dtype="float16")]
    fusion = fused_apply.Fusion.of(keras.optimizers.SGD(0.1), half)
    assert fusion.rule is None and "float16" in fusion.reason
    assert fused_apply.Fusion.of(keras.optimizers.SGD(0.1), one).rule == "sgd"


def test_fused_update_is_checked_and_saved():
    opt = tfgc.CompressedOptimizer(
        keras.optimizers.SGD(0.1), "topk", fused_update=False
    )
    assert opt.get_config()["fused_update"] is False
    assert not tfgc.CompressedOptimizer.from_config(
        opt.get_config()
    ).fused_update
    with pytest.raises(ValueError, match="`fused_update` must be"):
        tfgc.CompressedOptimizer(
            keras.optimizers.SGD(0.1), "topk", fused_update="yes"
        )


def test_buckets_that_leave_out_indices_are_completed():
    assert fused_apply.covering(None, 3) == [[0, 1, 2]]
    assert fused_apply.covering([[2], [0]], 3) == [[2], [0], [1]]
    assert fused_apply.covering([[1, 0]], 2) == [[1, 0]]
