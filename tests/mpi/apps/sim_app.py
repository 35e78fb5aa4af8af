"""An application as scientists write them, checkpointed with a state dict (tests/mpi/test_state.py).

What it does that protect() by reference cannot follow:
  - a 1-D heat equation whose buffers swap every step (``u, u_new = u_new, u``: rebinding),
    each rank a block of the global field (layout Block);
  - particles that migrate between ranks every step, so each rank's arrays change length
    (``ids``, ``pos``, ``vel``: layout ROWS);
  - a history on rank 0 only that grows by a row every step and is rebound by np.vstack (ROOT);
  - Python scalars (``t``, ``step``), a NumPy float32 scalar, a dict of parameters with a
    tuple, and a NumPy Generator's state (a dict with 128-bit ints), the same on every rank
    (REPLICATED); with --per-rank-rng also a Generator per rank (no layout: per rank);
  - with --table-kib K, a per-rank table of K KiB (the state dict's first key) of which a
    sixteenth is rewritten every step: most of the data stays as it was (incremental).
The dynamics do not depend on the decomposition (every cell and particle is updated by the same
operations wherever it lives; the energy is summed on rank 0 in particle-id order), so a run
restarted on another rank count ends bitwise equal to a failure-free run, globally.

Options: --cache DIR --pfs DIR --name NAME --steps N --every K --level L (or L1,L2,...: cycled) --crash-at S
--crash-rank R --out DIR --no-restart --per-rank-rng --table-kib K --config-json JSON
--extra-key (restart with a key the checkpoint lacks) --bad-replicated (rank 1's params differ).
Prints "RESTART <step|None>" (rank 0), "CKPT <step> <level>" (rank 0), "ERROR <Class> rank=<r>
<message>" (every rank that caught an HpcCkptError; exit 3), "DONE".
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
p.add_argument("--pfs", required=True)
p.add_argument("--name", default="sim")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--every", type=int, default=5)
p.add_argument("--level", default="local")
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=1)
p.add_argument("--out", default=None)
p.add_argument("--no-restart", action="store_true")
p.add_argument("--per-rank-rng", action="store_true")
p.add_argument("--extra-key", action="store_true")
p.add_argument("--bad-replicated", action="store_true")
p.add_argument("--table-kib", type=int, default=0)
p.add_argument("--config-json", default="{}")
a = p.parse_args()

comm = MPI.COMM_WORLD          # the application's own messages go here
rank, size = comm.rank, comm.size
NCELLS, NPART = 203, 150


def say(line):
    os.write(1, (line + "\n").encode())


def decomposition(n, parts, r):
    base, extra = divmod(n, parts)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def owner(pos):
    return np.minimum((pos[:, 0] * size).astype(np.int64), size - 1)


def migrate(ids, pos, vel):
    """Send every particle to the rank that owns its x position (an alltoall)."""
    dest = owner(pos)
    out = [(ids[dest == r], pos[dest == r], vel[dest == r]) for r in range(size)]
    got = comm.alltoall(out)
    return (np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]).reshape(-1, 2),
            np.concatenate([g[2] for g in got]).reshape(-1, 2))


def halo(u):
    """The values left and right of this rank's block (0 at the walls)."""
    left = np.zeros(1)
    right = np.zeros(1)
    lo_rank = rank - 1 if rank > 0 else MPI.PROC_NULL
    hi_rank = rank + 1 if rank < size - 1 else MPI.PROC_NULL
    mine_first = np.array(u[:1]) if len(u) else np.zeros(1)
    mine_last = np.array(u[-1:]) if len(u) else np.zeros(1)
    comm.Sendrecv(mine_last, dest=hi_rank, recvbuf=left, source=lo_rank)
    comm.Sendrecv(mine_first, dest=lo_rank, recvbuf=right, source=hi_rank)
    return left[0], right[0]


def energy(ids, vel):
    """Kinetic energy summed on rank 0 in particle-id order (independent of the decomposition)."""
    got = comm.gather((ids, vel), root=0)
    if rank != 0:
        return None
    all_ids = np.concatenate([g[0] for g in got])
    all_vel = np.concatenate([g[1] for g in got]).reshape(-1, 2)
    return float(0.5 * np.sum(all_vel[np.argsort(all_ids)] ** 2))


lo, n = decomposition(NCELLS, size, rank)
x = (np.arange(lo, lo + n) + 0.5) / NCELLS
u = np.exp(-((x - 0.4) ** 2) / 0.01)
u_new = np.empty_like(u)
init = np.random.default_rng(7)                      # the same initial particles on every rank
all_pos, all_vel = init.random((NPART, 2)), init.normal(0, 0.3, (NPART, 2))
all_ids = np.arange(NPART, dtype=np.int64)
mask = owner(all_pos) == rank
ids, pos, vel = all_ids[mask], all_pos[mask], all_vel[mask]
params = {"dt": 1e-3, "alpha": 0.25, "label": "sim", "walls": (0.0, 1.0)}
if a.bad_replicated and rank == 1:
    params["alpha"] = 0.26
