"""The event log and the INFO lines of a real 4-rank job (events_file, log_level = "INFO"):
checkpoints at local, partner and pfs; a node's cache lost and the relaunch rebuilding it from
partner copies; every cache lost and the relaunch reading pfs; a checkpoint that fails; then
`hpcckpt report` on the file the three runs wrote."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from harness import run_mpi

pytestmark = pytest.mark.mpi
PLAN = "1:local,3:partner,5:pfs,7:local,9:partner,11:local,13:local,15:pfs,17:local,19:local"


def test_events_and_info_lines_of_runs_that_lose_a_node_then_every_cache(shm_dir, tmp_path):
    events = tmp_path / "logs" / "events.jsonl"          # its directory is created
    cfg = json.dumps({"events_file": str(events), "log_level": "INFO", "background": True})

    def run(*args, ok=True, env=None):
        res = run_mpi(4, "events_app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--pfs",
                      os.path.join(shm_dir, "pfs"), "--steps", 21, "--plan", PLAN, "--config-json", cfg, *args, env=env)
        assert (res.returncode == 0) == ok, str(res)
        return res

    first = run("--crash-at", 11, ok=False)
    shutil.rmtree(os.path.join(shm_dir, "node1"))
    second = run("--crash-at", 17, ok=False)
    for node in range(4):
        shutil.rmtree(os.path.join(shm_dir, f"node{node}"))
    third = run("--tolerate-write-errors", env={"_HPCCKPT_FAULT": "written:2:19:error"})
    assert "RESTART 9" in second.stdout and "RESTART 15" in third.stdout and "CKPTFAIL 19" in third.stdout

    # the INFO lines, on rank 0 only
    err = first.stderr
    assert "hpcckpt[rank 0] INFO: checkpoint 1 (local): 144.0 KiB in " in err
    assert "checkpoint 3 (partner): 144.0 KiB in " in err and "s (application waited" in err
    assert "; the partner redundancy follows in the background" in err
    assert "; the pfs flush follows in the background" in err
    assert "took" in err and "in the background" in err                  # the existing background lines stay
    assert "hpcckpt[rank 0] INFO: restarted from step 9 (partner): own cache on 3 ranks, rebuilt from partner " \
           "copies on 1; " in second.stderr
    assert "hpcckpt[rank 0] INFO: restarted from step 15 (pfs): read from pfs on 4 ranks; " in third.stderr
    for res in (first, second, third):
        assert "INFO: checkpoint" not in "".join(ln for ln in res.stderr.splitlines(True) if "[rank 0]" not in ln)

    with open(events) as f:
        got = [json.loads(ln) for ln in f]
    assert all(e["v"] == 1 and e["ranks"] == 4 and e["job"] == "ev" for e in got)
    runs = list(dict.fromkeys(e["run"] for e in got))
    assert len(runs) == 3
    by_run = [[e for e in got if e["run"] == r] for r in runs]
    assert [e["event"] for e in by_run[0]][:2] == ["start", "checkpoint"]
    assert all(e["epoch"] == 1 for e in got if e["event"] not in ("start", "fallback"))  # known after restart()

    ckpts = [(e["step"], e["level"]) for e in by_run[0] if e["event"] == "checkpoint"]
    assert ckpts == [(1, "local"), (3, "partner"), (5, "pfs"), (7, "local"), (9, "partner"), (11, "local")]
    said = [ln.split()[1:] for ln in first.stdout.splitlines() if ln.startswith("CKPT ")]
    assert [[str(e["step"]), e["level"], str(e["bytes"])] for e in by_run[0] if e["event"] == "checkpoint"] == said
    assert {e["step"]: e["background"] for e in by_run[0] if e["event"] == "checkpoint"}[3] == "partner redundancy"
    background = [(e["step"], e["work"]) for e in by_run[0] if e["event"] == "background"]
    assert background == [(3, "redundancy"), (5, "flush"), (9, "redundancy")], background
    assert all(e["seconds"] > 0 for e in got if e["event"] in ("checkpoint", "background", "restart"))

    # the relaunch after node 1 was lost: step 11 (local) falls back, step 9 is rebuilt on rank 1
    kinds = [e["event"] for e in by_run[1]]
    assert kinds[:3] == ["start", "fallback", "restart"], kinds
    fallback, restart = by_run[1][1], by_run[1][2]
    assert fallback["step"] == 11 and fallback["source"] == "cache" and "rank 1" in fallback["reason"]
    assert (restart["step"], restart["level"], restart["source"], restart["own"], restart["rebuilt"]) == (
        9, "partner", "partner", 3, 1)
    # every cache lost: pfs
    restart = next(e for e in by_run[2] if e["event"] == "restart")
    assert (restart["step"], restart["level"], restart["source"], restart["own"], restart["rebuilt"]) == (
        15, "pfs", "pfs", 4, 0)
    failure = next(e for e in by_run[2] if e["event"] == "failure")
    assert (failure["op"], failure["step"], failure["error"]) == ("checkpoint", 19, "CheckpointWriteError")
    assert "injected fault" in failure["message"]

    res = subprocess.run([sys.executable, "-m", "hpcckpt", "report", str(events)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and not res.stderr, res.stderr
    lines = [ln.split() for ln in res.stdout.splitlines()]
    assert ["local", "7"] in [ln[:2] for ln in lines] and ["partner", "2"] in [ln[:2] for ln in lines]
    assert ["pfs", "2"] in [ln[:2] for ln in lines]
    assert ["9", "partner", "partner", "3", "1"] in [ln[:5] for ln in lines]
    assert ["15", "pfs", "pfs", "4", "0"] in [ln[:5] for ln in lines]
    assert "fallback: step 11 not restored from cache" in res.stdout
    assert "failure: checkpoint 19 raised CheckpointWriteError" in res.stdout
