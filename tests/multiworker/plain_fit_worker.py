"""Plain Keras `model.fit` under MultiWorkerMirroredStrategy, no tfgc
optimizer: shows whether `import tfgc` is what makes it work."""

import keras
import numpy as np
import tensorflow as tf

import tfgc  # noqa: F401  (the import installs the fit fix)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"], jit_compile=False)
x = np.ones((32, 4), "float32")
history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
print("FIT_OK", history.history["loss"][-1])
