"""Short training tasks on real data, and one run of a compressor on them.

The studies (`importance_study.py`, `fidelity_study.py`) train each task
on two or more workers of a MirroredStrategy over logical CPUs, every
worker its own part of each global batch:

* `bigram`: an embedding and a softmax layer (vocabulary 7,951 x `dim` and
  `dim` x 7,951 plus a bias) predicting the next word of the Penn Treebank
  subset (../shared/data/ptb-subset), SGD at learning rate 1 with momentum
  (`momentum`), 1,024 words a step (`batch`), 300 steps; test
  cross-entropy on the first 20,000 words of ptb.test.txt (uniform
  guessing: ln 7,951 = 8.98).
* `digits`: the 64-64-10 MLP on scikit-learn's 8x8 digits of
  tests/convergence (SGD 0.05, cosine decay, momentum, global batch 32,
  20 epochs, every tensor compressed); the loss on all digits, or with
  `holdout` > 0 trained on the rest and tested on that share of them.
* `lstm`: the 2 x 100 LSTM LM of tests/convergence on the PTB subset
  (`models.lstm_lm.model.CONVERGENCE_SIZE`: 20 unrolled steps; global
  batch 20, SGD 1, clip-norm 5, 100 steps); test perplexity on 400
  windows of ptb.test.txt.

A task is made from an argparse namespace: `steps` and `batch` (0: the
defaults above), `momentum`, `dim`, `init` (the bigram's uniform
initialiser, else Keras's defaults) and, optionally, `holdout`.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

import tfgc


def _ptb_ids():
    """(train ids, test ids, vocabulary size) of the PTB subset."""
    from models.lstm_lm import data, shared_subset_dir

    corpus = data.load_corpus(shared_subset_dir(), eval_splits=("test",))
    return corpus.train, corpus.evals["test"], corpus.vocab_size


def bigram_task(args):
    train, test, vocab = _ptb_ids()
    test = test[:20001]
    dim = args.dim

    def build():
        tokens = keras.Input((), dtype="int32")
        if args.init:
            init = keras.initializers.RandomUniform(-0.1, 0.1, seed=0)
            x = keras.layers.Embedding(vocab, dim, embeddings_initializer=init)(
                tokens
            )
            logits = keras.layers.Dense(vocab, kernel_initializer=init)(x)
        else:  # Keras's default initialisers
            x = keras.layers.Embedding(vocab, dim)(tokens)
            logits = keras.layers.Dense(vocab)(x)
        return keras.Model(tokens, logits)

    def inner(momentum):
        return keras.optimizers.SGD(1.0, momentum=momentum)

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def evaluate(model):
        total = 0.0
        for i in range(0, len(test) - 1, 2000):
            x, y = test[i : i + 2000], test[i + 1 : i + 2001]
            x = x[: len(y)]
            total += float(loss(y, model(x))) * len(y)
        return total / (len(test) - 1)

    return {
        "build": build,
        "inner": inner,
        "momentum": args.momentum,
        "data": (train[:-1].astype("int32"), train[1:].astype("int32")),
        "batch": args.batch or 1024,
        "steps": args.steps or 300,
        "per_example": keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        ),
        "evaluate": evaluate,
        "metric": "test cross-entropy",
        "min_compress_size": 1024,
        "description": f"embedding {vocab:,} x {dim} + softmax {dim} x "
        f"{vocab:,} (+ bias), SGD lr 1 momentum {args.momentum:g}, "
        f"{args.batch or 1024} words a step",
        "seeds": "the data order (the initial weights are seed 0's)",
    }


def digits_task(args):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    holdout = getattr(args, "holdout", 0.0)
    tx, ty = x, y
    if holdout:
        # The same split for every seed: the seeds vary weights and order.
        order = np.random.default_rng(0).permutation(len(x))
        cut = round(holdout * len(x))
        tx, ty = x[order[:cut]], y[order[:cut]]
        x, y = x[order[cut:]], y[order[cut:]]
    steps = args.steps or 20 * (len(x) // 32)

    def build():
        return keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    def inner(momentum):
        return keras.optimizers.SGD(
            keras.optimizers.schedules.CosineDecay(0.05, steps),
            momentum=momentum,
        )

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return {
        "build": build,
        "inner": inner,
        "momentum": args.momentum,
        "data": (x, y),
        "batch": 32,
        "steps": steps,
        "per_example": keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        ),
        "evaluate": lambda model: float(loss(ty, model(tx))),
        "metric": f"test loss ({len(tx)} held out)"
        if holdout
        else "training loss",
        "min_compress_size": 0,
        "description": "64-64-10 MLP, SGD 0.05 cosine, momentum "
        f"{args.momentum:g}, global batch 32, {len(x)} training digits",
        "seeds": "the initial weights and the data order",
    }


def lstm_task(args):
    from models.lstm_lm import data
    from models.lstm_lm import model as lstm_model

    train, test, vocab = _ptb_ids()
    size = lstm_model.CONVERGENCE_SIZE
    x, y = data.windows(train, size.num_steps)
    tx, ty = data.windows(test, size.num_steps)
    tx, ty = tx[:400], ty[:400]
    token_loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none"
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def evaluate(model):
        losses = [
            float(loss(ty[i : i + 100], model(tx[i : i + 100])))
            for i in range(0, len(tx), 100)
        ]
        return float(np.exp(np.mean(losses)))

    return {
        "build": lambda: lstm_model.build_model(
            size, vocab, size.num_steps, seed=0
        ),
        "inner": lambda momentum: keras.optimizers.SGD(
            size.learning_rate,
            momentum=momentum,
            global_clipnorm=size.max_grad_norm,
        ),
        "momentum": 0.0,
        "data": (x.astype("int32"), y.astype("int32")),
        "batch": 20,
        "steps": args.steps or 100,
        "per_example": lambda labels, logits: tf.reduce_mean(
            token_loss(labels, logits), axis=-1
        ),
        "evaluate": evaluate,
        "metric": "test perplexity",
        "min_compress_size": 1024,
        "description": "2 x 100 LSTM LM, 20 unrolled steps, global batch "
        "20, SGD 1, clip-norm 5",
        "seeds": "the data order (the initial weights are seed 0's)",
    }


TASKS = {"bigram": bigram_task, "digits": digits_task, "lstm": lstm_task}


def _copies(variable) -> list[np.ndarray]:
    value = variable.value
    values = getattr(value, "values", None) or [value]
    return [v.numpy().reshape(-1) for v in values]


class Tracer:
    """Per tensor and step: residual age and size, and what landed."""

    def __init__(self, optimizer, variables):
        self.plans = [
            (v.path, plan.state_variables[0], v)
            for v, plan in zip(variables, optimizer._plans)
            if plan.state_variables
        ]
        self.age = {path: None for path, _, _ in self.plans}
        self.prev = {path: None for path, _, _ in self.plans}
        self.rows = {path: [] for path, _, _ in self.plans}

    def record(self, step: int, grad_norms: dict) -> None:
        for path, residual, variable in self.plans:
            copies = _copies(residual)
            w = _copies(variable)[0]
            if self.age[path] is None:
                self.age[path] = [np.zeros(c.shape, np.int64) for c in copies]
                self.prev[path] = [np.zeros_like(c) for c in copies]
            row = {"step": step}
            for r, res in enumerate(copies[:1]):  # worker 0
                age = np.where(res != 0, self.age[path][r] + 1, 0)
                held = res != 0
                landed = (self.prev[path][r] != 0) & ~held
                res_norm = float(np.linalg.norm(res))
                row.update(
                    {
                        "held": float(held.mean()),
                        "age_max": int(age.max()),
                        "age_mean": float(age[held].mean())
                        if held.any()
                        else 0,
                        "age_p99": float(np.percentile(age[held], 99))
                        if held.any()
                        else 0,
                        "age_mass": float(np.average(age, weights=np.abs(res)))
                        if held.any()
                        else 0,
                        "landed_w_median": float(
                            np.median(np.abs(w[landed]))
                            / max(np.median(np.abs(w)), 1e-30)
                        )
                        if landed.any()
                        else 0,
                        "res_over_w": res_norm / float(np.linalg.norm(w)),
                        "res_over_g": res_norm
                        / max(grad_norms.get(path, 0.0), 1e-30),
                        "landed": int(landed.sum()),
                        "landed_age_max": int(self.age[path][r][landed].max())
                        if landed.any()
                        else 0,
                        "landed_age_mean_weighted": float(
                            np.average(
                                self.age[path][r][landed],
                                weights=np.abs(self.prev[path][r][landed]),
                            )
                        )
                        if landed.any()
                        else 0,
                        "landed_norm_over_g": float(
                            np.linalg.norm(self.prev[path][r][landed])
                        )
                        / max(grad_norms.get(path, 0.0), 1e-30),
                    }
                )
                self.age[path][r] = age
                self.prev[path][r] = res
            self.rows[path].append(row)


def run(
    task,
    strategy,
    compressor,
    *,
    seed: int = 0,
    trace: bool = False,
    momentum: float | None = None,
    communicator="auto",
) -> dict:
    """Trains `task` once through `tfgc.CompressedOptimizer(compressor)`.

    `seed` sets the initial weights and the data order; `momentum` replaces
    the inner SGD's (the task's own when None: RedSync takes it instead).
    Returns the test metric, the final training loss (the mean of the last
    tenth of the steps), whether every worker ended with the same weights
    bit for bit, the compression over the run and the seconds it took;
    with `trace`, the residual's `Tracer` rows of every step.
    """
    keras.utils.set_random_seed(seed)
    x, y = task["data"]
    with strategy.scope():
        model = task["build"]()
        optimizer = tfgc.CompressedOptimizer(
            task["inner"](task["momentum"] if momentum is None else momentum),
            compressor=compressor,
            communicator=communicator,
            min_compress_size=task["min_compress_size"],
        )
        optimizer.build(model.trainable_variables)
    batch = task["batch"]
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed)
        .repeat()
        .batch(batch, drop_remainder=True)
    )
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    per_example = task["per_example"]
    variables = model.trainable_variables

    def step(inputs, labels):
        with tf.GradientTape() as tape:
            per = per_example(labels, model(inputs, training=True))
            loss = tf.nn.compute_average_loss(per, global_batch_size=batch)
        grads = tape.gradient(loss, variables)
        optimizer.apply(grads, variables)
        return loss, [tf.norm(tf.convert_to_tensor(g)) for g in grads]

    @tf.function
    def run_steps(iterator, count):
        total = tf.constant(0.0)
        norms = [tf.constant(0.0) for _ in variables]
        for _ in tf.range(count):
            loss, norms = strategy.run(step, args=next(iterator))
            total += strategy.reduce("SUM", loss, None)
            norms = [strategy.experimental_local_results(n)[0] for n in norms]
        return total / tf.cast(count, tf.float32), norms

    tracer = Tracer(optimizer, variables) if trace else None
    losses = []
    steps = task["steps"]
    chunk = 1 if trace else 50
    start = time.perf_counter()
    done = 0
    while done < steps:
        count = min(chunk, steps - done)
        loss, norms = run_steps(iterator, tf.constant(count))
        done += count
        losses += [float(loss)] * count
        if tracer is not None:
            tracer.record(
                done,
                {v.path: float(n) for v, n in zip(variables, norms)},
            )
    seconds = time.perf_counter() - start
    weights = [_copies(v) for v in variables]
    identical = all(
        all(np.array_equal(c[0], other) for other in c[1:]) for c in weights
    )
    result = {
        "metric": task["evaluate"](model),
        "final_train_loss": float(
            np.mean(losses[-max(1, len(losses) // 10) :])
        ),
        "workers_identical": identical,
        "compression": optimizer.compression_stats()["run_compression_ratio"],
        "seconds": seconds,
    }
    if tracer is not None:
        result["trace"] = tracer.rows
    return result
