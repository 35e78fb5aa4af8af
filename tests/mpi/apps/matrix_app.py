"""The application of the fault-injection matrix, the ENOSPC cases and the soak (tests/mpi).

Same deterministic state as app.py (so a test can recompute the state of any step in one
process, bitwise): per rank ``u`` (float64, rank-dependent size), ``grid`` (int32 3x5) and ``it``
(0-d int64). Prints one line per event (one write per line, lines of ranks never interleave):
  RESTART <step|None>             after restart() (rank 0)
  CKPT <step> <level>             a committed checkpoint (rank 0)
  CKPTFAIL <step> <Class> rank=<r> <message>    every rank, when checkpoint() raised
  ERROR <Class> rank=<r> <message>              restart() or the constructor raised (exit 3)
  SOAK <i> fds=<n> rss=<kB> cache=<bytes> pfs=<bytes>   --soak figures (rank 0)
Options: --restored DIR writes the arrays as restart() left them (rank_<r>.npz) before anything
else runs; --fill PATH:STEP (rank 0 fills the file system of PATH at STEP until ENOSPC);
--unfill-after-fail / --unfill-at-start remove that file again.
"""
import argparse
import errno
import json
import os
import resource
import shutil
import signal
import time

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--pfs", default=None)
p.add_argument("--name", default="app")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--every", type=int, default=5)
p.add_argument("--level", default="local")
p.add_argument("--levels", default=None, help="comma-separated: cycle through these levels")
p.add_argument("--n", type=int, default=1000)
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=0)
p.add_argument("--no-restart", action="store_true")
p.add_argument("--restored", default=None)
p.add_argument("--config-json", default="{}")
p.add_argument("--fill", default=None)
p.add_argument("--unfill-after-fail", action="store_true")
p.add_argument("--unfill-at-start", action="store_true")
p.add_argument("--soak", type=int, default=0, help="print SOAK figures every this many checkpoints")
p.add_argument("--remove-at", default=None, help="STEP:PATH: rank 0 removes the directory PATH before STEP")
a = p.parse_args()

comm = MPI.COMM_WORLD
rank = comm.rank


def say(line):
    os.write(1, (line + "\n").encode())


def fd_count(floor):
    """Open file descriptors of this process. The library's removal threads hold a directory
    open for a moment while they work, so a count above ``floor`` (the lowest so far) is taken
    again for up to 2 s: only descriptors that stay open count."""
    n = len(os.listdir("/proc/self/fd"))
    for _ in range(40):
        if floor is None or n <= floor:
            break
        time.sleep(0.05)
        n = len(os.listdir("/proc/self/fd"))
    return n


def tree_bytes(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def fill(path):
    """Write zeros into ``path`` until the file system is full."""
    block = b"\0" * 65536
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(block) <= 512:
                    break
                block = block[:len(block) // 8]
    finally:
        os.close(fd)


def unfill():
    if a.fill:
        if rank == 0 and os.path.exists(a.fill.split(":")[0]):
            os.unlink(a.fill.split(":")[0])
        comm.Barrier()


kwargs = dict(name=a.name, cache_dir=a.cache, pfs_dir=a.pfs or os.path.join(os.path.dirname(a.cache), "pfs"))
kwargs.update(json.loads(a.config_json))
try:
    ckpt = hpcckpt.Checkpointer(comm, **kwargs)
except hpcckpt.HpcCkptError as e:
    say(f"ERROR {type(e).__name__} rank={rank} {e}")
    raise SystemExit(3)

levels = a.levels.split(",") if a.levels else [a.level]
try:  # an error hpcckpt raised on every rank leaves the block on every rank (no abort)
    with ckpt:
        u = np.arange(a.n + rank * 37, dtype=np.float64) * (rank + 1)
        grid = np.full((3, 5), rank, dtype=np.int32)
        it = np.zeros((), np.int64)
        ckpt.protect("u", u)
        ckpt.protect("grid", grid)
        ckpt.protect("it", it)
        initial = [x.copy() for x in (u, grid, it)]
        start = None
        if not a.no_restart:
            try:
                start = ckpt.restart()
            except hpcckpt.HpcCkptError as e:
                say(f"ERROR {type(e).__name__} rank={rank} {e}")
                raise  # agreed: every rank leaves the block with it
        if rank == 0:
            say(f"RESTART {start}")
        if a.restored:
            os.makedirs(a.restored, exist_ok=True)
            np.savez(os.path.join(a.restored, f"rank_{rank}.npz"), u=u, grid=grid, it=it)
        if start is None:
            assert all(np.array_equal(x, y) for x, y in zip(initial, (u, grid, it))), "restart() touched the arrays"
        if a.unfill_at_start:
            unfill()
        fill_step = int(a.fill.split(":")[1]) if a.fill else -1
        count = 0
        base_fds = None
        for step in range(0 if start is None else start + 1, a.steps):
            u *= 1.0001
            u += np.sin(u[: 1]) + step
            grid += step % 7 + rank
            it[...] = step
            if step == a.crash_at and rank == a.crash_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == fill_step:
                if rank == 0:
                    fill(a.fill.split(":")[0])
                comm.Barrier()
            if a.remove_at and step == int(a.remove_at.split(":", 1)[0]):
                if rank == 0:
                    shutil.rmtree(a.remove_at.split(":", 1)[1])
                comm.Barrier()
            if (step + 1) % a.every == 0:
                level = levels[count % len(levels)]
                count += 1
                try:
                    info = ckpt.checkpoint(step, level=level)
                except hpcckpt.HpcCkptError as e:
                    say(f"CKPTFAIL {step} {type(e).__name__} rank={rank} {e}")
                    # every rank has printed before any rank goes on (a later --crash-at must
                    # not let mpiexec kill a rank that has not written its line yet)
                    comm.Barrier()
                    if a.unfill_after_fail:
                        unfill()
                    continue
                if rank == 0:
                    say(f"CKPT {info.step} {info.level}")
                if a.soak and count % a.soak == 0:
                    fds = fd_count(base_fds)
                    base_fds = fds if base_fds is None else min(base_fds, fds)
                    with open("/proc/self/status") as f:
                        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
                    comm.Barrier()
                    if rank == 0:
                        say(f"SOAK {count} fds={fds} rss={rss} cache={tree_bytes(os.path.dirname(a.cache))} "
                            f"pfs={tree_bytes(kwargs['pfs_dir'])} maxrss={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
        ckpt.wait()
except hpcckpt.HpcCkptError:
    raise SystemExit(3)
comm.Barrier()
if rank == 0:
    say("DONE")
