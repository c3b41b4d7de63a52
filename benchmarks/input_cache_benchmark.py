"""Input throughput of the ResNet main's training pipeline per cache level,
the first epoch against later ones, with the source behind a throttle.

The data: `models/resnet50_imagenet/sample_data.py`'s real photographs in
the ImageNet TFRecord layout (`--examples` training examples in `--shards`
files, about 22 KB a JPEG). The source stands for network storage: every
record read from a file waits for a token bucket shared by all the
pipeline's readers (`--rates`, MB/s; tf.data reads up to 8 files at once,
and the bucket limits their sum). The pipeline is the main's
(`data.dataset_fn`: shuffle in a buffer of 256, random-resized crop,
flip, batches of `--batch`), one input pipeline, timed from its second
batch, the cache at each of `--levels`
(`auto` with a memory budget of half the data, the rest on disk). Per
rate and level: examples per second in epoch 1 (reading the source,
filling the cache) and in epochs 2 to `--epochs` (reading the cache).
With `--train`, each batch also feeds a training step of a small
convolutional network (`small_cnn`: its step on 2 cores is shorter than
the source takes for a batch, as a GPU's would be), and the rows also
hold the mean step in epoch 1 and in later epochs, beside the step with
its input already in memory (`compute`). Writes `input_cache.json`, `.md`
and `input_cache.png` to `--out` (docs/benchmarks):

    python benchmarks/input_cache_benchmark.py
    python benchmarks/input_cache_benchmark.py --train --rates 2,8
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import _common  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.common import cache  # noqa: E402
from models.resnet50_imagenet import data, sample_data  # noqa: E402

_READER = tf.data.TFRecordDataset
#: Smaller than an epoch, so that the first batch does not wait for the
#: whole epoch to be read (the main's 10,000 would hold all of it).
SHUFFLE_BUFFER = 256


class Throttle:
    """A token bucket of `rate` bytes a second, shared by every reader."""

    def __init__(self, rate: float):
        self.rate = rate
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self, size: int) -> None:
        with self._lock:
            now = time.perf_counter()
            self._next = max(self._next, now) + size / self.rate
            until = self._next
        time.sleep(max(0.0, until - time.perf_counter()))

    def reader(self, path):
        """A TFRecord file read at the bucket's pace."""

        def waited(record):
            self.wait(len(record.numpy()))
            return record

        def each(record):
            out = tf.py_function(waited, [record], tf.string)
            out.set_shape([])
            return out

        return _READER(path).map(each)


