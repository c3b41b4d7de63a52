"""Sources and build helper of tfgc's TensorFlow custom ops."""
