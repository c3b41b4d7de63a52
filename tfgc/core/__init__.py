"""The contract that compressors, communicators and the optimizer share.

`wire` says what goes between workers (the collective kinds, payload
bytes, traffic counts), `compressor` what a compressor is (its declared
`Spec` and its methods), `cost_model` what a compressor may know of the
network's costs. Compressors and communicators import this package and
never each other.
"""
