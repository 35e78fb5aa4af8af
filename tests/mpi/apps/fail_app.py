"""One rank fails while the others go on (tests/mpi/test_abort.py). Plain ``mpiexec python``.

--mode raise-in-with     rank 2 raises ValueError inside ``with Checkpointer`` while the others
                         wait in need_checkpoint() (a collective)
--mode raise-outside     rank 1 raises after the Checkpointer is closed while the others wait in
                         the application's own Barrier (uncaught: sys.excepthook)
--mode protect-error     rank 3 protects a non-contiguous array (ProtectError) before restart()
--mode fault             every rank checkpoints; the _HPCCKPT_FAULT environment variable makes
                         one rank raise inside checkpoint() (KeyboardInterrupt or SystemExit)
--mode fault-uncaught    the same, and nobody catches what checkpoint() raises
--mode flush-then-raise  async pfs checkpoint, then every rank raises while the flush runs
--mode async-scavenge    async pfs checkpoint, then scavenge() at once (the end-of-job sequence)
Prints "CAUGHT <Class> rank=<r> <message>" for errors it catches itself, "DONE" at the end.
"""
import argparse
import json
import os

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--mode", required=True)
p.add_argument("--config-json", default="{}")
a = p.parse_args()
comm = MPI.COMM_WORLD
rank = comm.rank


def say(line):
    os.write(1, (line + "\n").encode())


kwargs = dict(name="fail", cache_dir=a.cache, pfs_dir=os.path.join(os.path.dirname(a.cache), "pfs"),
              ranks_per_node=1, log_level="WARNING")
kwargs.update(json.loads(a.config_json))
u = np.arange(1 << 16, dtype=np.float64) * (rank + 1)

if a.mode == "raise-outside":
    with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
        ckpt.checkpoint(0, {"u": u})
    if rank == 1:
        raise ValueError("rank 1 failed after the checkpointer was closed")
    comm.Barrier()
    say("DONE")
    raise SystemExit(0)

with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
    if a.mode == "raise-in-with":
        for step in range(1000):
            if step == 3 and rank == 2:
                raise ValueError("rank 2 failed in the application's step")
            ckpt.need_checkpoint(step)
    elif a.mode == "protect-error":
        ckpt.protect("u", u if rank != 3 else np.zeros((4, 4))[:, 1])
        ckpt.restart()
    elif a.mode == "fault":
        for step in range(3):
            try:
                ckpt.checkpoint(step, {"u": u})
            except hpcckpt.HpcCkptError as e:
                say(f"CAUGHT {type(e).__name__} rank={rank} {e}")
            except (KeyboardInterrupt, SystemExit) as e:
                say(f"CAUGHT {type(e).__name__} rank={rank} {e}")
    elif a.mode == "fault-uncaught":
        for step in range(3):
            ckpt.checkpoint(step, {"u": u})
    elif a.mode == "flush-then-raise":
        ckpt.checkpoint(0, {"u": u}, level="pfs")
        raise RuntimeError("every rank fails while the flush runs")
    elif a.mode == "async-scavenge":
        ckpt.checkpoint(0, {"u": u}, level="local")
        ckpt.checkpoint(1, {"u": u}, level="pfs")
        copied = ckpt.scavenge()
        if rank == 0:
            say(f"SCAVENGED {copied}")
comm.Barrier()
if rank == 0:
    say("DONE")
