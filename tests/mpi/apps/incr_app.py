"""An MPI application for the incremental tests (tests/mpi/test_incremental.py).

Each rank protects one uint8 array of --blocks blocks of --block bytes (plus a rank-dependent
tail, so the last block is short and ranks differ in size). Its value at checkpoint step s is a
pure function of (rank, s): the value at the previous checkpoint step with a chosen set of
blocks rewritten (--frac of them, picked by a generator seeded with (rank, s)); so a restarted
run checks the restored array bitwise against ``value(rank, s)``. Options:
  --cache DIR --level L --ckpts S1,S2,...    the checkpoint steps (each at level L)
  --pfs-at S / --local-at S                  checkpoint step S at the pfs / local level instead
  --more S,...                               with --restart: then go on checkpointing these steps
  --drop-base-before S                       rank 1 deletes the copies / parity it holds for the
                                             first step just before checkpointing step S
  --frac F                                   fraction of blocks changed between checkpoints
  --restart                                  restart() only: print RESTART <step|None> and
                                             CHECK <ok|bad> (the restored array vs value(rank, step))
  --config-json JSON                         extra Checkpointer keyword arguments
  --rng                                      also checkpoint a state dict holding a generator's
                                             state (its JSON length varies from step to step)
  --grow N                                   also checkpoint a state dict holding ``hist``, a
                                             history that on rank 0 grows by N bytes (shrinks
                                             when N < 0) at every checkpoint after the first
"""
import argparse
import json
import os

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--level", default="partner")
p.add_argument("--ckpts", default="1,2,3")
p.add_argument("--frac", type=float, default=0.1)
p.add_argument("--blocks", type=int, default=20)
p.add_argument("--block", type=int, default=4096)
p.add_argument("--restart", action="store_true")
p.add_argument("--pfs-at", type=int, default=-1, help="this checkpoint step is taken at the pfs level")
p.add_argument("--local-at", type=int, default=-1, help="this checkpoint step is taken at the local level")
p.add_argument("--drop-base-before", type=int, default=-1,
               help="rank 1 deletes what it holds for others at the first checkpoint step before this step")
p.add_argument("--more", default="", help="with --restart: then checkpoint these steps (of --ckpts) too")
p.add_argument("--config-json", default="{}")
p.add_argument("--rng", action="store_true")
p.add_argument("--grow", type=int, default=None)
a = p.parse_args()
comm = MPI.COMM_WORLD
rank = comm.rank
ckpts = [int(s) for s in a.ckpts.split(",")]
size = a.blocks * a.block + 100 * (rank + 1)


def value(upto):
    """The array at checkpoint step ``upto`` (deterministic)."""
    u = np.random.default_rng([rank, 0]).integers(0, 256, size, dtype=np.uint8)
    nblocks = -(-size // a.block)
    for s in ckpts[1:]:
        if s > upto:
            break
        rng = np.random.default_rng([rank, s])
        picked = rng.choice(nblocks, int(round(a.frac * nblocks)), replace=False)
        for b in picked:
            n = min(a.block, size - b * a.block)
            u[b * a.block:b * a.block + n] = rng.integers(0, 256, n, dtype=np.uint8)
    return u


def rng_state(upto):
    """A per-rank generator's state at checkpoint step ``upto`` (deterministic)."""
    gen = np.random.default_rng([rank, 7])
    gen.random(13 * upto)
    return gen.bit_generator.state


def hist(upto):
    """The history at checkpoint step ``upto``: 3 blocks on every rank, on rank 0 grown by
    --grow bytes per checkpoint since the first (appended: the earlier bytes stay)."""
    n = 3 * a.block + (a.grow * sum(1 for s in ckpts[1:] if s <= upto) if rank == 0 else 0)
    return ((np.arange(n) * 7 + rank) % 251).astype(np.uint8)


def state_at(s):
    """The state dict checkpointed at step ``s`` (None without --rng and --grow)."""
    state = {}
    if a.rng:
        state["rng"] = rng_state(s)
    if a.grow is not None:
        state["hist"] = hist(s)
    return state or None


def say(line):
    os.write(1, (line + "\n").encode())


kwargs = dict(name="app", cache_dir=a.cache, pfs_dir=os.path.join(os.path.dirname(a.cache), "pfs"),
              incremental=True, incremental_block=a.block)
kwargs.update(json.loads(a.config_json))
u = np.zeros(size, np.uint8)
with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
    ckpt.protect("u", u)
    if a.restart:
        state = {k: None for k in state_at(0) or {}} or None
        step = ckpt.restart(state)
        ok = step is not None and np.array_equal(u, value(step)) and (not a.rng or state["rng"] == rng_state(step)) \
            and (a.grow is None or np.array_equal(state["hist"], hist(step)))
        ok = comm.allreduce(ok, op=MPI.LAND)
        if rank == 0:
            say(f"RESTART {step}")
            say(f"CHECK {'ok' if ok else 'bad'}")
        for s in [int(x) for x in a.more.split(",") if x]:
            u[:] = value(s)
            ckpt.checkpoint(s, state_at(s), level=a.level)
    else:
        for s in ckpts:
            if s == a.drop_base_before and rank == 1:     # the base's copy / parity vanishes on one node
                held = os.path.join(ckpt.cache.step_dir(ckpts[0]), f"held_{rank:06d}")
                for name in os.listdir(held):
                    if name.endswith(".dat"):
                        os.unlink(os.path.join(held, name))
            u[:] = value(s)
            ckpt.checkpoint(s, state_at(s),
                            level="pfs" if s == a.pfs_at else "local" if s == a.local_at else a.level)
        ckpt.wait()
        if rank == 0:
            say("DONE")
