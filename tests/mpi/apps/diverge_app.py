"""An application whose ranks make different hpcckpt calls (a bug in the application: every call
is collective). tests/mpi/test_abort.py checks that the job ends, with the calls named.

    mpiexec -n 2 python diverge_app.py DIR CASE

CASE: extra-checkpoint (rank 0 checkpoints once more, rank 1 goes on to close()),
need-vs-checkpoint, restart-vs-checkpoint, should-exit-vs-checkpoint, wait-vs-checkpoint (rank 0
makes the first call, rank 1 the second), exit0-then-close / exit0-vs-checkpoint (rank 1
calls sys.exit(0) in the with block; rank 0 goes on to close(), or checkpoints once more). Prints "CAUGHT <Class> <message>" per rank that
catches the error, then "DONE" per rank that gets to the end.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import hpcckpt

comm = MPI.COMM_WORLD
root, case = sys.argv[1], sys.argv[2]
u = np.arange(1000.0) + comm.rank
first = comm.rank == 0
with hpcckpt.Checkpointer(comm, name="diverge", cache_dir=os.path.join(root, "node{node}"),
                          pfs_dir=os.path.join(root, "pfs"), ranks_per_node=1, log_level="ERROR") as ck:
    ck.checkpoint(1, {"u": u}, level="local")
    try:
        if case == "extra-checkpoint":
            if first:
                ck.checkpoint(2, {"u": u}, level="local")
        elif case.startswith("exit0"):
            if not first:
                sys.exit(0)
            if case == "exit0-vs-checkpoint":
                ck.checkpoint(2, {"u": u}, level="local")
        elif first:
            {"need-vs-checkpoint": lambda: ck.need_checkpoint(5), "restart-vs-checkpoint": lambda: ck.restart({"u": u}),
             "should-exit-vs-checkpoint": ck.should_exit, "wait-vs-checkpoint": ck.wait}[case]()
        else:
            ck.checkpoint(5, {"u": u}, level="local")
    except hpcckpt.HpcCkptError as e:
        os.write(1, f"CAUGHT {type(e).__name__} {e}\n".encode())
os.write(1, b"DONE\n")
