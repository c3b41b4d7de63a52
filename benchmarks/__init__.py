"""Benchmarks; `python -m benchmarks.run` is the lab (see lab/)."""
