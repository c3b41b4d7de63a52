"""Keras integration."""

from tfgc.optimizers.compressed_optimizer import CompressedOptimizer

__all__ = ["CompressedOptimizer"]
