"""The library as a guest in the application's job (tests/mpi/test_guest.py).

--wildcard LEVELS   every rank keeps ``comm.irecv(source=ANY_SOURCE, tag=ANY_TAG)`` posted on the
                    application's communicator while it takes checkpoints at each level of the
                    comma-separated list; at the end the application sends the message that
                    receive is waiting for, and checks it got that one (a library message taken
                    by it would be a wrong message or a hang)
--count             counts the bytes mpi4py unpickles on each rank during need_checkpoint(),
                    checkpoint() at the local level and restart(): prints "UNPICKLED <call> <bytes>"
                    per rank; on the success path they must not grow with the number of ranks
"""
import argparse
import json
import os
import pickle

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--wildcard", default=None)
p.add_argument("--count", action="store_true")
p.add_argument("--config-json", default="{}")
a = p.parse_args()
comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
unpickled = [0]


def loads(data, *args, **kwargs):
    unpickled[0] += len(data)
    return pickle.loads(data, *args, **kwargs)


MPI.pickle.__init__(pickle.dumps, loads)


def say(line):
    os.write(1, (line + "\n").encode())


kwargs = dict(name="guest", cache_dir=a.cache, pfs_dir=os.path.join(os.path.dirname(a.cache), "pfs"),
              ranks_per_node=1, log_level="ERROR", group_size=4)
kwargs.update(json.loads(a.config_json))
u = np.arange(4096, dtype=np.float64) * (rank + 1)
with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
    if a.wildcard:
        req = comm.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        for step, level in enumerate(a.wildcard.split(",")):
            ckpt.checkpoint(step, {"u": u}, level=level)
            u += 1
        ckpt.wait()
        comm.send(("application", rank), dest=(rank + 1) % size, tag=7)
        got = req.wait()
        assert got == ("application", (rank - 1) % size), got
        say(f"WILDCARD OK rank={rank}")
    if a.count:
        ckpt.checkpoint(100, {"u": u}, level="local")          # warm up: first-call work
        for call, fn in (("need_checkpoint", lambda: ckpt.need_checkpoint(101)),
                         ("checkpoint", lambda: ckpt.checkpoint(102, {"u": u}, level="local"))):
            unpickled[0] = 0
            fn()
            say(f"UNPICKLED {call} {unpickled[0]} rank={rank}")
if a.count:
    with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
        state = {"u": np.empty_like(u)}
        unpickled[0] = 0
        step = ckpt.restart(state)
        say(f"UNPICKLED restart {unpickled[0]} rank={rank} step={step}")
comm.Barrier()
if rank == 0:
    say("DONE")
