#!/bin/bash
# local-slurm-stop.sh -- stop the daemons started by jobs/local-slurm-setup.sh, by pid file
# (never by name): every slurmd, then slurmctld, then munged. Harmless when nothing runs.
# STOP_MUNGE=0 leaves munged running.
stop_pidfile() {
  local f=$1 p; [ -s "$f" ] || return 0
  p=$(cat "$f"); kill "$p" 2>/dev/null || { rm -f "$f"; return 0; }
  for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$p" 2>/dev/null && kill -9 "$p"
  rm -f "$f"
}
for f in /run/slurmd-n*.pid; do stop_pidfile "$f"; done
stop_pidfile /run/slurmctld.pid
[ "${STOP_MUNGE:-1}" = 1 ] && stop_pidfile /run/munge/munged.pid
true
