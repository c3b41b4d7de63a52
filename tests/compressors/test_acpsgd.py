"""ACP-SGD in one process: P and Q alternate with one factor sent per step,
the dense warm-up (shared with PowerSGD), buckets of about bucket_bytes,
bad arguments. Against numpy on real workers:
tests/multiworker/test_paper_algorithms.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tests.compressors.common import heavy_tailed, replica_copies
from tests.conftest import NUM_LOGICAL_CPUS
from tfgc import compressors
from tfgc.communicators import exchange


def test_acpsgd_alternates_p_and_q_and_sends_one_factor(mirrored):
    p = NUM_LOGICAL_CPUS
    shape = (60, 24)
    with mirrored.scope():
        w = keras.Variable(np.zeros(shape, "float32"))
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(1.0),
            compressors.ACPSGD(rank=3),
            min_compress_size=0,
        )
        opt.build([w])
    state = opt._plans[0].state_variables  # residual, p, q, p_steps, q_steps

    def grads(s):
        return [heavy_tailed(shape, 10 * s + r, df=3) for r in range(p)]

    @tf.function
    def step(s):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.switch_case(
                r, [lambda i=i: tf.constant(grads(s)[i]) for i in range(p)]
            )
            opt.apply([g], [w])

        mirrored.run(replica_fn)

    def local(variable):
        return replica_copies(variable)[0]

    q0 = local(state[2])
    step(0)  # P step: P = (M + E) orth(Q); the factors' sum is the sum's
    orth_q = np.linalg.qr(q0)[0]
    summed = sum(grads(0))
    np.testing.assert_allclose(local(state[1]), summed @ orth_q, rtol=2e-4)
    np.testing.assert_array_equal(local(state[2]), q0)
    assert (int(local(state[3])), int(local(state[4]))) == (1, 0)
    assert opt.compression_stats()["sent_bytes"] == 60 * 3 * 4
    p_sum = local(state[1])
    step(1)  # Q step: Q = (M + E)^T orth(P_sum)
    assert (int(local(state[3])), int(local(state[4]))) == (1, 1)
    np.testing.assert_array_equal(local(state[1]), p_sum)
    assert opt.compression_stats()["sent_bytes"] == 24 * 3 * 4
    # Residuals differ per worker (local error feedback).
    residuals = replica_copies(state[0])
    assert not np.allclose(residuals[0], residuals[1])


def _two_steps(compressor):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(40)])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 64)).astype("float32")
    y = rng.normal(size=(64, 40)).astype("float32")
    opt = keras.optimizers.SGD(0.1)
    if compressor is not None:
        opt = tfgc.CompressedOptimizer(opt, compressor)
    model.compile(opt, "mse", jit_compile=False)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize("cls", [compressors.ACPSGD, compressors.PowerSGD])
def test_acpsgd_and_powersgd_warm_up_dense(cls):
    dense = _two_steps(None)
    for a, b in zip(_two_steps(cls(rank=2, warmup_steps=2)), dense):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    compressed = _two_steps(cls(rank=2))
    assert not np.allclose(compressed[0], dense[0], atol=1e-4)


def test_buckets_hold_about_bucket_bytes_from_the_last_tensor():
    """Dense tensors count whole, the compressed one by its factor."""
    tensors = [tf.zeros([n]) for n in (100, 300, 50, 200)] + [
        tf.zeros([10, 10])
    ]
    p, _ = compressors.ACPSGD(rank=2, bucket_bytes=1000).phases()
    dense = [compressors.Identity()] * 4
    # 80 (P: 10 x 2 floats) + 800, then 200, 1200 and 400 bytes.
    groups = exchange.buckets([*dense, p], tensors)
    assert groups == [[4, 3], [2], [1], [0]]
    assert exchange.buckets([*dense, compressors.Identity()], tensors) == [
        [0, 1, 2, 3, 4]
    ]


def test_p_and_q_steps_have_buckets_of_their_own():
    """As the authors fuse: buckets count the factor each step sends (rows
    r on P steps, cols r on Q steps, float32), and the step's buckets are
    the finest in which both phases' buckets lie whole."""
    shapes = [(100, 4), (4, 100), (100, 4), (4, 100)]
    tensors = [tf.zeros(s) for s in shapes]
    p, q = compressors.ACPSGD(rank=2, bucket_bytes=900).phases()
    # P factors: 800, 32, 800, 32 bytes; Q factors: 32, 800, 32, 800.
    assert exchange.buckets([p] * 4, tensors) == [[3, 2, 1], [0]]
    assert exchange.buckets([q] * 4, tensors) == [[3, 2], [1, 0]]
    assert exchange.phase_buckets([[p] * 4, [q] * 4], tensors) == [[3, 2, 1, 0]]
    # Phases that agree keep their buckets.
    assert exchange.phase_buckets([[p] * 4, [p] * 4], tensors) == [
        [3, 2, 1],
        [0],
    ]


def test_every_matrix_is_compressed_as_the_authors_do():
    acp = compressors.ACPSGD(rank=4)
    assert acp.should_compress((2, 3)) and acp.should_compress((64, 3, 3, 3))
    assert not acp.should_compress((100,))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rank": 0}, "`rank`"),
        ({"bucket_bytes": 0}, "`bucket_bytes`"),
        ({"bucket_bytes": -5}, "`bucket_bytes`"),
        ({"warmup_steps": -1}, "`warmup_steps`"),
        ({"factor": "r"}, "`factor`"),
    ],
)
def test_acpsgd_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compressors.ACPSGD(**kwargs)
