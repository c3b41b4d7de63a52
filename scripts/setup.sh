#!/usr/bin/env bash
# Creates .venv (once) and installs tfgc with the CPU TensorFlow build, its
# compiled custom ops, and everything the demo and the tests need. Safe to
# run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet)
echo "[setup] installing TensorFlow and tfgc[cpu,demo,models,test,bench] (first time: ~2 min)"
"${pip[@]}" --upgrade pip "setuptools>=68" wheel
# The custom ops are compiled against the installed TensorFlow, so it goes
# in first (same window as setup.py's `cpu` extra) and tfgc is built
# without build isolation.
"${pip[@]}" "tensorflow-cpu>=2.21,<2.22"
"${pip[@]}" --no-build-isolation -e ".[cpu,demo,models,test,bench]"
# With TFGC_REQUIRE_CUDA_CHECKS=1 (.ci/run sets it), also the CUDA 12.5
# headers that TensorFlow 2.21's GPU build was compiled with (23 MB from
# PyPI; the nvcc package for its crt/ headers, it has no nvcc), so that the
# tests compile the kernels' GOOGLE_CUDA glue (tests/custom_ops/test_cuda_build.py).
if [ "${TFGC_REQUIRE_CUDA_CHECKS:-0}" = 1 ]; then
  echo "[setup] installing CUDA 12 headers for the GOOGLE_CUDA compile check"
  "${pip[@]}" "nvidia-cuda-runtime-cu12==12.5.82" \
    "nvidia-cuda-nvcc-cu12==12.5.82"
fi
.venv/bin/python -c "import tfgc; print('[setup] done; compiled custom ops in use:', tfgc.ops.using_custom_ops())"
