"""The 2-layer LSTM language model and its learning-rate schedule.

Zaremba, Sutskever and Vinyals, "Recurrent Neural Network Regularization"
(2014): dropout on the non-recurrent connections only, weights initialised
uniformly in [-init_scale, init_scale], plain SGD with gradient-norm
clipping, the learning rate decayed after `max_epoch` epochs.
"""

from __future__ import annotations

import dataclasses

import keras


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """One of the paper's configurations."""

    hidden_size: int
    dropout: float
    init_scale: float
    learning_rate: float
    max_grad_norm: float
    epochs: int
    max_epoch: int
    lr_decay: float
    num_layers: int = 2
    num_steps: int = 35
    batch_size: int = 20
    vocab_size: int = 10000


SIZES = {
    "small": ModelSize(200, 0.0, 0.1, 1.0, 5.0, 13, 4, 0.5),
    "medium": ModelSize(650, 0.5, 0.05, 1.0, 5.0, 39, 6, 0.8),
    "large": ModelSize(1500, 0.65, 0.04, 1.0, 10.0, 55, 14, 1 / 1.15),
}

#: A smaller LSTM than "small" (hidden 100, 20-token windows, no dropout,
#: one epoch without decay), so that the convergence tests and
#: benchmarks/importance_study.py train a dense and a compressed run on the
#: PTB subset in well under a minute each; the paper's initialisation,
#: plain SGD at learning rate 1 and global-norm clipping at 5.
CONVERGENCE_SIZE = ModelSize(100, 0.0, 0.1, 1.0, 5.0, 1, 1, 1.0, num_steps=20)


def build_model(
    size: ModelSize, vocab_size: int, num_steps: int, seed: int = 0
) -> keras.Model:
    """Embedding -> `num_layers` x LSTM -> softmax logits per position."""
    init = keras.initializers.RandomUniform(
        -size.init_scale, size.init_scale, seed=seed
    )
    tokens = keras.Input((num_steps,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(
        vocab_size, size.hidden_size, embeddings_initializer=init
    )(tokens)
    x = keras.layers.Dropout(size.dropout, seed=seed)(x)
    for layer in range(size.num_layers):
        x = keras.layers.LSTM(
            size.hidden_size,
            return_sequences=True,
            kernel_initializer=init,
            recurrent_initializer=init,
            unit_forget_bias=False,
            name=f"lstm_{layer}",
        )(x)
        x = keras.layers.Dropout(size.dropout, seed=seed + 1 + layer)(x)
    logits = keras.layers.Dense(
        vocab_size, kernel_initializer=init, dtype="float32", name="logits"
    )(x)
    return keras.Model(tokens, logits, name="lstm_lm")


@keras.saving.register_keras_serializable(package="tfgc_models")
class EpochDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`lr * decay ** max(epoch + 1 - max_epoch, 0)`, as in the paper.

    Args:
        learning_rate: the initial learning rate.
        decay: factor per epoch after `max_epoch`.
        max_epoch: epochs at the initial rate.
        steps_per_epoch: steps in one epoch.
    """

    def __init__(self, learning_rate, decay, max_epoch, steps_per_epoch):
        self.learning_rate = float(learning_rate)
        self.decay = float(decay)
        self.max_epoch = int(max_epoch)
        self.steps_per_epoch = int(steps_per_epoch)

    def __call__(self, step):
        epoch = keras.ops.floor_divide(
            keras.ops.cast(step, "float32"), float(self.steps_per_epoch)
        )
        exponent = keras.ops.maximum(epoch + 1.0 - self.max_epoch, 0.0)
        return self.learning_rate * keras.ops.power(self.decay, exponent)

    def get_config(self):
        return {
            "learning_rate": self.learning_rate,
            "decay": self.decay,
            "max_epoch": self.max_epoch,
            "steps_per_epoch": self.steps_per_epoch,
        }
