"""Record tests/unit/data/events.jsonl: the event log of a real 4-rank job (tests/mpi/apps/events_app.py).

    python tests/tools/make_events.py OUT.jsonl

Three runs of one job, 4 ranks on 4 (virtual) nodes, level_mtbf set (the policy sizes its
intervals with Daly), background = true, 0.05 s of "compute" per step, checkpoints local every 2
steps, partner every 6, pfs every 12:
  1. steps 0-19, then rank 1 is killed; node 1's cache is deleted;
  2. restarts: step 19 (local) falls back, step 17 (partner) is rebuilt on rank 1 from its partner
     copy; steps 18-37, then rank 1 is killed again; every node's cache is deleted;
  3. restarts from pfs (step 35); step 41's checkpoint fails (an injected ENOSPC on rank 2) and
     the run goes on to step 47.
tests/unit/test_events.py and test_report_events.py read the file; regenerate it when the event
schema changes (and say so in docs/EVENTS.md).
"""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mpi"))

from harness import run_mpi  # noqa: E402

PLAN = "every:2:local,every:6:partner,every:12:pfs"
CONFIG = {"level_mtbf": {"local": "30s", "partner": "2min", "pfs": "10min"}, "background": True}


def main(out):
    work = tempfile.mkdtemp(prefix="hpcckpt-events-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    events = os.path.join(work, "events.jsonl")
    cache = os.path.join(work, "node{node}")
    cfg = json.dumps({**CONFIG, "events_file": events})
    try:
        def run(*args, env=None, ok=True):
            res = run_mpi(4, "events_app.py", "--cache", cache, "--pfs", os.path.join(work, "pfs"), "--steps", 48,
                          "--sleep", 0.05, "--plan", PLAN, "--config-json", cfg, *args, env=env, timeout=300)
            assert (res.returncode == 0) == ok, str(res)
            return res
        run("--crash-at", 19, ok=False)
        shutil.rmtree(os.path.join(work, "node1"))
        assert "RESTART 17" in run("--crash-at", 37, ok=False).stdout
        for node in range(4):
            shutil.rmtree(os.path.join(work, f"node{node}"))
        res = run("--tolerate-write-errors", env={"_HPCCKPT_FAULT": "written:2:41:error"})
        assert "RESTART 35" in res.stdout and "CKPTFAIL 41" in res.stdout, str(res)
        shutil.copyfile(events, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(out) as f:
        print(f"{out}: {sum(1 for _ in f)} events")


if __name__ == "__main__":
    main(sys.argv[1])
