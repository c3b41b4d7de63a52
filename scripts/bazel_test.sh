#!/usr/bin/env bash
# Builds tfgc's custom ops with Bazel and runs their tests: `bazel test //...`
# with Debian's Bazel 4.2.3, fully offline (docs/bazel.md).
#
# Installs bazel-bootstrap, bazel-rules-java and bazel-platforms from Debian
# when Bazel or the rules are missing (needs root and apt-get). The Python
# environment with TensorFlow is $TFGC_VENV (default .venv, made by
# scripts/setup.sh); its bin/ goes first on PATH, so Bazel compiles against
# its TensorFlow and runs the tests with its python3.
# Extra arguments go to `bazel test` (e.g. --test_output=all).
# TFGC_BAZEL_KEEP_SERVER=1 leaves the Bazel server running afterwards
# (faster reruns); by default it is shut down so nothing outlives the script.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[bazel_test] $*"; }
die() { echo "[bazel_test] error: $*" >&2; exit 2; }

VENV="${TFGC_VENV:-.venv}"
[ -x "$VENV/bin/python3" ] ||
  die "no Python environment at $VENV (run scripts/setup.sh, or set TFGC_VENV)"
VENV="$(cd "$VENV" && pwd)"

# Bazel 4.2.3 and the rule sets it would otherwise download, from Debian.
need_apt=()
command -v bazel >/dev/null || need_apt+=(bazel-bootstrap)
[ -f /usr/share/bazel/rules/java/WORKSPACE ] || need_apt+=(bazel-rules-java)
[ -d /usr/share/bazel/tools/platforms ] || need_apt+=(bazel-platforms)
if [ ${#need_apt[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null ||
    die "missing ${need_apt[*]}: run as root on Debian, or install them:" \
        "apt-get install bazel-bootstrap bazel-rules-java bazel-platforms"
  log "installing bazel-bootstrap bazel-rules-java bazel-platforms (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends \
    bazel-bootstrap bazel-rules-java bazel-platforms >/dev/null
fi

export PATH="$VENV/bin:$PATH"
python3 -c "import tensorflow" 2>/dev/null ||
  die "$VENV/bin/python3 cannot import tensorflow (run scripts/setup.sh)"
log "$(bazel --version 2>/dev/null | tail -1 | sed 's/no_version/4.2.3 (Debian)/'), python3: $(command -v python3)"

start=$(date +%s)
rc=0
bazel test //... "$@" || rc=$?
log "bazel test //... took $(( $(date +%s) - start )) s, exit status $rc"
if [ "${TFGC_BAZEL_KEEP_SERVER:-0}" = 0 ]; then
  bazel shutdown >/dev/null 2>&1 || true
fi
exit "$rc"
