"""The edges of tests/mpi/test_edges.py: protect() with rebound names and views, steps of 10**10
and more, in real jobs.

  --cache DIR --pfs DIR           the configured directories ({node} in --cache)
  --config-json JSON              extra Checkpointer keyword arguments
  --mode steps                    restart, check the array bitwise, then checkpoint --steps (a comma list) at --level
  --mode rebind|rebind-on-2|bcast|halo|view
                                  checkpoint steps 0..--until cycling --levels; at --change-at the
                                  application rebinds its array (rebind: pos = pos + 1, on rank 2 only
                                  with rebind-on-2; bcast: pos = comm.bcast(pos)) or keeps using it through a view (halo:
                                  protect u, keep only u[1:-1]; view: protect u[1:-1], keep u)
Prints "RESTART <step|None>", "BITWISE"/"WRONG", "CKPT <step> <level>", "ERR <step> <class> <message>", "DONE".
"""
import argparse
import json
import os

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--pfs", required=True)
p.add_argument("--config-json", default="{}")
p.add_argument("--mode", required=True)
p.add_argument("--steps", default="")
p.add_argument("--level", default="local")
p.add_argument("--levels", default="local,partner,xor,pfs")
p.add_argument("--until", type=int, default=8)
p.add_argument("--change-at", type=int, default=5)
a = p.parse_args()
comm = MPI.COMM_WORLD
rank = comm.rank
N = 1000 + (17 * rank if a.mode != "bcast" else 0)      # bcast: the same size everywhere


def say(line):
    os.write(1, (line + "\n").encode())


def expected(step):
    """The array's value after ``step`` (float64 holds every step up to 2**53 exactly)."""
    return np.arange(N, dtype=np.float64) * 0.5 + float(step) + rank * 1e-3


def data(pos):
    """The N values the application computes: inside the halo of the whole array, or the view."""
    return pos[1:-1] if pos.size == N + 2 else pos


cfg = dict(name="edges", cache_dir=a.cache, pfs_dir=a.pfs, ranks_per_node=1, keep=2, log_level="WARNING")
cfg.update(json.loads(a.config_json))
with hpcckpt.Checkpointer(comm, **cfg) as ckpt:
    if a.mode == "steps":
        u = np.zeros(N)
        ckpt.protect("u", u)
        start = ckpt.restart()
        say(f"RESTART {start}")
        if start is not None:
            say("BITWISE" if u.tobytes() == expected(start).tobytes() else "WRONG")
        for step in (int(s) for s in a.steps.split(",") if s):
            if start is not None and step <= start:
                continue
            u[:] = expected(step)
            ckpt.checkpoint(step, level=a.level)
            say(f"CKPT {step} {a.level}")
    else:
        levels = a.levels.split(",")
        held = np.zeros(N + 2)
        if a.mode == "view":
            ckpt.protect("pos", held[1:-1])          # a view; the application keeps the array it views
            pos = held[1:-1]
        else:
            pos = held
            ckpt.protect("pos", held)
        del held
        start = ckpt.restart()
        say(f"RESTART {start}")
        if start is not None:
            say("BITWISE" if data(pos).tobytes() == expected(start).tobytes() else "WRONG")
        for step in range(0 if start is None else start + 1, a.until + 1):
            if step == a.change_at:
                if a.mode == "rebind" or a.mode == "rebind-on-2" and rank == 2:
                    pos = pos + 1.0
                elif a.mode == "bcast":
                    pos = comm.bcast(pos, root=0)     # a new array on every rank, rank 0 included
                elif a.mode == "halo":
                    pos = pos[1:-1]                   # only the view stays: the halo pattern
                else:
                    pos = pos[:]                      # another view of the array the application keeps
            data(pos)[:] = expected(step)
            level = levels[step % len(levels)]
            try:
                ckpt.checkpoint(step, level=level)
            except hpcckpt.HpcCkptError as e:
                say(f"ERR {step} {type(e).__name__} {' '.join(str(e).split())}")
                break
            say(f"CKPT {step} {level}")
        ckpt.wait()
say("DONE")
