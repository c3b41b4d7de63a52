"""The compressor overhead benchmark's run specs (the timing itself is the
benchmark's; tests/benchmarks/test_common_timing.py checks the helper)."""

import pytest
import tensorflow as tf

from benchmarks import compressor_overhead as overhead
from tfgc import compressors


def test_run_spec_names_density_arguments_and_the_generic_path():
    assert overhead.parse_run("sbc@0.001:delay=4,binarize=false!generic") == (
        "sbc",
        {"density": 0.001, "delay": 4, "binarize": False},
        True,
    )
    assert overhead.parse_run("topk") == ("topk", {}, False)


def test_generic_run_turns_the_fused_path_off_for_that_instance_only():
    x = tf.random.normal([400])
    residual = tf.zeros([400])
    generic = overhead.compressor("sbc", {"density": 0.01}, True)
    fused = overhead.compressor("sbc", {"density": 0.01}, False)
    assert isinstance(generic, compressors.SBC)
    assert generic.compress_with_residual(x, residual, (), None) is None
    assert fused.compress_with_residual(x, residual, (), None) is not None


def test_unknown_compressor_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        overhead.main(["--runs", "topk nosuch", "--out", "/nonexistent/x"])
    assert exit_info.value.code == 2
    assert "nosuch" in capsys.readouterr().err
