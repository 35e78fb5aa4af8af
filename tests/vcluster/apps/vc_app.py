"""A small application for the virtual-cluster tests (tests/vcluster), run by jobs/vcluster mpirun.

    vc_app.py --config RUN.TOML topo
    vc_app.py --config RUN.TOML sim [--steps N] [--every K] [--level L] [--crash-at S --crash-rank R]
                                    [--elastic] [--out DIR] [--no-restart]

topo: every rank prints "TOPO rank=<r> host=<hostname> node=<Checkpointer's node> nodes=<count>
      split=<Topology.build(comm, 'auto').node> cache=<its node-local cache root> exists=<bool>".
sim:  a row-split global field (global layout, so pfs restarts on any rank count) and a global
      clock; without --elastic also a per-rank array of rank-dependent size. Rank R SIGKILLs
      itself after step S's update. --out: rank 0 writes field.npy, every rank own_<r>.npy.
      Prints "RESTART <step|None>", "CKPT <step> <level>", "DONE".
Leaves the `with Checkpointer` block before exiting (an error raised on every rank: exit 3).
"""
import argparse
import os
import signal
import socket

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.topology import Topology

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("mode", choices=["topo", "sim"])
p.add_argument("--steps", type=int, default=20)
p.add_argument("--every", type=int, default=5)
p.add_argument("--level", default="local")
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--elastic", action="store_true")
p.add_argument("--out", default=None)
p.add_argument("--no-restart", action="store_true")
a = p.parse_args()


def say(line):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (line + "\n").encode())


comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
NX, NY = 41, 13
rows = [NX // size + (1 if r < NX % size else 0) for r in range(size)]
row0 = sum(rows[:rank])

try:  # an error hpcckpt raised on every rank leaves the block on every rank (no abort)
    with hpcckpt.Checkpointer(comm, config=a.config) as ckpt:
        if a.mode == "topo":
            split = Topology.build(comm, "auto")
            root = ckpt.cache.root
            say(f"TOPO rank={rank} host={socket.gethostname()} node={ckpt.topology.node} "
                f"nodes={max(ckpt.topology.node_of) + 1} split={split.node} cache={root} "
                f"exists={os.path.isdir(root)}")
        else:
            field = (np.arange(rows[rank] * NY, dtype=np.float64).reshape(rows[rank], NY) + row0 * NY) / 7.0
            clock = np.zeros(1 if rank == 0 else 0, np.int64)
            ckpt.protect("field", field, global_shape=(NX, NY), offset=(row0, 0))
            ckpt.protect("clock", clock, global_shape=(1,), offset=(0 if rank == 0 else 1,))
            own = None
            if not a.elastic:
                own = np.arange(3000 + 257 * rank, dtype=np.float64) * (rank + 1)
                ckpt.protect("own", own)
            start = None if a.no_restart else ckpt.restart()
            if rank == 0:
                say(f"RESTART {start}")
            start_clock = comm.bcast(int(clock[0]) if rank == 0 else None)
            if start is not None:
                assert start_clock == start, (start_clock, start)
            for step in range(0 if start is None else start + 1, a.steps):
                field *= 1.01
                field += np.cos(field) + step
                if own is not None:
                    own *= 1.0001
                    own += np.sin(own[:1]) + step
                if rank == 0:
                    clock[0] = step
                if step == a.crash_at and rank == a.crash_rank:
                    os.kill(os.getpid(), signal.SIGKILL)
                if (step + 1) % a.every == 0:
                    info = ckpt.checkpoint(step, level=a.level)
                    if rank == 0:
                        say(f"CKPT {info.step} {info.level}")
            if a.out:
                os.makedirs(a.out, exist_ok=True)
                whole = comm.gather(field, root=0)
                if rank == 0:
                    np.save(os.path.join(a.out, "field.npy"), np.concatenate(whole))
                if own is not None:
                    np.save(os.path.join(a.out, f"own_{rank}.npy"), own)
except hpcckpt.HpcCkptError as e:
    say(f"ERROR {type(e).__name__} rank={rank} {e}")
    raise SystemExit(3)
comm.Barrier()
if rank == 0:
    say("DONE")
