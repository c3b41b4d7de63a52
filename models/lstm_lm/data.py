"""PTB-format text (one sentence a line) as fixed windows of token ids.

The files are `ptb.train.txt`, `ptb.valid.txt` and `ptb.test.txt`
(WikiText-2 renamed to these names works too). Each line is split on
whitespace and ends with an `<eos>` token; the vocabulary comes from the
training file only, most frequent words first.

The model is stateless, so the token stream is cut into non-overlapping
windows of `num_steps + 1` tokens (inputs and next-token targets), which
are shuffled for training. Unlike the stateful original, the first tokens
of every window see no earlier context, so perplexities are somewhat
higher than the paper's.
"""

from __future__ import annotations

import collections
import os
from typing import NamedTuple

import numpy as np
import tensorflow as tf

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "valid", "test")
EVAL_SPLITS = ("valid", "test")


def split_path(data_dir: str, split: str) -> str:
    """Path of `ptb.<split>.txt` in `data_dir`."""
    return os.path.join(data_dir, f"ptb.{split}.txt")


def missing_files(data_dir: str, splits=SPLITS) -> list[str]:
    """The files of `splits` that `data_dir` lacks."""
    return [
        split_path(data_dir, s)
        for s in splits
        if not os.path.isfile(split_path(data_dir, s))
    ]


def read_words(path: str) -> list[str]:
    """All tokens of a file, with `<eos>` at the end of every line."""
    with open(path, encoding="utf-8") as f:
        return [w for line in f for w in line.split() + [EOS]]


def build_vocab(words: list[str]) -> dict[str, int]:
    """Word -> id, most frequent first (ties by word), as in the original."""
    counts = collections.Counter(words)
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {word: i for i, (word, _) in enumerate(ordered)}


def to_ids(words: list[str], vocab: dict[str, int], path: str) -> np.ndarray:
    """Token ids; unknown words map to `<unk>` if the vocabulary has it.

    Raises:
        ValueError: a word is not in the vocabulary and there is no `<unk>`.
    """
    unk = vocab.get(UNK)
    ids = np.empty(len(words), np.int32)
    for i, word in enumerate(words):
        index = vocab.get(word, unk)
        if index is None:
            raise ValueError(
                f"{path} has the word {word!r}, which is not in the training "
                f"vocabulary and the vocabulary has no {UNK!r} token."
            )
        ids[i] = index
    return ids


def windows(ids: np.ndarray, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Cuts ids into `(inputs, targets)` of shape `[n, num_steps]`."""
    n = (len(ids) - 1) // num_steps
    inputs = ids[: n * num_steps].reshape(n, num_steps)
    targets = ids[1 : n * num_steps + 1].reshape(n, num_steps)
    return inputs, targets


class Corpus(NamedTuple):
    """Token ids of the training split, of the evaluation splits that were
    read (split name -> ids), and the vocabulary size."""

    train: np.ndarray
    evals: dict[str, np.ndarray]
    vocab_size: int


def load_corpus(data_dir: str, eval_splits=EVAL_SPLITS) -> Corpus:
    """Reads `ptb.train.txt` and the files of `eval_splits` in `data_dir`.

    The vocabulary comes from the training split alone, so leaving the
    evaluation splits out (`eval_splits=()`, training without evaluation)
    gives the same ids.
    """
    train_words = read_words(split_path(data_dir, "train"))
    vocab = build_vocab(train_words)
    evals = {
        s: to_ids(read_words(split_path(data_dir, s)), vocab, s)
        for s in eval_splits
    }
    train = to_ids(train_words, vocab, "train")
    return Corpus(train, evals, len(vocab))


def steps_per_pass(num_windows: int, global_batch_size: int) -> int:
    """Full global batches in one pass over `num_windows` windows."""
    return num_windows // global_batch_size


def dataset_fn(
    inputs: np.ndarray,
    targets: np.ndarray,
    global_batch_size: int,
    training: bool,
    seed: int = 0,
    start_step: int = 0,
):
    """A `distribute_datasets_from_function` function over fixed windows.

    Each input pipeline takes every `num_input_pipelines`-th window,
    repeats forever (the caller bounds the steps) and batches per replica.
    For training, each pass over a pipeline's windows is in its own order,
    a permutation drawn from `(seed, pass number)` alone, and the stream
    starts at global step `start_step`: a run resumed at step s reads the
    very batches that step s of a run that never stopped read.
    """

    def fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch_size)
        shard = slice(
            context.input_pipeline_id, None, context.num_input_pipelines
        )
        x = tf.constant(inputs[shard])
        y = tf.constant(targets[shard])
        count = len(inputs[shard])
        if training:
            replicas = (
                context.num_replicas_in_sync // context.num_input_pipelines
            )
            first, offset = divmod(start_step * batch * replicas, count)

            def one_pass(number):
                order = tf.random.experimental.stateless_shuffle(
                    tf.range(count),
                    seed=tf.stack([tf.constant(seed, tf.int64), number]),
                )
                return tf.data.Dataset.from_tensor_slices(order)

            ds = tf.data.Dataset.counter(first).flat_map(one_pass)
            ds = ds.skip(offset)
        else:
            ds = tf.data.Dataset.range(count).repeat()
        ds = ds.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
        ds = ds.batch(batch, drop_remainder=True)
        return ds.prefetch(tf.data.AUTOTUNE)

    return fn


def synthetic_dataset_fn(
    vocab_size: int, num_steps: int, global_batch_size: int, seed: int = 0
):
    """Random token ids of the real shapes, one batch repeated forever."""

    def fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch_size)
        rng = np.random.default_rng(seed + context.input_pipeline_id)
        tokens = rng.integers(
            0, vocab_size, size=(batch, num_steps + 1), dtype=np.int32
        )
        ds = tf.data.Dataset.from_tensors((tokens[:, :-1], tokens[:, 1:]))
        return ds.repeat()

    return fn
