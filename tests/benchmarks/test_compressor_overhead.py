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


@pytest.mark.parametrize(
    "name, part",
    [
        ("cond_1/then/_23/cond_1/tfgc_bucket_0/tfgc_exchange/add", "exchange"),
        ("gradient_tape/functional_1/dense1_1/MatMul/MatMul", "backward"),
        ("functional_1/dense1_1/MatMul", "forward"),
        ("sgd/Tfgc>FusedUpdate", "optimizer"),
    ],
)
def test_ops_are_put_in_the_part_of_the_step_their_name_says(name, part):
    assert overhead.part_of(name) == part


def test_profile_attributes_op_time_to_parts_and_op_types():
    a = tf.random.normal([256, 256])

    @tf.function
    def step():
        with tf.name_scope("gradient_tape"):
            product = tf.linalg.matmul(a, a)
        return tf.reduce_sum(tf.abs(product))

    times = overhead.op_times(step, steps=3)
    matmuls = [k for k in times if k.startswith("backward/") and "MatMul" in k]
    assert matmuls, times
    assert times[matmuls[0]] > 0
    assert not [k for k in times if k.endswith("/Process")], times
    assert list(times.values()) == sorted(times.values(), reverse=True)
    lines = overhead.profile_lines({"floor": times}, rows=1)
    assert f"| {next(iter(times))} |" in "\n".join(lines)
    assert lines[-1].startswith("| all | ")
