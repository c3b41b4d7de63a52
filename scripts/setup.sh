#!/usr/bin/env bash
# Creates .venv (once) and installs tfgc with the CPU TensorFlow build and
# everything the demo and the tests need. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
echo "[setup] installing tfgc[cpu,demo,test] into .venv (first time: ~1 min)"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[cpu,demo,test]"
echo "[setup] done"
