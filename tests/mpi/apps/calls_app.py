"""Calls that the ranks make differently, under real mpiexec (tests/mpi/test_abort.py).

--case need-disagree: every rank passes need_checkpoint() its own step, then rank 0 alone passes
  a string: an HpcCkptError on every rank each time, then the job goes on.
--case thread-level LEVEL: MPI initialised with mpi4py.rc.thread_level = LEVEL and
  background = true: checkpoints at --level work synchronously, with one warning in the job.
Prints "ERROR <Class> rank=<r> <message>" for every HpcCkptError caught, "OK <step>" per commit.
"""
import argparse
import os

import mpi4py

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--case", required=True)
p.add_argument("--thread-level", default="multiple")
p.add_argument("--level", default="partner")
a = p.parse_args()
mpi4py.rc.thread_level = a.thread_level
import numpy as np                      # noqa: E402
from mpi4py import MPI                  # noqa: E402

import hpcckpt                          # noqa: E402

comm = MPI.COMM_WORLD
rank = comm.rank


def say(line):
    os.write(1, (line + "\n").encode())


cfg = {"name": "calls", "cache_dir": a.cache, "ranks_per_node": 1, "background": True, "log_level": "WARNING"}
with hpcckpt.Checkpointer(comm, config=cfg) as ckpt:
    u = np.arange(100.0) + rank
    ckpt.protect("u", u)
    if a.case == "need-disagree":
        for step in (rank, "x" if rank == 0 else 1):
            try:
                ckpt.need_checkpoint(step)
            except hpcckpt.HpcCkptError as e:
                say(f"ERROR {type(e).__name__} rank={rank} {e}")
        say(f"OK {ckpt.checkpoint(2, level=a.level).step}")
    elif a.case == "thread-level":
        for step in range(3):
            say(f"OK {ckpt.checkpoint(step, level=a.level).step}")
        ckpt.wait()
