"""A small deterministic MPI application with the README loop, run by the SLURM tests' jobs.

Configuration comes from the environment (HPCCKPT_NAME, HPCCKPT_CACHE_DIR, HPCCKPT_PFS_DIR,
HPCCKPT_RANKS_PER_NODE, ...) as a job script sets it; the schedule is local every --every steps.
Options:
  --steps N --every K --n SIZE   run N steps, a local checkpoint every K steps
  --step-sleep S                 sleep S seconds per step (time for a signal to arrive)
  --ready-file PATH              rank 0 creates it after the first checkpoint
  --starting-file PATH           rank 0 creates it before the Checkpointer exists; every rank
                                 then waits 3 s (a signal arriving meanwhile finds no handler)
  --crash-at S --crash-rank R    SIGKILL rank R right after step S ...
  --crash-once PATH              ... only if PATH does not exist yet (it is created first)
  --out DIR                      write the final arrays as rank_<r>_<name>.npy
Rank 0 prints "RESTART_COUNT <n>", "RESTART <step|None>", "CKPT <step> <level>",
"STOPPED <step> (<reason>)" (should_exit() was True), "DONE <last step>".
"""
import argparse
import faulthandler
import os
import signal
import time

import numpy as np


def initial(rank, n):
    """The arrays of ``rank`` before step 0."""
    return {"u": np.arange(n, dtype=np.float64) * (rank + 1),
            "grid": np.full((3, 5), rank, dtype=np.int32),
            "it": np.zeros((), np.int64)}


def advance(arrays, step, rank):
    """One deterministic step, in place."""
    u = arrays["u"]
    u *= 1.0001
    u += np.sin(u[:1]) + step
    arrays["grid"] += step % 7 + rank
    arrays["it"][...] = step


def reference(rank, n, steps):
    """The arrays of ``rank`` after a failure-free run of ``steps`` steps."""
    arrays = initial(rank, n)
    for step in range(steps):
        advance(arrays, step, rank)
    return arrays


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--ready-file", default=None)
    p.add_argument("--starting-file", default=None)
    p.add_argument("--crash-at", type=int, default=-1)
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--crash-once", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()

    # A startup that hangs (seen rarely on the loaded test machine) dumps every thread's stack
    # into the job output after 40 s, so a failing test shows where it stuck.
    faulthandler.dump_traceback_later(40)
    from mpi4py import MPI
    import hpcckpt
    from hpcckpt import slurm

    def say(line):
        os.write(1, (line + "\n").encode())   # one write per line

    comm = MPI.COMM_WORLD
    rank = comm.rank
    if a.starting_file:
        if rank == 0:
            open(a.starting_file, "w").close()
        time.sleep(3.0)
    with hpcckpt.Checkpointer(comm, policy="fixed", schedule={"local": a.every}) as ckpt:
        arrays = initial(rank, a.n)
        for name, arr in arrays.items():
            ckpt.protect(name, arr)
        start = ckpt.restart()
        faulthandler.cancel_dump_traceback_later()
        # Inside a SLURM job the Checkpointer installed the stop handler (stop_signals = "auto").
        assert slurm.handler_installed() or not slurm.in_slurm()
        if rank == 0:
            say(f"RESTART_COUNT {slurm.restart_count()}")
            say(f"RESTART {start}")
        step = start
        for step in range(0 if start is None else start + 1, a.steps):
            advance(arrays, step, rank)
            if step == a.crash_at and rank == a.crash_rank:
                if a.crash_once is None or not os.path.exists(a.crash_once):
                    if a.crash_once:
                        open(a.crash_once, "w").close()
                    say(f"CRASH rank {rank} after step {step}")
                    os.kill(os.getpid(), signal.SIGKILL)
            level = ckpt.need_checkpoint(step)   # "pfs" on every rank once a stop was requested
            if level:
                info = ckpt.checkpoint(step, level=level)
                if rank == 0:
                    say(f"CKPT {info.step} {info.level}")
                    if a.ready_file and not os.path.exists(a.ready_file):
                        open(a.ready_file, "w").close()
            if ckpt.should_exit():
                if rank == 0:
                    say(f"STOPPED {step} ({slurm.stop_reason()})")
                break
            if a.step_sleep:
                time.sleep(a.step_sleep)
        ckpt.wait()
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            for name, arr in arrays.items():
                np.save(os.path.join(a.out, f"rank_{rank}_{name}.npy"), arr)
    comm.Barrier()
    if rank == 0:
        say(f"DONE {step}")


if __name__ == "__main__":
    main()
