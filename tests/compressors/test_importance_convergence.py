"""Importance pruning at density 1 % trains an embedding + softmax language
model as dense does, where the bare ratio |acc| / (|w| + 1e-8) diverged.

The model of docs/algorithms.md ("Importance-weighted pruning"), made
small enough for a test: the 999 most frequent words of the PTB subset
(../shared/data/ptb-subset) and one token for the rest, an embedding of 16
and a softmax over the 1,000 tokens predicting the next word, SGD at
learning rate 1 with momentum 0.9, global batch 512 over the 4 logical
CPUs' replicas, 200 steps; test cross-entropy on the first 20,000 words of
ptb.test.txt (uniform guessing: ln 1,000 = 6.91). Times were measured on
the project's 2-core machine while other jobs shared it.
"""

import functools
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from models.lstm_lm import data as ptb_data
from models.lstm_lm import shared_subset_dir
from tests import replicated

pytestmark = pytest.mark.slow

PTB_SUBSET = Path(shared_subset_dir())
VOCAB, DIM, BATCH, STEPS = 1000, 16, 512, 200


@functools.cache
def _bigrams():
    """(train ids, test ids) over the VOCAB - 1 most frequent words, the
    rest mapped to one token."""
    if not (PTB_SUBSET / "ptb.train.txt").is_file():
        pytest.skip(f"PTB subset not found at {PTB_SUBSET}")
    corpus = ptb_data.load_corpus(str(PTB_SUBSET), eval_splits=("test",))
    train, test = corpus.train, corpus.evals["test"]
    counts = np.bincount(train, minlength=corpus.vocab_size)
    frequent = np.argsort(-counts, kind="stable")[: VOCAB - 1]
    remap = np.full(corpus.vocab_size, VOCAB - 1, np.int32)
    remap[frequent] = np.arange(VOCAB - 1)
    return remap[train], remap[test][:20001]


def _test_cross_entropy(strategy, compressor, seed=0):
    train, test = _bigrams()
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        init = keras.initializers.RandomUniform(-0.1, 0.1, seed=seed)
        tokens = keras.Input((), dtype="int32")
        x = keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=init)(
            tokens
        )
        logits = keras.layers.Dense(VOCAB, kernel_initializer=init)(x)
        model = keras.Model(tokens, logits)
        optimizer = tfgc.CompressedOptimizer(
            keras.optimizers.SGD(1.0, momentum=0.9), compressor=compressor
        )
        optimizer.build(model.trainable_variables)
    dataset = (
        tf.data.Dataset.from_tensor_slices((train[:-1], train[1:]))
        .shuffle(len(train), seed=seed)
        .repeat()
        .batch(BATCH, drop_remainder=True)
    )
    per_token = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none"
    )
    replicated.train(
        strategy, model, optimizer, dataset, per_token, STEPS, chunk=50
    )
    for variable in model.trainable_variables:  # every replica the same
        copies = [v.numpy() for v in variable.value.values]
        for other in copies[1:]:
            np.testing.assert_array_equal(copies[0], other)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return float(loss(test[1:], model(test[:-1])))


def test_importance_one_percent_near_dense_on_an_embedding_softmax_lm(
    mirrored,
):
    """ImportancePruning(0.01) (floor relative_epsilon=1): test
    cross-entropy <= 1.05 x dense after the same 200 steps, every replica's
    weights bit-identical.

    Measured (seeds 0-2) against dense 4.419, 4.424, 4.439: 4.488, 4.506,
    4.499 (1.014-1.019 x). Missing the bar: the bare ratio
    (relative_epsilon=0) 39.2, 5.25, 6.68 (8.9, 1.19 and 1.50 x dense; seed
    0 diverged, worse than uniform guessing). Three runs of 200 steps: 28
    s of CPU time, 83 s of wall time while other jobs loaded the machine.
    """
    dense = _test_cross_entropy(mirrored, tfgc.compressors.Identity())
    floored = _test_cross_entropy(
        mirrored, tfgc.compressors.ImportancePruning(0.01)
    )
    bare = _test_cross_entropy(
        mirrored, tfgc.compressors.ImportancePruning(0.01, relative_epsilon=0.0)
    )
    assert dense < 0.7 * np.log(VOCAB)  # the model learned something
    assert floored <= 1.05 * dense, (floored, dense)
    assert bare > 1.05 * dense, (bare, dense)