rng = np.random.default_rng(12345)                   # replicated: drawn identically on every rank
local_rng = np.random.default_rng(1000 + rank)       # per rank (only with --per-rank-rng)
scale = np.float32(1.0)
t, step0 = 0.0, -1
history = np.zeros((0, 2)) if rank == 0 else None
table = np.cos(np.arange(a.table_kib * 128) + rank)     # a.table_kib KiB of float64

kwargs = dict(name=a.name, cache_dir=a.cache, pfs_dir=a.pfs, log_level="ERROR")
kwargs.update(json.loads(a.config_json))


def current_state():
    state = {"table": table} if a.table_kib else {}
    state.update({"u": u, "ids": ids, "pos": pos, "vel": vel, "t": t, "step": step, "params": params,
             "rng": rng.bit_generator.state, "scale": scale})
    if rank == 0:
        state["history"] = history
    if a.per_rank_rng:
        state["local_rng"] = local_rng.bit_generator.state
    return state


try:
    with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
        ckpt.layout("u", hpcckpt.Block((NCELLS,), (lo,)))
        for key in ("ids", "pos", "vel"):
            ckpt.layout(key, hpcckpt.ROWS)
        for key in ("t", "step", "params", "rng", "scale"):
            ckpt.layout(key, hpcckpt.REPLICATED)
        ckpt.layout("history", hpcckpt.ROOT)
        start = None
        if not a.no_restart:
            step = -1
            state = current_state()
            state["ids"] = state["pos"] = state["vel"] = np.zeros(0)      # replaced by the checkpoint's
            if a.extra_key:
                state["extra"] = 1
            start = ckpt.restart(state)
            if start is not None:
                assert state["u"] is u, "the block of the same shape is filled in place"
                ids, pos, vel = state["ids"], state["pos"], state["vel"]
                t, step0, params, scale = state["t"], state["step"], state["params"], state["scale"]
                assert step0 == start and isinstance(t, float) and isinstance(scale, np.float32)
                rng.bit_generator.state = state["rng"]
                if a.per_rank_rng:
                    local_rng.bit_generator.state = state["local_rng"]
                if rank == 0:
                    history = state["history"]
                if a.table_kib:
                    table = state["table"]
        if rank == 0:
            say(f"RESTART {start}")
        for step in range(step0 + 1, a.steps):
            # heat: new values from the halo, then swap the buffers (the state holds a new object)
            left, right = halo(u)
            ext = np.concatenate([[left], u, [right]])
            u_new[:] = ext[1:-1] + params["alpha"] * (ext[:-2] - 2 * ext[1:-1] + ext[2:]) * float(scale)
            u, u_new = u_new, u
            # particles: a replicated random kick, a per-rank jitter, move, reflect, migrate
            kick = rng.normal(0, 0.01, 2)
            vel = vel + kick
            if a.per_rank_rng:
                vel = vel + local_rng.normal(0, 1e-6, vel.shape)
            pos = pos + vel * params["dt"]
            low = pos < 0.0
            pos, vel = np.where(low, -pos, pos), np.where(low, -vel, vel)
            high = pos >= 1.0
            pos, vel = np.where(high, 2.0 - pos, pos), np.where(high, -vel, vel)
            pos = np.minimum(pos, np.nextafter(1.0, 0.0))
            ids, pos, vel = migrate(ids, pos, vel)
            t += params["dt"]
            scale = np.float32(scale * np.float32(0.9999))
            e = energy(ids, vel)
            if rank == 0:
                history = np.vstack([history, [[t, e]]])
            if a.table_kib:        # a sixteenth of the table, in place
                part = table.size // 16
                table[step % 16 * part:(step % 16 + 1) * part] = np.sin(np.arange(part) * 1e-3 + step)
            if step == a.crash_at and rank == a.crash_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            if (step + 1) % a.every == 0:
                levels = a.level.split(",")        # a comma list: cycled, one level per checkpoint
                info = ckpt.checkpoint(step, current_state(), level=levels[(step + 1) // a.every % len(levels)])
                if rank == 0:
                    say(f"CKPT {info.step} {info.level}")
        ckpt.wait()
except hpcckpt.HpcCkptError as e:
    say(f"ERROR {type(e).__name__} rank={rank} {e}")
    raise SystemExit(3)

if a.out:
    os.makedirs(a.out, exist_ok=True)
    extra = {"history": history} if rank == 0 else {}
    np.savez(os.path.join(a.out, f"rank_{rank}.npz"), u=u, lo=lo, ids=ids, pos=pos, vel=vel,
             t=np.float64(t), step=step, scale=scale,
             rng=json.dumps(rng.bit_generator.state, sort_keys=True), **extra,
             **({"table": table} if a.table_kib else {}))
comm.Barrier()
if rank == 0:
    say("DONE")
