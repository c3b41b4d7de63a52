"""Helpers the compressor tests share: gradient-like heavy-tailed data, the
keys all workers derive, and every replica's copy of a variable."""

import numpy as np
import tensorflow as tf


def heavy_tailed(shape, seed, df=2):
    """Student-t samples with `df` degrees of freedom, as float32: the heavy
    tails of real gradients."""
    rng = np.random.default_rng(seed)
    return rng.standard_t(df, size=shape).astype(np.float32)


def shared_key(index, step):
    """The stateless key of tensor `index` at `step`, as the optimizer
    derives it on every worker."""
    return tf.constant([index, step], tf.int64)


def replica_copies(variable):
    """Every replica's value of a MirroredStrategy variable, as numpy."""
    return [copy.numpy() for copy in variable.value.values]
