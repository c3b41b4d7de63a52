"""Training mains that show tfgc on standard models (absl flags, Keras)."""
