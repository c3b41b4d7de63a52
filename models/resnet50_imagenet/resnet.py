"""ResNet v1.5 with bottleneck blocks, built here in Keras.

He et al., "Deep Residual Learning for Image Recognition" (2016), in the
"v1.5" form that NVIDIA and TensorFlow's official models train: the stride
of a down-sampling block sits in its 3x3 convolution rather than in the
first 1x1 (`keras.applications.ResNet50` is v1, stride in the 1x1, and
its convolutions have biases). At 1000 classes this model has 25,557,032
trainable parameters (25,610,152 with the batch-norm statistics); v1.5
costs a little more compute than v1 and is about 0.5 % more accurate.

`resnet(..., cifar_stem=True)` replaces the 7x7/2 convolution and max-pool
stem by one 3x3/1 convolution for 32x32 inputs.
"""

from __future__ import annotations

import keras

LAYERS_50 = (3, 4, 6, 3)
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def _conv(filters, kernel, strides, l2, name):
    return keras.layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="valid" if strides > 1 else "same",
        use_bias=False,
        kernel_initializer="he_normal",
        kernel_regularizer=keras.regularizers.L2(l2) if l2 else None,
        name=name,
    )


def _strided_conv(x, filters, kernel, strides, l2, name):
    """A convolution with explicit, input-size independent padding."""
    if strides > 1:
        pad = (kernel - 1) // 2
        x = keras.layers.ZeroPadding2D(pad, name=f"{name}_pad")(x)
    return _conv(filters, kernel, strides, l2, name)(x)


def _bn(name, zero_init=False):
    return keras.layers.BatchNormalization(
        momentum=BN_MOMENTUM,
        epsilon=BN_EPSILON,
        gamma_initializer="zeros" if zero_init else "ones",
        name=name,
    )


def bottleneck(x, filters: int, strides: int, l2: float, name: str):
    """1x1 -> 3x3 (strided) -> 1x1 x4, plus a projection when shapes change.

    The last batch normalization starts at zero so that every block starts
    as the identity (Goyal et al., 2017).
    """
    shortcut = x
    if strides > 1 or x.shape[-1] != 4 * filters:
        shortcut = _conv(4 * filters, 1, strides, l2, f"{name}_proj")(x)
        shortcut = _bn(f"{name}_proj_bn")(shortcut)
    y = _conv(filters, 1, 1, l2, f"{name}_1")(x)
    y = keras.layers.ReLU(name=f"{name}_1_relu")(_bn(f"{name}_1_bn")(y))
    y = _strided_conv(y, filters, 3, strides, l2, f"{name}_2")
    y = keras.layers.ReLU(name=f"{name}_2_relu")(_bn(f"{name}_2_bn")(y))
    y = _conv(4 * filters, 1, 1, l2, f"{name}_3")(y)
    y = _bn(f"{name}_3_bn", zero_init=True)(y)
    y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
    return keras.layers.ReLU(name=f"{name}_out")(y)


def resnet(
    input_shape: tuple[int, int, int],
    num_classes: int,
    layers: tuple[int, ...] = LAYERS_50,
    width: int = 64,
    cifar_stem: bool = False,
    l2: float = 5e-5,
    name: str = "resnet50_v1_5",
) -> keras.Model:
    """Builds a bottleneck ResNet v1.5 returning float32 logits.

    Args:
        input_shape: `(height, width, channels)`.
        num_classes: number of output logits.
        layers: blocks per stage; `(3, 4, 6, 3)` is ResNet-50.
        width: filters of the first stage's 3x3 convolutions (64 in the
            paper); later stages double it.
        cifar_stem: one 3x3/1 convolution instead of 7x7/2 and max-pool.
        l2: L2 penalty on kernels (5e-5 in the loss is weight decay 1e-4).
        name: the model's name.
    """
    inputs = keras.Input(input_shape, name="images")
    if cifar_stem:
        x = _conv(width, 3, 1, l2, "stem_conv")(inputs)
    else:
        x = _strided_conv(inputs, width, 7, 2, l2, "stem_conv")
    x = keras.layers.ReLU(name="stem_relu")(_bn("stem_bn")(x))
    if not cifar_stem:
        x = keras.layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
        x = keras.layers.MaxPooling2D(3, 2, name="stem_pool")(x)
    for stage, blocks in enumerate(layers):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = bottleneck(
                x, width * 2**stage, strides, l2, f"stage{stage + 1}_{block}"
            )
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    logits = keras.layers.Dense(
        num_classes,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
        kernel_regularizer=keras.regularizers.L2(l2) if l2 else None,
        dtype="float32",
        name="logits",
    )(x)
    return keras.Model(inputs, logits, name=name)
