#!/usr/bin/env bash
# The two entry points of the README, each on a fresh machine from a clean clone:
#   ./run.sh demo [demo options]    set up .venv, run the heat-equation crash/restart demo
#   ./run.sh test [pytest options]  set up .venv, run the whole test suite
# Both create (or reuse) the virtual environment .venv beside this file.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${HPCCKPT_VENV:-.venv}
PY=${PYTHON:-python3}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  # Re-install only when the package metadata changed (a stamp beside the venv).
  local stamp="$VENV/.hpcckpt-installed" want
  want=$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -e ".[mpich,test]"
    echo "$want" > "$stamp"
  fi
  export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba-cache}
  export PATH="$PWD/$VENV/bin:$PATH"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo) setup; exec "$VENV/bin/hpcckpt" demo "$@" ;;
  test) setup; exec "$VENV/bin/python" -m pytest "$@" ;;
  *) echo "usage: ./run.sh demo [options] | ./run.sh test [pytest options]" >&2; exit 2 ;;
esac
