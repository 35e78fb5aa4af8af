"""The demo: a 2-D heat equation on N ranks that crashes, restarts and ends bit for bit right.

``hpcckpt demo`` (the driver, local) runs the application three times under mpiexec: once with a
rank killed part-way (SIGKILL, as a crash would), once restarting from the newest checkpoint, and
once failure-free as the reference; it then compares the final fields bit for bit and prints the
checkpoint times. ``python -m hpcckpt.demo`` is the MPI application itself.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import mpi_launch


# ---------------------------------------------------------------------------- the application
def heat_app(argv=None):
    """Collective (run under mpiexec): advance the heat equation, checkpointing as scheduled."""
    p = argparse.ArgumentParser(prog="python -m hpcckpt.demo")
    p.add_argument("--nx", type=int, default=2048)
    p.add_argument("--ny", type=int, default=1024)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=25, help="checkpoint every N steps (0: never)")
    p.add_argument("--cache", required=True)
    p.add_argument("--ranks-per-node", default="2")
    p.add_argument("--crash-at", type=int, default=-1, help="kill rank 1 after this step")
    p.add_argument("--result", required=True, help="rank 0 writes the final field here (.npy)")
    a = p.parse_args(argv)

    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    rows = [a.nx // size + (1 if r < a.nx % size else 0) for r in range(size)]
    row0, nloc = sum(rows[:rank]), rows[rank]
    up, down = (rank - 1 if rank > 0 else MPI.PROC_NULL), (rank + 1 if rank < size - 1 else MPI.PROC_NULL)
    alpha = 0.2

    u = np.zeros((nloc + 2, a.ny))          # one halo row above and below
    new = np.empty((nloc, a.ny - 2))
    gi = np.arange(row0, row0 + nloc)[:, None]
    gj = np.arange(a.ny)[None, :]
    u[1:-1] = np.exp(-((gi - a.nx / 2) ** 2 + (gj - a.ny / 2) ** 2) / (0.02 * a.nx * a.ny))
    if rank == size - 1:
        u[-1] = 1.0                          # a hot bottom edge
    step_done = np.full((), -1, np.int64)

    rpn = a.ranks_per_node if a.ranks_per_node == "auto" else int(a.ranks_per_node)
    schedule = {"local": a.every} if a.every > 0 else {"local": 10 ** 9}
    with hpcckpt.Checkpointer(comm, name="heat", cache_dir=a.cache, ranks_per_node=rpn,
                              schedule=schedule) as ckpt:
        ckpt.protect("temperature", u[1:-1], global_shape=(a.nx, a.ny), offset=(row0, 0))
        ckpt.protect("step", step_done)
        start = ckpt.restart() if a.every > 0 else None
        if rank == 0:
            print(f"RESTART {start}", flush=True)
        for step in range(0 if start is None else start + 1, a.steps):
            comm.Sendrecv(u[1], dest=up, recvbuf=u[-1], source=down)
            comm.Sendrecv(u[-2], dest=down, recvbuf=u[0], source=up)
            c = u[1:-1, 1:-1]
            np.add(u[:-2, 1:-1], u[2:, 1:-1], out=new)
            new += u[1:-1, :-2]
            new += u[1:-1, 2:]
            new -= 4.0 * c
            new *= alpha
            c += new
            step_done[...] = step
            if step == a.crash_at and rank == min(1, size - 1):
                os.kill(os.getpid(), signal.SIGKILL)
            level = ckpt.need_checkpoint(step)
            if level:
                info = ckpt.checkpoint(step, level=level)
                if rank == 0:
                    print(f"CKPT {json.dumps([info.step, info.level, info.bytes, info.seconds])}", flush=True)
    field = np.empty((a.nx, a.ny)) if rank == 0 else None
    counts = [r * a.ny for r in rows]
    comm.Gatherv(np.ascontiguousarray(u[1:-1]), [field, counts] if rank == 0 else None, root=0)
    if rank == 0:
        np.save(a.result, field)
        print("DONE", flush=True)


# ---------------------------------------------------------------------------- the driver
def add_arguments(p):
    p.add_argument("--ranks", type=int, default=4, help="MPI ranks (default 4)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--crash-at", type=int, default=180, help="step after which rank 1 is killed")
    p.add_argument("--every", type=int, default=25, help="checkpoint every N steps")
    p.add_argument("--nx", type=int, default=2048)
    p.add_argument("--ny", type=int, default=1024)
    p.add_argument("--workdir", default=None, help="where caches and results go (default: a temporary "
                                                   "directory on /dev/shm, removed afterwards)")
    p.add_argument("--timeout", type=float, default=120, help="seconds allowed for each run")


def _mpi():
    try:
        return mpi_launch.detect()
    except mpi_launch.MPINotFoundError as e:
        raise SystemExit(f"hpcckpt demo: {e}") from None


def _run(label, nranks, app_args, timeout):
    mpi = _mpi()
    cmd = mpi.command(nranks, [sys.executable, "-m", "hpcckpt.demo", *app_args])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, stdin=subprocess.DEVNULL, env=mpi.env(nprocs=nranks))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        mpi_launch.kill_job(proc)
        out, err = proc.communicate()
        raise SystemExit(f"hpcckpt demo: the {label} run did not finish in {timeout:.0f} s\n{err[-2000:]}")
    finally:
        if proc.poll() is None or mpi_launch.job_processes(proc.pid):
            mpi_launch.kill_job(proc)       # ranks the launcher left behind
    seconds = time.perf_counter() - t0
    restart = [ln.split()[1] for ln in out.splitlines() if ln.startswith("RESTART ")]
    ckpts = [json.loads(ln[5:]) for ln in out.splitlines() if ln.startswith("CKPT ")]
    return proc.returncode, restart[0] if restart else None, ckpts, seconds, out, err


def run_demo(args):
    """Local: the crash / restart / compare demo. Returns the exit status."""
    import numpy as np
    own = args.workdir is None
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = tempfile.mkdtemp(prefix="hpcckpt-demo-", dir=base) if own else os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    mpi = _mpi()
    leftovers = mpi.snapshot()
    try:
        common = ["--nx", str(args.nx), "--ny", str(args.ny), "--steps", str(args.steps)]
        cache = os.path.join(work, "cache", "node{node}")
        result = os.path.join(work, "restarted.npy")
        reference = os.path.join(work, "reference.npy")
        mib = args.nx * args.ny * 8 / 2**20
        print(f"hpcckpt demo: 2-D heat equation, {args.nx}x{args.ny} float64 ({mib:.0f} MiB) on {args.ranks} ranks, "
              f"{args.steps} steps, a checkpoint every {args.every} steps (node-local level, {work}; "
              f"{mpi.flavour.title} {mpi.version})")

        rc, _, ckpts1, t1, _, _ = _run("crashing", args.ranks, common + [
            "--cache", cache, "--every", str(args.every), "--crash-at", str(args.crash_at), "--result", result],
            args.timeout)
        print(f"1. run with a crash:  rank 1 killed after step {args.crash_at}; mpiexec exit status {rc}"
              f"{' (a rank was killed)' if mpi.rank_killed(rc) else ''}; "
              f"{len(ckpts1)} checkpoints taken ({t1:.1f} s)")
        if rc == 0:
            print("   the crash did not happen (is --crash-at beyond --steps?)")
        rc, restart, ckpts2, t2, out, err = _run("restarted", args.ranks, common + [
            "--cache", cache, "--every", str(args.every), "--result", result], args.timeout)
        if rc != 0:
            print(f"hpcckpt demo: the restarted run failed (exit status {rc}):\n{err[-3000:]}", file=sys.stderr)
            return 1
        print(f"2. run again:         restarted from step {restart}, finished step {args.steps - 1} ({t2:.1f} s)")
        rc, _, _, t3, _, err = _run("reference", args.ranks, common + [
            "--cache", os.path.join(work, "ref-cache", "node{node}"), "--every", "0", "--result", reference],
            args.timeout)
        if rc != 0:
            print(f"hpcckpt demo: the reference run failed (exit status {rc}):\n{err[-3000:]}", file=sys.stderr)
            return 1
        print(f"3. failure-free run:  the reference ({t3:.1f} s)")
        a, b = np.load(result), np.load(reference)
        same = a.shape == b.shape and a.tobytes() == b.tobytes()
        print(f"final field after the crash and restart is {'BIT-FOR-BIT IDENTICAL to' if same else 'DIFFERENT from'} "
              f"the failure-free run (max |diff| = {float(np.max(np.abs(a - b))):.3g})")
        all_ckpts = ckpts1 + ckpts2
        if all_ckpts:
            print(f"\n{'step':>6}  {'level':<6} {'bytes':>12}  {'seconds':>8}  {'MiB/s':>8}")
            for step, level, nbytes, seconds in all_ckpts:
                print(f"{step:>6}  {level:<6} {nbytes:>12}  {seconds:>8.4f}  {nbytes / seconds / 2**20:>8.0f}")
            med = sorted(n / s for _, _, n, s in all_ckpts)[len(all_ckpts) // 2]
            print(f"median aggregate checkpoint bandwidth: {med / 2**20:.0f} MiB/s "
                  f"(seconds = slowest rank, from the call to the commit)")
        return 0 if same else 1
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
        leftovers.remove()   # what the killed run left (MPI segments, session files), never another job's


if __name__ == "__main__":
    heat_app()
