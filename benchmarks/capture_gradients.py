"""Captures real gradients of the training mains for the selection benchmark.

Each model is built with the builders its main uses (`models.lstm_lm` and
`models.resnet50_imagenet`), trained for a few real steps on one CPU worker
with the main's loss and optimizer, and then the gradient of one more batch
is taken: every trainable variable's gradient (the embedding's sparse
gradient made dense), before clipping (what a compressor sees), in
`model.trainable_variables` order, concatenated into one flat float32
vector. It is saved as `<out>/<name>.npz` with

* `grad`: the flat float32 gradient;
* `names`, `shapes`: each variable's path and shape (shapes as "650x2600");
* `meta`: a JSON string (model, steps, batch, losses, TensorFlow version).

Models (`NAMES`):

* `lstm_small`, `lstm_medium`, `lstm_large`: Zaremba et al.'s LSTM LM on
  PTB-format text (`ptb.train.txt` of `--data-dir`, default the PTB subset
  in ../shared/data/ptb-subset or $TFGC_PTB_SUBSET), batch 20 x 35
  tokens, SGD at learning rate 1 with global-norm clipping, dropout as
  configured. With the subset's 7,951-word vocabulary, medium has 17.1 M
  parameters.
* `resnet50`: ResNet-50 v1.5 (25,557,032 parameters) on the main's
  synthetic ImageNet-shaped data, label smoothing 0.1, L2 loss, SGD with
  momentum 0.9 at 0.1 per 256 examples (no warm-up).

    python benchmarks/capture_gradients.py        # lstm_medium, resnet50
    python benchmarks/capture_gradients.py --models lstm_small --steps 3
    python benchmarks/capture_gradients.py --out /tmp/grads --force

A file already in `--out` is kept unless `--force` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "benchmarks", ".cache")
NAMES = ("lstm_small", "lstm_medium", "lstm_large", "resnet50")
DEFAULT_MODELS = ("lstm_medium", "resnet50")
DEFAULT_STEPS = 5
RESNET_BATCH = 4

if ROOT not in sys.path:  # run as a script: make `models` importable
    sys.path.insert(0, ROOT)

from models.lstm_lm import shared_subset_dir  # noqa: E402

PTB = shared_subset_dir()


def path_for(name: str, out: str = CACHE) -> str:
    """Where `capture(name, out)` writes."""
    return os.path.join(out, f"{name}.npz")


def load(name: str, out: str = CACHE) -> dict:
    """A captured gradient: `grad` (float32), `names`, `shapes`, `meta`."""
    with np.load(path_for(name, out)) as f:
        shapes = [
            tuple(int(d) for d in s.split("x")) if s else ()
            for s in f["shapes"].tolist()
        ]
        return {
            "grad": f["grad"],
            "names": f["names"].tolist(),
            "shapes": shapes,
            "meta": json.loads(str(f["meta"])),
        }


def _flat(grads) -> np.ndarray:
    import tensorflow as tf

    return np.concatenate(
        [tf.reshape(tf.convert_to_tensor(g), [-1]).numpy() for g in grads]
    ).astype(np.float32)


def _lstm(size_name: str, steps: int, data_dir: str, seed: int):
    import keras
    import tensorflow as tf

    from models.lstm_lm import data, model

    size = model.SIZES[size_name]
    words = data.read_words(data.split_path(data_dir, "train"))
    vocab = data.build_vocab(words)
    ids = data.to_ids(words, vocab, "train")
    inputs, targets = data.windows(ids, size.num_steps)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(inputs))
    batch = size.batch_size

    def batch_at(i):
        sel = order[i * batch : (i + 1) * batch]
        return tf.constant(inputs[sel]), tf.constant(targets[sel])

    keras.utils.set_random_seed(seed)
    lm = model.build_model(size, len(vocab), size.num_steps, seed=seed)
    optimizer = keras.optimizers.SGD(
        size.learning_rate, global_clipnorm=size.max_grad_norm
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    info = {
        "model": f"lstm_lm {size_name}",
        "data": data_dir,
        "vocab_size": len(vocab),
        "batch": f"{batch} x {size.num_steps} tokens",
        "optimizer": f"SGD({size.learning_rate}, global_clipnorm="
        f"{size.max_grad_norm})",
    }
    return lm, optimizer, loss_fn, batch_at, info


def _resnet(steps: int, seed: int):
    import keras
    import tensorflow as tf

    from models.common.config import CommonConfig
    from models.resnet50_imagenet import data, main

    config = main.ResnetConfig(
        common=CommonConfig(
            model_dir="unused",
            use_synthetic_data=True,
            train_steps=steps + 1,
            batch_size=RESNET_BATCH,
            seed=seed,
        )
    )
    keras.utils.set_random_seed(seed)
    net = main.build_model(config)
    context = tf.distribute.InputContext()
    images, labels = next(
        iter(
            data.synthetic_dataset_fn(config.spec, RESNET_BATCH, seed)(context)
        )
    )
    lr = config.base_learning_rate * RESNET_BATCH / main.BASE_BATCH
    optimizer = keras.optimizers.SGD(lr, momentum=0.9)
    loss_fn = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=config.label_smoothing
    )
    info = {
        "model": "resnet50_v1_5",
        "data": "synthetic (models.resnet50_imagenet.data, one batch)",
        "batch": RESNET_BATCH,
        "optimizer": f"SGD({lr}, momentum=0.9)",
    }
    return net, optimizer, loss_fn, lambda i: (images, labels), info


def capture(
    name: str,
    out: str = CACHE,
    steps: int = DEFAULT_STEPS,
    data_dir: str = PTB,
    seed: int = 0,
    force: bool = False,
    log=print,
) -> str:
    """Trains `name` for `steps` steps, saves the next gradient; its path."""
    if name not in NAMES:
        raise ValueError(f"`name` must be one of {NAMES}. Received: {name!r}")
    path = path_for(name, out)
    if os.path.exists(path) and not force:
        log(f"{path} exists; kept (--force to capture again)")
        return path
    import tensorflow as tf

    t0 = time.perf_counter()
    if name == "resnet50":
        net, optimizer, loss_fn, batch_at, info = _resnet(steps, seed)
    else:
        size = name.split("_", 1)[1]
        net, optimizer, loss_fn, batch_at, info = _lstm(
            size, steps, data_dir, seed
        )
    variables = net.trainable_variables

    @tf.function(jit_compile=False)
    def gradient(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
            if net.losses:
                loss += tf.add_n(net.losses)
        return loss, tape.gradient(loss, variables)

    losses, step_s = [], []
    for i in range(steps + 1):
        s0 = time.perf_counter()
        x, y = batch_at(i)
        loss, grads = gradient(x, y)
        if i < steps:
            optimizer.apply(grads, variables)
        losses.append(float(loss))
        step_s.append(time.perf_counter() - s0)
        log(f"{name}: step {i + 1}/{steps + 1} loss {losses[-1]:.4f}")
    flat = _flat(grads)
    shapes = ["x".join(str(d) for d in v.shape) for v in variables]
    meta = {
        **info,
        "parameters": int(flat.size),
        "training_steps_before": steps,
        "losses": losses,
        "step_seconds": step_s,
        "seed": seed,
        "tensorflow": tf.__version__,
        "capture_seconds": time.perf_counter() - t0,
        "nonzero_fraction": float(np.count_nonzero(flat) / flat.size),
    }
    os.makedirs(out, exist_ok=True)
    tmp = path + ".tmp.npz"
    np.savez(
        tmp,
        grad=flat,
        names=np.array([v.path for v in variables]),
        shapes=np.array(shapes),
        meta=np.array(json.dumps(meta)),
    )
    os.replace(tmp, path)
    log(
        f"wrote {path}: {flat.size:,} elements, "
        f"{meta['nonzero_fraction']:.1%} nonzero, "
        f"{meta['capture_seconds']:.0f} s"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated, of {', '.join(NAMES)}",
    )
    parser.add_argument("--out", default=CACHE, help="cache directory")
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="training steps before the captured gradient",
    )
    parser.add_argument("--data-dir", default=PTB, help="PTB-format text")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--force", action="store_true", help="capture again if cached"
    )
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        parser.error(f"unknown --models {unknown}; choose from {NAMES}")
    if args.steps < 0:
        parser.error("--steps must be >= 0")
    for name in names:
        capture(
            name, args.out, args.steps, args.data_dir, args.seed, args.force
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
