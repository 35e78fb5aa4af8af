"""A global array cut into row blocks, checkpointed, then restarted on the same rank count with
each rank declaring a block: its own (--same) or the block of rank size-1-r (a renumbered
decomposition, as Cart_create(reorder=True) may give on a relaunch).

    mpiexec -n N python reblock_app.py DIR save LEVEL [--protect]
    mpiexec -n N python reblock_app.py DIR load [--same] [--protect]

load prints (rank 0, a line per rank) "rank=R step=S match=1|0" (match: the restored block equals the rows it
declares), or "ERROR ClassName message" when restart() raises.
"""
import argparse
import os

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("mode", choices=("save", "load"))
p.add_argument("level", nargs="?", default="local")
p.add_argument("--same", action="store_true")
p.add_argument("--protect", action="store_true", help="protect(global_shape=, offset=) instead of a state dict")
args = p.parse_args()

comm = MPI.COMM_WORLD
rows = 4
shape = (rows * comm.size, 3)
whole = np.arange(shape[0] * shape[1], dtype=np.float64).reshape(shape)
block = comm.rank if args.mode == "save" or args.same else comm.size - 1 - comm.rank
lo = block * rows
cfg = {"name": "reblock", "cache_dir": os.path.join(args.dir, "node{node}"), "pfs_dir": os.path.join(args.dir, "pfs"),
       "ranks_per_node": 1, "log_level": "WARNING"}
with hpcckpt.Checkpointer(comm, config=cfg) as ck:
    u = whole[lo:lo + rows].copy() if args.mode == "save" else np.zeros((rows, shape[1]))
    state = {"t": 1.5}
    if args.protect:
        ck.protect("u", u, global_shape=shape, offset=(lo, 0))
    else:
        ck.layout("u", hpcckpt.Block(shape, (lo, 0)))
        state["u"] = u
    if args.mode == "save":
        ck.checkpoint(3, state, level=args.level)
    else:
        try:
            step = ck.restart(state)
        except hpcckpt.HpcCkptError as e:
            line = f"ERROR {type(e).__name__} {e}"
        else:
            got = u if args.protect else state["u"]
            line = f"rank={comm.rank} step={step} match={int(np.array_equal(got, whole[lo:lo + rows]))}"
        lines = comm.gather(line, root=0)      # one writer: lines of several ranks do not interleave
        if comm.rank == 0:
            print("\n".join(lines), flush=True)
