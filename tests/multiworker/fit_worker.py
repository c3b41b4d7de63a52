"""Runs inside every worker process of tests/multiworker/test_fit.py.

Started by `tfgc.launch` with TF_CONFIG set; writes what it measured to
`<out>/worker<i>.npz` for the test to compare across workers.
"""

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

import tfgc

FEATURES, CLASSES, LOCAL_BATCH = 16, 4, 8

# Dense layers of 16x32 and 32x4 with min_compress_size=64: the kernels are
# compressed, the biases go dense, so both paths run.
COMPRESSORS = {
    "identity": lambda: tfgc.compressors.Identity(),
    "fp16": lambda: tfgc.compressors.FP16(),
    "bf16": lambda: tfgc.compressors.BF16(),
    "topk": lambda: tfgc.compressors.TopK(density=0.05),
    "randomk": lambda: tfgc.compressors.RandomK(density=0.05),
    "signsgd": lambda: tfgc.compressors.SignSGD(),
    "powersgd": lambda: tfgc.compressors.PowerSGD(rank=2),
}


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(32, activation="tanh"),
            keras.layers.Dense(CLASSES),
        ]
    )


def make_dataset(num_workers):
    rng = np.random.default_rng(0)
    n = LOCAL_BATCH * num_workers * 8
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=n)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.batch(LOCAL_BATCH * num_workers).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    return ds.with_options(options)


def fit(strategy, optimizer_fn, steps):
    with strategy.scope():
        model = make_model()
        model.compile(
            optimizer=optimizer_fn(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    history = model.fit(
        make_dataset(strategy.num_replicas_in_sync),
        epochs=1,
        steps_per_epoch=steps,
        verbose=0,
    )
    weights = [w.numpy() for w in model.weights]
    return weights, history.history["loss"][-1], model.optimizer


def one_step_by_hand(strategy, index, compressor, communicator):
    """One SGD step in a custom loop against the numpy sum of gradients."""
    p = strategy.num_replicas_in_sync
    lr, batch = 0.1, 4
    w0 = np.array([[0.5], [-1.0], [2.0]], "float32")

    def data(i):
        rng = np.random.default_rng(100 + i)
        x = rng.normal(size=(batch, 3)).astype("float32")
        return x, rng.normal(size=(batch, 1)).astype("float32")

    with strategy.scope():
        layer = keras.layers.Dense(1, use_bias=False)
        layer.build((None, 3))
        layer.kernel.assign(w0)
        opt = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(lr),
            compressor=compressor,
            communicator=communicator,
            min_compress_size=0,
        )
        opt.build(layer.trainable_variables)

    x, y = data(index)

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                err = layer(tf.constant(x)) - tf.constant(y)
                loss = tf.reduce_sum(err**2) / (batch * p)
            grads = tape.gradient(loss, layer.trainable_variables)
            opt.apply(grads, layer.trainable_variables)

        strategy.run(replica_fn)

    step()
    grads = []
    for i in range(p):
        xi, yi = data(i)
        grads.append(2 * xi.T @ (xi @ w0 - yi) / (batch * p))
    expected = w0 - lr * np.sum(grads, axis=0)
    return layer.kernel.numpy(), expected


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    results = {}

    exact = [
        ("identity", tfgc.compressors.Identity(), "auto"),
        ("identity_allgather", tfgc.compressors.Identity(), "allgather"),
        ("topk_dense", tfgc.compressors.TopK(density=1.0), "auto"),
        ("randomk_dense", tfgc.compressors.RandomK(density=1.0), "auto"),
    ]
    for name, compressor, communicator in exact:
        got, expected = one_step_by_hand(
            strategy, index, compressor, communicator
        )
        results[f"hand/{name}/got"] = got
        results[f"hand/{name}/expected"] = expected

    def plain():
        return keras.optimizers.SGD(0.05, momentum=0.9)

    def wrapped():
        return tfgc.CompressedOptimizer(plain(), compressor="identity")

    for name, fn in [("plain", plain), ("wrapped", wrapped)]:
        weights, loss, _ = fit(strategy, fn, args.steps)
        for j, w in enumerate(weights):
            results[f"equiv/{name}/{j}"] = w
        results[f"equiv/{name}/loss"] = np.array(loss)

    for name, make in COMPRESSORS.items():

        def compressed(make=make):
            return tfgc.CompressedOptimizer(
                plain(), compressor=make(), min_compress_size=64
            )

        weights, loss, opt = fit(strategy, compressed, args.steps)
        for j, w in enumerate(weights):
            results[f"fit/{name}/{j}"] = w
        results[f"fit/{name}/loss"] = np.array(loss)
        stats = opt.compression_stats()
        results[f"fit/{name}/sent_bytes"] = np.array(stats["sent_bytes"])

    np.savez(os.path.join(args.out, f"worker{index}.npz"), **results)
    print(f"worker {index} done: {len(results)} arrays")


if __name__ == "__main__":
    main()
