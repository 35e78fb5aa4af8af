"""An application whose state has a global layout, so its pfs checkpoints restart on any rank count.

A 2-D field split by rows (uneven) and a global step counter kept by rank 0 (the other ranks hold
an empty block of it). Options: --cache --steps --every --crash-at --out (rank 0 writes the
assembled field) --local-between (a local checkpoint at every step between the pfs ones).
Prints "RESTART <step|None>", "DONE".
"""
import argparse
import json
import os
import signal

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--every", type=int, default=4)
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--out", default=None)
p.add_argument("--config-json", default="{}")
p.add_argument("--local-between", action="store_true")
a = p.parse_args()

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
NX, NY = 37, 11
rows = [NX // size + (1 if r < NX % size else 0) for r in range(size)]
row0 = sum(rows[:rank])
cfg = dict(name="elastic", cache_dir=a.cache, pfs_dir=os.path.join(os.path.dirname(a.cache), "pfs"),
           ranks_per_node=2)
cfg.update(json.loads(a.config_json))
try:  # an error hpcckpt raised on every rank leaves the block on every rank (no abort)
    with hpcckpt.Checkpointer(comm, **cfg) as ckpt:
        field = (np.arange(rows[rank] * NY, dtype=np.float64).reshape(rows[rank], NY) + row0 * NY) / 7.0
        clock = np.zeros(1 if rank == 0 else 0, np.int64)
        ckpt.protect("field", field, global_shape=(NX, NY), offset=(row0, 0))
        ckpt.protect("clock", clock, global_shape=(1,), offset=(0 if rank == 0 else 1,))
        try:
            start = ckpt.restart()
        except hpcckpt.HpcCkptError as e:
            os.write(1, f"ERROR {type(e).__name__} rank={rank} {e}\n".encode())
            raise  # agreed: every rank leaves the block with it
        if rank == 0:
            os.write(1, f"RESTART {start}\n".encode())
        start_clock = comm.bcast(int(clock[0]) if rank == 0 else None)
        if start is not None:
            assert start_clock == start, (start_clock, start)
        for step in range(0 if start is None else start + 1, a.steps):
            field *= 1.01
            field += np.cos(field) + step
            if rank == 0:
                clock[0] = step
            if step == a.crash_at and rank == size - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if (step + 1) % a.every == 0:
                ckpt.checkpoint(step, level="pfs")
            elif a.local_between:
                ckpt.checkpoint(step, level="local")
except hpcckpt.HpcCkptError as e:
    os.write(1, f"ERROR {type(e).__name__} rank={rank} {e}\n".encode())
    raise SystemExit(3)
whole = comm.gather(field, root=0)
if rank == 0:
    if a.out:
        np.save(a.out, np.concatenate(whole))
    os.write(1, b"DONE\n")
