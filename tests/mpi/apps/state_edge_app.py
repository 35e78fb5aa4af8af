"""Values at the edge of what a state dict holds, under real mpiexec (tests/mpi/test_state.py).

--case values: checkpoint NumPy strings and bytes with trailing NULs, an int of 19,000 bits, a
  dict whose key order is not sorted and the interior of a halo-padded field (a non-contiguous
  view, restored in place into another padded buffer), at --level; a second run (--restore) restarts (its caller
  may delete a node's cache in between) and prints "MATCH" or "DIFF <key>" per rank.
--case one-rank-masked: rank 2 alone puts a masked array in its state: every rank must get the
  same ProtectError, then checkpoint again without it.
--case overlap: the first run protects "a" and checkpoints {"b": ...}; with --restore, restart()
  gets a state dict that also holds "a": a ProtectError on every rank, nothing touched.
--case replicated-padding: long doubles (x87: 6 padding bytes per value, here different on every
  rank) declared REPLICATED, equal on every rank: checkpoint 1 is taken; checkpoint 2, where
  rank 2 holds another value, is a ProtectError on every rank; with --restore, restart() prints
  "MATCH" or "DIFF" per rank.
Prints "ERROR <Class> rank=<r> <message>" for every HpcCkptError caught, "OK <step>" per commit.
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
p.add_argument("--case", required=True)
p.add_argument("--level", default="local")
p.add_argument("--restore", action="store_true")
p.add_argument("--config-json", default="{}")
a = p.parse_args()
comm = MPI.COMM_WORLD
rank = comm.rank


def values():
    return {"s": np.str_(f"r{rank}\x00"), "b": np.bytes_(b"x\x00\x00"), "huge": 3 ** 12000 + rank,
            "order": {"zeta": 1, "alpha": [2, {"y": 0, "b": 1}]}, "u": np.arange(1000.0) + rank,
            "interior": padded(rank)[1:-1, 1:-1]}


def padded(fill):
    """A halo-padded field: its interior (a non-contiguous view) is what is checkpointed."""
    u = np.full((6, 7), -1.0)
    u[1:-1, 1:-1] = np.arange(20.0).reshape(4, 5) * (fill + 1)
    return u


def same(x, y):
    if isinstance(x, np.ndarray):
        return type(y) is np.ndarray and x.dtype == y.dtype and x.tobytes() == y.tobytes()
    if isinstance(x, np.generic):
        return type(x) is type(y) and x.dtype == y.dtype and x.tobytes() == y.tobytes() and str(x) == str(y)
    if isinstance(x, dict):
        return type(y) is dict and list(x) == list(y) and all(same(x[k], y[k]) for k in x)
    if isinstance(x, list):
        return type(y) is list and len(x) == len(y) and all(same(i, j) for i, j in zip(x, y))
    return type(x) is type(y) and x == y


def padded_longdoubles(fill):
    """np.arange(6) / 7 and 1 / 3 as long doubles whose padding bytes (x87) hold ``fill``."""
    x = np.arange(6) / np.longdouble(7)
    raw = np.concatenate([x, [np.longdouble(1) / 3]]).view(np.uint8).reshape(7, -1).copy()
    raw[:, 10:] = fill
    values = raw.reshape(-1).view(np.longdouble)
    return values[:6].copy(), values[6]


def say(line):
    os.write(1, (line + "\n").encode())      # one write: lines of several ranks do not interleave


cfg = {"name": "edge", "cache_dir": a.cache, "pfs_dir": a.pfs, "log_level": "ERROR", "ranks_per_node": 1}
cfg.update(json.loads(a.config_json))
with hpcckpt.Checkpointer(comm, config=cfg) as ckpt:
    try:
        if a.case == "values" and not a.restore:
            ckpt.restart({k: None for k in values()})
            info = ckpt.checkpoint(1, values(), level=a.level)
            say(f"OK {info.step}")
        elif a.case == "values":
            state = {k: None for k in values()}
            field = np.zeros((6, 7))
            state["interior"] = field[1:-1, 1:-1]           # filled in place: the halo stays as it is
            step = ckpt.restart(state)
            bad = [k for k, v in values().items() if k != "interior" and not same(v, state[k])]
            want = padded(rank)
            want[0, :] = want[-1, :] = want[:, 0] = want[:, -1] = 0.0
            if state["interior"].base is not field or field.tobytes() != want.tobytes():
                bad.append("interior")
            say(f"RESTART {step}")
            say("MATCH" if not bad else f"DIFF {bad}")
        elif a.case == "one-rank-masked":
            state = {"u": np.arange(10.0)}
            if rank == 2:
                state["m"] = np.ma.array([1.0, 2.0], mask=[0, 1])
            try:
                ckpt.checkpoint(1, state, level=a.level)
            except hpcckpt.HpcCkptError as e:
                say(f"ERROR {type(e).__name__} rank={rank} {e}")
            state.pop("m", None)
            say(f"OK {ckpt.checkpoint(2, state, level=a.level).step}")
        elif a.case == "replicated-padding":
            ckpt.layout("x", hpcckpt.REPLICATED)
            ckpt.layout("third", hpcckpt.REPLICATED)
            x, third = padded_longdoubles(rank + 1)
            if not a.restore:
                say(f"OK {ckpt.checkpoint(1, {'x': x, 'third': third}, level=a.level).step}")
                if rank == 2:
                    x[0] += 1
                try:
                    ckpt.checkpoint(2, {"x": x, "third": third}, level=a.level)
                except hpcckpt.HpcCkptError as e:
                    say(f"ERROR {type(e).__name__} rank={rank} {e}")
            else:
                state = {"x": None, "third": None}
                say(f"RESTART {ckpt.restart(state)}")
                ok = np.array_equal(state["x"], x) and state["third"] == third and type(state["third"]) is type(third)
                say("MATCH" if ok else "DIFF")
        elif a.case == "overlap":
            kept = np.full(4, -1.0)
            fresh = np.arange(4.0)
            ckpt.protect("a", fresh if not a.restore else kept)
            if not a.restore:
                say(f"OK {ckpt.checkpoint(1, {'b': 1.5}, level=a.level).step}")
            else:
                state = {"a": kept, "b": None}
                try:
                    ckpt.restart(state)
                except hpcckpt.HpcCkptError as e:
                    say(f"ERROR {type(e).__name__} rank={rank} {e}")
                if not (state["b"] is None and (kept == -1.0).all()):
                    say("TOUCHED")
    except hpcckpt.HpcCkptError as e:
        say(f"ERROR {type(e).__name__} rank={rank} {e}")
