"""Strict arguments: booleans as booleans, numbers as numbers, unknown
keywords named with the closest valid one (tfgc/_arguments.py)."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest

import tfgc
from tfgc import compressors as c


def _sgd():
    return keras.optimizers.SGD(0.1)


@pytest.mark.parametrize(
    "make, match",
    [
        # bool("false") is True: the string used to turn error feedback on.
        (
            lambda: tfgc.CompressedOptimizer(_sgd(), error_feedback="false"),
            "`error_feedback` must be a bool. Received: "
            "error_feedback='false' (a str). Pass error_feedback=False.",
        ),
        (
            lambda: tfgc.CompressedOptimizer(_sgd(), error_feedback=1),
            "Received: error_feedback=1 (a int). Pass True or False.",
        ),
        (
            lambda: c.SBC(binarize="False"),
            "Received: binarize='False' (a str). Pass binarize=False.",
        ),
        (lambda: c.SignSGD(scaled="yes"), "`scaled` must be a bool."),
        (
            lambda: c.TopK(batch_selection=1),
            "`batch_selection` must be a bool. Received: batch_selection=1 "
            "(a int). Pass True or False (or None).",
        ),
    ],
)
def test_booleans_only_as_booleans(make, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        # Accepted as 0.01 before, where rank="2" was refused.
        (lambda: c.TopK(density="0.01"), "density='0.01'"),
        (lambda: c.RandomK(density="0.01"), "density='0.01'"),
        (lambda: c.MSTopK(density="0.01"), "density='0.01'"),
        (lambda: c.RedSync(density="0.01"), "density='0.01'"),
        (lambda: c.SBC(density="0.01"), "density='0.01'"),
        (lambda: c.ImportancePruning(density="0.01"), "density='0.01'"),
        (lambda: c.get("topk", density="0.01"), "density='0.01'"),
        (lambda: c.PowerSGD(rank="2"), "rank='2'"),
        (lambda: c.ACPSGD(bucket_bytes="1024"), "bucket_bytes='1024'"),
        (lambda: c.MSTopK(rounds="8"), "rounds='8'"),
        (lambda: c.SBC(delay=2.0), "delay=2.0"),
        (lambda: c.RedSync(momentum="0.9", cost_model=None), "momentum='0.9'"),
        (lambda: c.ImportancePruning(epsilon="1e-8"), "epsilon='1e-8'"),
        (lambda: c.CostModel(latency="1e-5", bandwidth=1e9), "latency='1e-5'"),
        (lambda: c.CostModel(latency=1e-5, bandwidth=True), "bandwidth=True"),
        (
            lambda: tfgc.CompressedOptimizer(_sgd(), min_compress_size="10"),
            "min_compress_size='10'",
        ),
        (lambda: tfgc.CompressedOptimizer(_sgd(), seed="1"), "seed='1'"),
        (
            lambda: tfgc.communicators.Hierarchical(workers_per_host="2"),
            "workers_per_host='2'",
        ),
    ],
)
def test_numbers_only_as_numbers(make, match):
    with pytest.raises(ValueError, match=re.escape(match)) as err:
        make()
    text = str(err.value)
    # The message names the argument and, for a numeric string, the fix.
    name, _, value = match.partition("=")
    assert text.startswith(f"`{name}` must be"), text
    if value.startswith("'"):
        assert "Pass a number, not a string:" in text, text


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: tfgc.CompressedOptimizer(_sgd(), error_feedbak=False),
            "CompressedOptimizer got an unexpected keyword argument "
            "'error_feedbak'. Did you mean 'error_feedback'?",
        ),
        (
            lambda: c.TopK(densty=0.1),
            "TopK got an unexpected keyword argument 'densty'. Did you mean "
            "'density'?",
        ),
        (
            lambda: c.get("topk", densty=0.1),
            "TopK got an unexpected keyword argument 'densty'. Did you mean "
            "'density'?",
        ),
        (
            lambda: c.get("powersgd", rnak=2),
            "PowerSGD got an unexpected keyword argument 'rnak'. Did you "
            "mean 'rank'?",
        ),
        (
            lambda: c.CostModel(latncy=1e-5, bandwidth=1e9),
            "CostModel got an unexpected keyword argument 'latncy'. Did you "
            "mean 'latency'?",
        ),
        (
            lambda: tfgc.communicators.Hierarchical(workers_per_hst=2),
            "Hierarchical got an unexpected keyword argument "
            "'workers_per_hst'. Did you mean 'workers_per_host'?",
        ),
        (
            lambda: c.TopK(colour="red"),
            "TopK got an unexpected keyword argument 'colour'. Valid "
            "keyword arguments: density, batch_selection.",
        ),
    ],
)
def test_unknown_keywords_name_the_closest_valid_one(make, message):
    with pytest.raises(TypeError) as err:
        make()
    assert str(err.value) == message


def test_misplaced_inner_optimizer_argument_still_says_where_it_goes():
    with pytest.raises(ValueError, match="Set them on the inner optimizer"):
        tfgc.CompressedOptimizer(_sgd(), learning_rate=0.1)


def test_unknown_compressor_name_suggests_the_closest():
    with pytest.raises(ValueError, match="Did you mean 'powersgd'?"):
        c.get("powersdg")


def test_valid_arguments_still_work():
    # Python and numpy numbers and booleans are numbers and booleans.
    assert c.TopK(density=np.float32(0.05)).density == pytest.approx(0.05)
    assert c.TopK(density=1).density == 1.0
    assert c.TopK(batch_selection=None).batch_selection is None
    assert c.TopK(batch_selection=np.bool_(True)).batch_selection is True
    assert c.get("topk", density=0.05).get_config()["density"] == 0.05
    assert c.PowerSGD(rank=np.int64(2)).rank == 2
    assert c.SBC(density=0.1, delay=2, binarize=False).binarize is False
    assert c.SignSGD(scaled=False).scaled is False
    assert c.RedSync(momentum=0, cost_model=None).momentum == 0.0
    assert c.ImportancePruning(epsilon=1e-6).epsilon == 1e-6
    model = c.CostModel(latency=0, bandwidth=np.float64(1e9))
    assert model.bandwidth == 1e9
    assert c.RedSync(cost_model={"latency": 1e-5, "bandwidth": 1e9})
    opt = tfgc.CompressedOptimizer(
        _sgd(),
        "topk",
        error_feedback=np.bool_(False),
        min_compress_size=np.int32(0),
        seed=3,
    )
    assert opt.error_feedback is False
    assert opt.min_compress_size == 0 and opt.seed == 3
    # The config round trip keeps the types.
    again = tfgc.CompressedOptimizer.from_config(opt.get_config())
    assert again.error_feedback is False
    assert again.compressor.density == 0.01


def test_every_compression_stats_key_is_documented():
    w = keras.Variable(np.zeros((64, 32), "float32"))
    opt = tfgc.CompressedOptimizer(_sgd(), "topk", min_compress_size=0)
    opt.build([w])
    keys = opt.compression_stats().keys()
    assert len(keys) == 8
    for key in keys:
        assert f"`{key}`" in tfgc.callbacks.CompressionStats.__doc__, key
        assert f"`{key}`" in tfgc.CompressedOptimizer.compression_stats.__doc__
