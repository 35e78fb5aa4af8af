"""Drive hpcckpt.levels.pfs.PfsStore directly, for tests/mpi/test_pfs.py.

    pfs_app.py --dir PFS_DIR [--rpn N] ACTION [ACTION ...]

Arrays (regenerated deterministically from the step and the world size):
  field  float64 (203, 67)  global, split by rows, uneven (rank r holds about r+1 shares)
  cols   int32   (11, 53)   global, split by columns, uneven
  line   float32 (1001,)    global, 1-D, uneven
  own    float64 (5+3r,)    per rank
  it     int64   ()         per rank
Actions, run in order:
  save:S  save-global:S (only the global arrays)  restore:S  restore-global:S  restore-badshape:S
  restore-baddtype:S  verify:S  steps  retire:K  describe:S
Every rank prints "ERROR <action> <Class> rank=<r> <message>" for an HpcCkptError and goes on
with the next action; after a failed restore it prints "UNTOUCHED <action> rank=<r> <bool>".
Rank 0 prints "OK <action>", "STEPS a,b,c", "DESCRIBE <json>", "MATCH <action> <name> <bool>".
Faults: the environment variable _HPCCKPT_FAULT (hpcckpt.faults), e.g. "pfs-write:2:7" kills
rank 2 half-way through writing step 7.
"""
import argparse
import json
import os

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.levels.pfs import PfsStore
from hpcckpt.levels.pfs_items import items_from_arrays
from hpcckpt.topology import Topology

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--name", default="pfsapp")
p.add_argument("--rpn", type=int, default=2)
p.add_argument("actions", nargs="+")
a = p.parse_args()

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
GLOBAL = {"field": ((203, 67), np.float64, 0), "cols": ((11, 53), np.int32, 1), "line": ((1001,), np.float32, 0)}


def say(line):
    os.write(1, (line + "\n").encode())


def split(n, parts):
    """Uneven split of n into parts: part r gets about (r+1) shares."""
    w = np.arange(1, parts + 1)
    bounds = np.concatenate([[0], np.round(n * np.cumsum(w) / w.sum()).astype(int)])
    return [(int(bounds[r]), int(bounds[r + 1] - bounds[r])) for r in range(parts)]


def global_value(name, step):
    shape, dtype, _ = GLOBAL[name]
    idx = np.indices(shape).reshape(len(shape), -1)
    flat = np.sin(idx[0] * 0.37 + step) * 1e3 + idx.sum(axis=0) * 7.0 + step
    return flat.reshape(shape).astype(dtype)


def my_block(name, r=rank, n=size):
    shape, _, axis = GLOBAL[name]
    start, count = split(shape[axis], n)[r]
    offset = tuple(start if d == axis else 0 for d in range(len(shape)))
    local = tuple(count if d == axis else shape[d] for d in range(len(shape)))
    return offset, local


def make_arrays(step, fill=None, only_global=False, bad=None):
    out = []
    for name, (gshape, dtype, _) in GLOBAL.items():
        offset, local = my_block(name)
        if bad == "shape" and name == "field":
            gshape = (gshape[0] + 1, gshape[1])
        if bad == "dtype" and name == "line":
            dtype = np.float64
        if fill is None:
            arr = np.ascontiguousarray(global_value(name, step)[tuple(slice(o, o + n) for o, n in zip(offset, local))])
        else:
            arr = np.full(local, fill, dtype)
        out.append((name, arr.astype(dtype, copy=False), gshape, offset))
    if not only_global:
        own = np.arange(5 + 3 * rank, dtype=np.float64) * (step + 1) + rank / 7
        it = np.array(step * 100 + rank, np.int64)
        if fill is not None:
            own, it = np.full_like(own, fill), np.array(fill, np.int64)
        out += [("own", own, None, None), ("it", it, None, None)]
    return out


def check_restored(action, step, arrays, only_global):
    ok = True
    for name, arr, gshape, offset in arrays:
        if gshape is not None:
            blocks = comm.gather((offset, arr), root=0)
            if rank == 0:
                whole = np.full(gshape, -1, arr.dtype)
                for off, blk in blocks:
                    whole[tuple(slice(o, o + n) for o, n in zip(off, blk.shape))] = blk
                same = whole.tobytes() == global_value(name, step).tobytes()
                say(f"MATCH {action} {name} {same}")
                ok &= same
    if not only_global:
        want = make_arrays(step)
        mine = all(x[1].tobytes() == y[1].tobytes() for x, y in zip(arrays, want) if x[2] is None)
        every = comm.gather(mine, root=0)
        if rank == 0:
            say(f"MATCH {action} per-rank {all(every)}")
            ok &= all(every)
    return ok


cfg = hpcckpt.Config.load(None, name=a.name, pfs_dir=a.dir, io_chunk=4096, ranks_per_node=a.rpn)
store = PfsStore(cfg, comm, Topology.build(comm, a.rpn))
for action in a.actions:
    verb, _, arg = action.partition(":")
    arrays = None
    try:
        if verb in ("save", "save-global"):
            step = int(arg)
            ckpt_id = comm.bcast(f"id{step}x{os.getpid()}" if rank == 0 else None, root=0)
            nbytes = store.save(step, ckpt_id, items_from_arrays(make_arrays(step, only_global=verb == "save-global")))
            total = comm.reduce(nbytes, root=0)
            if rank == 0:
                say(f"OK {action} {total}")
        elif verb.startswith("restore"):
            step = int(arg)
            only_global = verb == "restore-global"
            bad = {"restore-badshape": "shape", "restore-baddtype": "dtype"}.get(verb)
            arrays = make_arrays(step, fill=-7, only_global=only_global, bad=bad)
            store.restore(step, [(n, x, hpcckpt.PER_RANK if g is None else hpcckpt.Block(g, o))
                                 for n, x, g, o in arrays])
            if check_restored(action, step, arrays, only_global) and rank == 0:
                say(f"OK {action}")
        elif verb == "verify":
            store.verify(int(arg))
            if rank == 0:
                say(f"OK {action}")
        elif verb == "steps":
            steps = store.steps()
            if rank == 0:
                say("STEPS " + ",".join(map(str, steps)))
        elif verb == "retire":
            store.retire(int(arg))
            if rank == 0:
                say(f"OK {action}")
        elif verb == "describe":
            d = store.describe(int(arg))
            if rank == 0:
                say("DESCRIBE " + json.dumps(d))
        else:
            raise SystemExit(f"unknown action {action!r}")
    except hpcckpt.HpcCkptError as e:
        say(f"ERROR {action} {type(e).__name__} rank={rank} {e}")
        if arrays is not None:
            untouched = all(np.all(x[1] == -7) for x in arrays)
            say(f"UNTOUCHED {action} rank={rank} {untouched}")
store.close()
comm.Barrier()
if rank == 0:
    say("DONE")
