"""The patterns of docs/PORTING.md under real mpiexec (tests/mpi/test_porting.py).

--mode close-uncaught | close-caught | close-finally: the ``ckpt = Checkpointer(...)`` ...
``ckpt.close()`` form (no ``with``); rank --fail-rank raises ValueError at step --fail-at
(``uncaught``: nothing catches it; ``caught``: the rank catches it, leaves its loop and calls
close(); ``finally``: close() in a ``finally:``; ``agreed``: every rank gets an HpcCkptError at
step --fail-at, catches it, then close() in a ``finally:``). Each rank prints "RESULT <rank> <what
ended it>".
--mode placeholder: a value created inside the loop (None before the first step) saved in the
state dict and restored through a None placeholder; prints "RESTART <step>" and "VALUE ...".
--mode rows: ROWS arrays with --counts rows on each rank checkpointed at pfs (--restart:
restored, perhaps on another rank count); prints "ROWS <rank> <first id> <count>".
--mode dtype: a state dict of "u" (float64) and --names more arrays "x<i>" (int32), with the
dtype of key --differ changed on the ranks but 0 (none: ''); prints "CHECKPOINTED <rank> <step> <level>" or
"ERROR <rank> <class> <message>".
"""
import argparse
import json
import os

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--mode", required=True)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--fail-at", type=int, default=5)
p.add_argument("--fail-rank", type=int, default=2)
p.add_argument("--restart", action="store_true")
p.add_argument("--differ", default="u", help="dtype mode: the key whose dtype differs on ranks > 0 ('' none)")
p.add_argument("--names", type=int, default=0)
p.add_argument("--counts", default="", help="rows mode: the rows of each rank, comma-separated")
p.add_argument("--config-json", default="{}")
a = p.parse_args()
comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.rank
if a.mode.startswith("close-"):
    # each rank's stderr in a file of its own (ROOT/stderr.rank<R>): MPICH's mpiexec can drop the
    # output of a job that MPI_Abort ends, and these modes check what the aborting rank printed
    os.dup2(os.open(os.path.join(a.root, f"stderr.rank{rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)


def say(line):
    """One write per line: the lines of different ranks never interleave."""
    os.write(1, (line + "\n").encode())


def make():
    kw = dict(name=a.mode, cache_dir=os.path.join(a.root, "node{node}"), pfs_dir=os.path.join(a.root, "pfs"),
              ranks_per_node=1, group_size=4)
    kw.update(json.loads(a.config_json))
    return hpcckpt.Checkpointer(comm, **kw)


def loop(ckpt, state):
    for step in range(a.steps):
        state["u"] += 1.0
        if step == a.fail_at and rank == a.fail_rank:
            raise ValueError(f"rank {rank} failed at step {step}")
        level = ckpt.need_checkpoint(step)
        if level:
            ckpt.checkpoint(step, state, level=level)


if a.mode.startswith("close-"):
    ckpt = make()
    state = {"u": np.zeros(100)}
    ckpt.restart(state)
    if a.mode == "close-uncaught":
        loop(ckpt, state)
        ckpt.close()
        say(f"RESULT {rank} finished")
    elif a.mode == "close-caught":
        try:
            loop(ckpt, state)
        except ValueError as e:
            say(f"RESULT {rank} caught {e}")
        try:
            ckpt.close()
        except hpcckpt.HpcCkptError as e:
            say(f"RESULT {rank} close() raised {type(e).__name__}: {e}")
            raise SystemExit(3)
        say(f"RESULT {rank} closed")
    elif a.mode == "close-agreed":
        try:
            for step in range(a.steps):
                if step == a.fail_at:
                    ckpt.checkpoint(step, state, level="nonsense")     # an HpcCkptError on every rank
        except hpcckpt.HpcCkptError as e:
            say(f"RESULT {rank} caught {type(e).__name__}")
        finally:
            ckpt.close()
        say(f"RESULT {rank} closed")
    else:   # close-finally
        try:
            loop(ckpt, state)
        finally:
            ckpt.close()
        say(f"RESULT {rank} finished")

elif a.mode == "placeholder":
    ckpt = make()
    u = np.zeros(100)
    table = None                               # created inside the loop, at the first step
    state = {"u": u, "table": None}            # None: a placeholder for whatever was checkpointed
    step = ckpt.restart(state)
    say(f"RESTART {step}")
    if step is not None:
        u, table = state["u"], state["table"]
    for step in range(0 if step is None else step + 1, a.steps):
        if table is None:
            table = np.arange(5.0) * (rank + 1)
        u += 1.0
        table = table + 1.0
        if step == a.fail_at:
            break                              # the "crash": nothing after step fail_at - 1 was checkpointed
        ckpt.checkpoint(step, {"u": u, "table": table}, level="partner")
    say(f"VALUE {rank} {float(u[0])} {table.tolist()}")
    ckpt.close()

elif a.mode == "rows":
    ckpt = make()
    for name in ("ids", "pos"):
        ckpt.layout(name, hpcckpt.ROWS)
    if a.restart:
        state = {"ids": np.empty(0, np.int64), "pos": np.empty((0, 3))}
        step = ckpt.restart(state)
        ids = state["ids"]
        assert step == 1 and np.array_equal(state["pos"][:, 0], ids.astype(float)), "WRONG DATA"
        say(f"ROWS {rank} {int(ids[0]) if ids.size else -1} {ids.size}")
    else:
        counts = [int(c) for c in a.counts.split(",")]
        start = sum(counts[:rank])
        ids = np.arange(start, start + counts[rank], dtype=np.int64)
        ckpt.checkpoint(1, {"ids": ids, "pos": np.repeat(ids.astype(float)[:, None], 3, axis=1)}, level="pfs")
    ckpt.close()

elif a.mode == "dtype":
    with make() as ckpt:
        state = {"u": np.zeros(10), **{f"x{i}": np.zeros(3, np.int32) for i in range(a.names)}}
        if rank > 0 and a.differ:
            state[a.differ] = state[a.differ].astype(np.float32 if a.differ == "u" else np.int64)
        if rank == 0:
            state["only0"] = np.zeros(2, np.int8)      # keys may differ between ranks
        for step in range(a.steps):
            level = ckpt.need_checkpoint(step)
            if not level:
                continue
            try:
                ckpt.checkpoint(step, state, level=level)
                say(f"CHECKPOINTED {rank} {step} {level}")
            except hpcckpt.HpcCkptError as e:
                say(f"ERROR {rank} {type(e).__name__} {e}")
                break
