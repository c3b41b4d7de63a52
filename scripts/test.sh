#!/usr/bin/env bash
# Sets up, then runs every test, the multi-worker and slow ones included.
# (Plain `pytest` runs only the fast ones.) Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m pytest -m "" -q "$@"
