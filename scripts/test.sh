#!/usr/bin/env bash
# Sets up, then runs every test, the multi-worker and slow ones included.
# (Plain `pytest` runs only the fast ones.) Extra arguments go to pytest.
# With TFGC_REQUIRE_CUSTOM_OPS=1 (.ci/run sets it) the run fails at once
# when the compiled ops did not build, instead of testing the fallback.
# With TFGC_REQUIRE_CUDA_CHECKS=1 (.ci/run sets it too) the CUDA compile
# check in tests/custom_ops/test_cuda_build.py fails instead of skipping without CUDA
# headers or nvcc (setup.sh then installs the headers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m pytest -m "" -q "$@"
