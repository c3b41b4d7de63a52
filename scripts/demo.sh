#!/usr/bin/env bash
# The main job: sets up, then trains on 2 local workers (dense vs compressed)
# and prints loss and bytes sent per step. Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The launcher keeps TensorFlow's logs at warning level (--verbose: all).
exec .venv/bin/python -m tfgc.launch -n 2 -- \
  .venv/bin/python -m examples.digits_demo "$@"
