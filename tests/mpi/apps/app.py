"""A small deterministic MPI application protected by hpcckpt, driven by the MPI tests.

Every rank owns arrays of a rank-dependent size; each step updates them deterministically, so a
restarted run ends bitwise equal to a failure-free run. Options:
  --cache DIR --name NAME --steps N --every K (checkpoint every K steps at --level)
  --crash-at S --crash-rank R     SIGKILL rank R right after step S's update
  --crash-sync                    ... after a barrier of every rank (each is done with the checkpoints before)
  --out DIR                       write the final arrays as rank_<r>_<name>.npy
  --uneven                        ranks protect different amounts of data
  --no-restart                    do not call restart()
  --config-json JSON              extra Checkpointer keyword arguments
  --wait-after                    ckpt.wait() after every checkpoint
Prints "RESTART <step|None>", "CKPT <step> <level> <bytes>", "DONE"; "ERROR <class> rank=<r> <message>"
when hpcckpt raised (then exit status 3).
"""
import argparse
import contextlib
import json
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import hpcckpt

p = argparse.ArgumentParser()
p.add_argument("--cache", required=True)
p.add_argument("--name", default="app")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--every", type=int, default=5)
p.add_argument("--level", default="local")
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=0)
p.add_argument("--crash-sync", action="store_true")
p.add_argument("--out", default=None)
p.add_argument("--n", type=int, default=1000)
p.add_argument("--uneven", action="store_true")
p.add_argument("--no-restart", action="store_true")
p.add_argument("--config-json", default="{}")
p.add_argument("--expect-error", action="store_true", help="restart() must raise: print it, exit 3")
p.add_argument("--tolerate-write-errors", action="store_true", help="print CKPTFAIL and go on")
p.add_argument("--rank-config-json", default=None, help="RANK:JSON extra keyword arguments on one rank only")
p.add_argument("--signal-at", type=int, default=-1, help="rank 1 sends itself SIGUSR1 after this step")
p.add_argument("--policy-loop", action="store_true", help="checkpoint when need_checkpoint() says; stop on should_exit()")
p.add_argument("--scavenge", action="store_true", help="call scavenge() at the end, print SCAVENGED <step>")
p.add_argument("--wait-after", action="store_true", help="ckpt.wait() after every checkpoint (background work done)")
p.add_argument("--extra-array-on-rank", type=int, default=-1, help="this rank protects one more array")
p.add_argument("--report-numba", action="store_true", help="print NUMBA rank=R loaded=True|False at the end")
p.add_argument("--no-close", action="store_true", help="never close() the Checkpointer (no with block)")
p.add_argument("--finalize-first", action="store_true", help="MPI.Finalize() at the end, then close()")
a = p.parse_args()


def say(line):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (line + "\n").encode())


comm = MPI.COMM_WORLD
rank = comm.rank
n = a.n + (rank * 37 if a.uneven else 0)
kwargs = dict(name=a.name, cache_dir=a.cache, pfs_dir=os.path.join(os.path.dirname(a.cache), "pfs"))
kwargs.update(json.loads(a.config_json))
if a.rank_config_json:
    r, text = a.rank_config_json.split(":", 1)
    if int(r) == rank:
        kwargs.update(json.loads(text))
try:
    ckpt = hpcckpt.Checkpointer(comm, **kwargs)
except hpcckpt.HpcCkptError as e:
    say(f"ERROR {type(e).__name__} rank={rank} {e}")
    raise SystemExit(3)

try:  # an error hpcckpt raised on every rank leaves the block on every rank (no abort)
    with ckpt if not a.no_close else contextlib.nullcontext():
        u = np.arange(n, dtype=np.float64) * (rank + 1)
        grid = np.full((3, 5 + rank % 2 if a.uneven else 5), rank, dtype=np.int32)
        it = np.zeros((), np.int64)
        ckpt.protect("u", u)
        ckpt.protect("grid", grid)
        ckpt.protect("it", it)
        if rank == a.extra_array_on_rank:
            extra = np.zeros(3)
            ckpt.protect("extra", extra)
        initial = [x.copy() for x in (u, grid, it)]
        start = None
        if not a.no_restart:
            if a.expect_error:
                try:
                    ckpt.restart()
                except hpcckpt.HpcCkptError as e:
                    say(f"ERROR {type(e).__name__} rank={rank} {e}")
                    raise  # agreed: every rank leaves the block with it
                raise SystemExit(4)
            try:
                start = ckpt.restart()
            except hpcckpt.HpcCkptError as e:
                say(f"ERROR {type(e).__name__} rank={rank} {e}")
                raise  # agreed: every rank leaves the block with it
        if rank == 0:
            say(f"RESTART {start}")
        if start is not None:
            assert int(it) == start, (int(it), start)
        else:
            assert all(np.array_equal(x, y) for x, y in zip(initial, (u, grid, it))), "restart() touched the arrays"
        for step in range(0 if start is None else start + 1, a.steps):
            u *= 1.0001
            u += np.sin(u[: 1]) + step
            grid += step % 7 + rank
            it[...] = step
            if step == a.crash_at and a.crash_sync:
                comm.Barrier()
            if step == a.crash_at and rank == a.crash_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == a.signal_at and rank == min(1, comm.size - 1):
                os.kill(os.getpid(), signal.SIGUSR1)
            if a.policy_loop:
                level = ckpt.need_checkpoint(step)
                if level:
                    info = ckpt.checkpoint(step, level=level)
                    if rank == 0:
                        say(f"CKPT {info.step} {info.level} {info.bytes}")
                if ckpt.should_exit():
                    if rank == 0:
                        say(f"STOPPED {step}")
                    break
                continue
            if (step + 1) % a.every == 0:
                try:
                    info = ckpt.checkpoint(step, level=a.level)
                except hpcckpt.HpcCkptError as e:
                    if not a.tolerate_write_errors:
                        say(f"ERROR {type(e).__name__} rank={rank} {e}")
                        raise  # agreed: every rank leaves the block with it
                    say(f"CKPTFAIL {step} {type(e).__name__} rank={rank} {e}")
                    continue
                if a.wait_after:
                    ckpt.wait()
                if rank == 0:
                    say(f"CKPT {info.step} {info.level} {info.bytes}")
        if a.scavenge:
            copied = ckpt.scavenge()
            if rank == 0:
                say(f"SCAVENGED {copied}")
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            for name, arr in (("u", u), ("grid", grid), ("it", it)):
                np.save(os.path.join(a.out, f"rank_{rank}_{name}.npy"), arr)
        if a.finalize_first:
            MPI.Finalize()
            ckpt.close()
except hpcckpt.HpcCkptError:
    raise SystemExit(3)
if a.report_numba:
    say(f"NUMBA rank={rank} loaded={'numba' in sys.modules}")
if not MPI.Is_finalized():
    comm.Barrier()
if rank == 0:
    print("DONE", flush=True)
