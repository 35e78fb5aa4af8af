"""An application that checkpoints at the levels a plan names, for the event-log tests
(tests/mpi/test_events_job.py; tests/tools/make_events.py records tests/unit/data/events.jsonl with it).

  --cache DIR --pfs DIR --steps N     the node caches (with {node}), the pfs directory, the steps
  --plan "1:local,3:partner,5:pfs"    checkpoint after step S at level L; "every:K:L" adds L every K steps
  --sleep S                           seconds of "compute" per step
  --crash-at S                        every rank finishes step S's checkpoint, then rank --crash-rank is killed
  --config-json JSON                  Checkpointer keyword arguments (events_file, log_level, ...)
  --tolerate-write-errors             a CheckpointWriteError prints CKPTFAIL and the run goes on
Prints "RESTART <step|None>", "CKPT <step> <level> <bytes>", "DONE" (rank 0).
"""
import argparse
import json
import os
import signal
import time

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.levels.registry import LEVELS

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--pfs", required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--plan", default="")
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--n", type=int, default=4096)
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=1)
p.add_argument("--config-json", default="{}")
p.add_argument("--tolerate-write-errors", action="store_true")
a = p.parse_args()

plan, every = {}, []
for item in filter(None, a.plan.split(",")):
    parts = item.split(":")
    if parts[0] == "every":
        every.append((int(parts[1]), parts[2]))
    else:
        plan[int(parts[0])] = parts[1]


def level_at(step):
    if step in plan:
        return plan[step]
    due = [lv for k, lv in every if (step + 1) % k == 0]
    return max(due, key=LEVELS.index) if due else None


def say(line):
    os.write(1, (line + "\n").encode())


comm = MPI.COMM_WORLD
kwargs = dict(name="ev", cache_dir=a.cache, pfs_dir=a.pfs, ranks_per_node=1)
kwargs.update(json.loads(a.config_json))
try:
    with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
        state = {"u": np.arange(a.n, dtype=np.float64) * (comm.rank + 1), "step": -1}
        start = ckpt.restart(state)
        if comm.rank == 0:
            say(f"RESTART {start}")
        assert start is None or state["step"] == start, (state["step"], start)
        for step in range(0 if start is None else start + 1, a.steps):
            time.sleep(a.sleep)
            state["u"] += step
            state["step"] = step
            level = level_at(step)
            if level:
                try:
                    info = ckpt.checkpoint(step, state, level=level)
                except hpcckpt.CheckpointWriteError as e:
                    if not a.tolerate_write_errors:
                        raise
                    if comm.rank == 0:
                        say(f"CKPTFAIL {step} {type(e).__name__}")
                    continue
                if comm.rank == 0:
                    say(f"CKPT {info.step} {info.level} {info.bytes}")
            if step == a.crash_at:
                ckpt.wait()
                comm.Barrier()
                if comm.rank == a.crash_rank:
                    os.kill(os.getpid(), signal.SIGKILL)
except hpcckpt.HpcCkptError as e:
    say(f"ERROR {type(e).__name__} rank={comm.rank} {e}")
    raise SystemExit(3)
comm.Barrier()
if comm.rank == 0:
    say("DONE")