def small_cnn(spec):
    """A Keras training step of a small convolutional network on the
    pipeline's batches: `step(images, labels)` -> loss."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((spec.image_size, spec.image_size, 3)),
            keras.layers.Conv2D(16, 7, strides=4, activation="relu"),
            keras.layers.MaxPooling2D(4),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(spec.num_classes),
        ]
    )
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)  # one-hot

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step


def compute_seconds(step, images, labels, repeats: int = 10) -> float:
    """The median step on one batch already in memory."""
    return _common.timeit(lambda: step(images, labels), repeats) / 1e3


def measure(source, level, rate, examples, batch, epochs, workdir, step=None):
    """(epoch 1 examples/s, later epochs' examples/s, per epoch the mean
    seconds of a batch): with `step`, each batch also trains."""
    throttle = Throttle(rate * 1e6)
    tf.data.TFRecordDataset = throttle.reader
    try:
        size = sum(
            os.path.getsize(p) for p in data.tfrecord_files(source, "train")
        )
        settings = cache.Settings(
            level, os.path.join(workdir, f"cache-{level}-{rate}"), size // 2
        )
        fn = data.dataset_fn(
            source, data.IMAGENET, "tfrecord", batch, training=True,
            shuffle_buffer=SHUFFLE_BUFFER, cache_settings=settings,
        )  # fmt: skip
        iterator = iter(fn(tf.distribute.InputContext(1, 0, 1)))

        def consume(images, labels):
            if step is None:
                images.numpy()
            else:
                step(images, labels).numpy()

        # The first batch pays for starting the pipeline (tracing, thread
        # pools): the clock starts after it.
        consume(*next(iterator))
        per_epoch = examples // batch
        counts = [per_epoch - 1] + [per_epoch] * (epochs - 1)
        seconds = []
        for count in counts:
            start = time.perf_counter()
            for _ in range(count):
                consume(*next(iterator))
            seconds.append(time.perf_counter() - start)
    finally:
        tf.data.TFRecordDataset = _READER
    first = counts[0] * batch / seconds[0]
    later = sum(counts[1:]) * batch / sum(seconds[1:])
    return first, later, [t / c for t, c in zip(seconds, counts)]


def _in_memory(source, batch):
    """The training pipeline without a throttle or cache (one batch of
    it stands for input already in memory)."""
    fn = data.dataset_fn(
        source, data.IMAGENET, "tfrecord", batch, training=True,
        shuffle_buffer=SHUFFLE_BUFFER,
    )  # fmt: skip
    return fn(tf.distribute.InputContext(1, 0, 1))


def markdown(meta, rows) -> str:
    lines = [
        "# Input cache: first epoch against later ones",
        "",
        " ".join(__doc__.split("\n\n")[1].split()),
        "",
        f"Command: `{meta['command']}`; machine: {meta['machine']}, "
        f"TensorFlow {meta['tensorflow']}; {meta['examples']:,} examples "
        f"({meta['megabytes']:.1f} MB) in {meta['shards']} files, batch "
        f"{meta['batch']}, {meta['epochs']} epochs.",
        "",
        "![throughput per level](input_cache.png)",
        "",
        "| source rate (MB/s) | cache | epoch 1 (examples/s) | "
        "later epochs (examples/s) | later / first |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['rate']:g} | {row['level']} | {row['first']:.0f} | "
            f"{row['later']:.0f} | {row['later'] / row['first']:.2f}x |"
        )
    if "compute_ms" in meta:
        lines += [
            "",
            "## Training step when input-bound",
            "",
            f"Each batch trains `small_cnn` (its step with the batch in "
            f"memory: {meta['compute_ms']:.1f} ms). Mean step per epoch; "
            "x compute: the step over the step with its input in memory.",
            "",
            "| source rate (MB/s) | cache | epoch 1 (ms / step) | "
            "later epochs (ms / step) | epoch 1 x compute | "
            "later x compute |",
            "|---|---|---|---|---|---|",
        ]
        compute = meta["compute_ms"]
        for row in rows:
            first = 1e3 * row["step_s"][0]
            later = 1e3 * np.mean(row["step_s"][1:])
            lines.append(
                f"| {row['rate']:g} | {row['level']} | {first:.1f} | "
                f"{later:.1f} | {first / compute:.2f}x | "
                f"{later / compute:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def plot(rows, path) -> None:
    rates = sorted({r["rate"] for r in rows})
    levels = list(dict.fromkeys(r["level"] for r in rows))
    fig, axes = plt.subplots(
        1, len(rates), figsize=(4 * len(rates), 4), squeeze=False
    )
    for ax, rate in zip(axes[0], rates):
        mine = {r["level"]: r for r in rows if r["rate"] == rate}
        x = np.arange(len(levels))
        ax.bar(x - 0.2, [mine[v]["first"] for v in levels], 0.4,
               label="epoch 1")  # fmt: skip
        ax.bar(x + 0.2, [mine[v]["later"] for v in levels], 0.4,
               label="later epochs")  # fmt: skip
        ax.set_xticks(x, levels)
        ax.set_title(f"source at {rate:g} MB/s")
        ax.set_ylabel("examples / s")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1536)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rates", default="2,8,32")
    parser.add_argument("--levels", default="none,memory,disk,auto")
    parser.add_argument(
        "--train",
        action="store_true",
        help="each batch also trains a small network (the step time)",
    )
    parser.add_argument(
        "--out", default=os.path.join(REPO, "docs", "benchmarks")
    )
    args = parser.parse_args(argv)
    levels = [v for v in args.levels.split(",") if v]
    bad = [v for v in levels if v not in cache.LEVELS]
    if bad:
        parser.error(f"--levels: unknown {bad}; known: {list(cache.LEVELS)}")
    try:
        rates = [float(r) for r in args.rates.split(",") if r]
    except ValueError:
        parser.error(f"--rates takes numbers (MB/s); got {args.rates!r}")
    if args.epochs < 2 or args.examples < args.batch or not rates:
        parser.error("needs --epochs >= 2, --examples >= --batch and a rate")
    meta = _common.machine_meta(1)
    del meta["repeats"], meta["unit"]
    meta.update(
        command=shlex.join(
            ["python", "benchmarks/input_cache_benchmark.py", *argv]
        ),
        examples=args.examples,
        shards=args.shards,
        batch=args.batch,
        epochs=args.epochs,
    )
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        source = os.path.join(workdir, "source")
        paths = sample_data.write(source, args.examples, 0, args.shards)
        meta["megabytes"] = sum(map(os.path.getsize, paths["train"])) / 1e6
        step = None
        if args.train:
            step = small_cnn(data.IMAGENET)
            images, labels = next(iter(_in_memory(source, args.batch)))
            meta["compute_ms"] = 1e3 * compute_seconds(step, images, labels)
            print(f"[input cache] step, input in memory: "
                  f"{meta['compute_ms']:.1f} ms", flush=True)  # fmt: skip
        for rate in rates:
            for level in levels:
                first, later, step_s = measure(
                    source, level, rate, args.examples, args.batch,
                    args.epochs, workdir, step,
                )  # fmt: skip
                rows.append(
                    {"rate": rate, "level": level, "first": first,
                     "later": later, "step_s": step_s}
                )  # fmt: skip
                print(
                    f"[input cache] {rate:g} MB/s {level}: epoch 1 "
                    f"{first:.0f}/s, later {later:.0f}/s",
                    flush=True,
                )
    os.makedirs(args.out, exist_ok=True)
    plot(rows, os.path.join(args.out, "input_cache.png"))
    _common.write_results(
        os.path.join(args.out, "input_cache"),
        {"meta": meta, "rows": rows},
        markdown(meta, rows),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
