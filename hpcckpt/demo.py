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
from .levels.registry import LEVELS


# ---------------------------------------------------------------------------- the application
def _rows(nx, size, rank):
    """Local: every rank's number of rows, this rank's first row and its number of rows."""
    rows = [nx // size + (1 if r < nx % size else 0) for r in range(size)]
    return rows, sum(rows[:rank]), rows[rank]


def _initial_field(nx, ny, size, rank):
    """Local: this rank's rows of the initial field, with one halo row above and below."""
    import numpy as np
    _, row0, nloc = _rows(nx, size, rank)
    u = np.zeros((nloc + 2, ny))
    gi = np.arange(row0, row0 + nloc)[:, None]
    gj = np.arange(ny)[None, :]
    u[1:-1] = np.exp(-((gi - nx / 2) ** 2 + (gj - ny / 2) ** 2) / (0.02 * nx * ny))
    if rank == size - 1:
        u[-1] = 1.0                          # a hot bottom edge
    return u


def _advance(comm, u, new, alpha):
    """Collective with the neighbouring ranks: exchange the halo rows, then one explicit step of
    the heat equation on this rank's rows of ``u`` (``new``: scratch of the interior's shape)."""
    import numpy as np
    from mpi4py import MPI
    rank, size = comm.rank, comm.size
    up, down = (rank - 1 if rank > 0 else MPI.PROC_NULL), (rank + 1 if rank < size - 1 else MPI.PROC_NULL)
    comm.Sendrecv(u[1], dest=up, recvbuf=u[-1], source=down)
    comm.Sendrecv(u[-2], dest=down, recvbuf=u[0], source=up)
    c = u[1:-1, 1:-1]
    np.add(u[:-2, 1:-1], u[2:, 1:-1], out=new)
    new += u[1:-1, :-2]
    new += u[1:-1, 2:]
    new -= 4.0 * c
    new *= alpha
    c += new


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
    p.add_argument("--online-spares", type=int, default=0, help="run under hpcckpt.online with this many spares")
    a = p.parse_args(argv)
    if a.online_spares > 0:
        return heat_online_app(a)

    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    rows, row0, nloc = _rows(a.nx, size, rank)
    alpha = 0.2
    u = _initial_field(a.nx, a.ny, size, rank)
    new = np.empty((nloc, a.ny - 2))
    step_done = np.full((), -1, np.int64)

    rpn = a.ranks_per_node if a.ranks_per_node == "auto" else int(a.ranks_per_node)
    schedule = {LEVELS[0]: a.every if a.every > 0 else 10 ** 9}      # the cheapest level
    with hpcckpt.Checkpointer(comm, name="heat", cache_dir=a.cache, ranks_per_node=rpn,
                              schedule=schedule) as ckpt:
        ckpt.protect("temperature", u[1:-1], global_shape=(a.nx, a.ny), offset=(row0, 0))
        ckpt.protect("step", step_done)
        start = ckpt.restart() if a.every > 0 else None
        if rank == 0:
            print(f"RESTART {start} {time.time():.6f}", flush=True)     # the time: the relaunch figure of --online
        for step in range(0 if start is None else start + 1, a.steps):
            _advance(comm, u, new, alpha)
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


def heat_online_app(a):
    """Collective (under a ULFM launch): the same heat equation, run by hpcckpt.online.run on
    COMM_WORLD minus ``a.online_spares`` spares; rank 1 is killed after ``a.crash_at`` (once)."""
    import numpy as np
    from mpi4py import MPI
    from . import online
    alpha, rpn = 0.2, (a.ranks_per_node if a.ranks_per_node == "auto" else int(a.ranks_per_node))
    marker = a.result + ".killed"

    def init(comm):
        return {"u": _initial_field(a.nx, a.ny, comm.size, comm.rank), "step": np.full((), -1, np.int64)}

    def step(comm, state, i):
        rank, size, u = comm.rank, comm.size, state["u"]
        _advance(comm, u, np.empty((u.shape[0] - 2, a.ny - 2)), alpha)
        state["step"][...] = i
        if i == a.crash_at and rank == min(1, size - 1) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    def recovered(r):
        print(f"RECOVERED {json.dumps([r.restarted_from, r.seconds, list(r.lost)])}", flush=True)

    schedule = {LEVELS[0]: a.every if a.every > 0 else 10 ** 9}
    out = online.run(MPI.COMM_WORLD, init, step, a.steps, spares=a.online_spares, name="heat", cache_dir=a.cache,
                     ranks_per_node=rpn, schedule=schedule,
                     on_recovery=lambda r: recovered(r) if r.replaced_by and out_rank0() else None)
    if not out.worker:
        return
    comm, u = out.comm, out.state["u"]
    rows, _, _ = _rows(a.nx, comm.size, comm.rank)
    field = np.empty((a.nx, a.ny)) if comm.rank == 0 else None
    comm.Gatherv(np.ascontiguousarray(u[1:-1]), [field, [r * a.ny for r in rows]] if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        np.save(a.result, field)
        print(f"DONE {len(out.recoveries)}", flush=True)


def out_rank0():
    """Local: whether this process is worker 0 of the online demo (the worker ranks keep the
    original numbers, so it is world rank 0 unless rank 0 itself was replaced)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.rank == 0


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
    p.add_argument("--online", action="store_true", help="recover online instead (hpcckpt.online, Open MPI with "
                                                         "ULFM): the killed rank is replaced by a spare, the job "
                                                         "never exits; recovery time next to relaunch time")
    p.add_argument("--spares", type=int, default=1, help="spare processes with --online (default 1)")


def _mpi():
    try:
        return mpi_launch.detect()
    except mpi_launch.MPINotFoundError as e:
        raise SystemExit(f"hpcckpt demo: {e}") from None


def _run(label, nranks, app_args, timeout, fault_tolerant=False):
    mpi = _mpi()
    cmd = mpi.command(nranks, [sys.executable, "-m", "hpcckpt.demo", *app_args], fault_tolerant=fault_tolerant)
    t0 = time.perf_counter()
    _run.launched = time.time()
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
    if getattr(args, "online", False):
        return run_demo_online(args)
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


def run_demo_online(args):
    """Local: the online-recovery demo (Open MPI with ULFM): one job in which rank 1 is killed and
    a spare takes its place, compared bit for bit with a failure-free run; then the relaunch
    path (crash, relaunch, restart) for the time it takes. Returns the exit status (2: no ULFM)."""
    import numpy as np
    mpi = _mpi()
    if not mpi.supports_ulfm:
        print(f"hpcckpt demo --online: {mpi_launch.ulfm_refusal(f'{mpi.flavour.title} {mpi.version}'.strip())}",
              file=sys.stderr)
        return 2
    own = args.workdir is None
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = tempfile.mkdtemp(prefix="hpcckpt-demo-", dir=base) if own else os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    leftovers = mpi.snapshot()
    try:
        common = ["--nx", str(args.nx), "--ny", str(args.ny), "--steps", str(args.steps)]
        every = ["--every", str(args.every)]
        mib = args.nx * args.ny * 8 / 2**20
        print(f"hpcckpt demo --online: 2-D heat equation, {args.nx}x{args.ny} float64 ({mib:.0f} MiB) on {args.ranks} "
              f"ranks + {args.spares} spare(s), {args.steps} steps, a checkpoint every {args.every} steps (node-local "
              f"level, {work}; {mpi.flavour.title} {mpi.version}, ULFM)")
        result = os.path.join(work, "online.npy")
        rc, _, _, t1, out, err = _run("online", args.ranks + args.spares, common + every + [
            "--cache", os.path.join(work, "cache", "node{node}"), "--crash-at", str(args.crash_at),
            "--result", result, "--online-spares", str(args.spares)], args.timeout, fault_tolerant=True)
        recs = [json.loads(ln[10:]) for ln in out.splitlines() if ln.startswith("RECOVERED ")]
        if rc != 0 or not os.path.exists(result):
            print(f"hpcckpt demo --online: the online run failed (exit status {rc}):\n{err[-3000:]}", file=sys.stderr)
            return 1
        if not recs:
            print("   the crash did not happen (is --crash-at beyond --steps?)")
            return 1
        restarted_from, recovery_s, lost = recs[0]
        print(f"1. one job, rank {lost[0]} killed after step {args.crash_at}: a spare took its place, restarted "
              f"from step {restarted_from} without leaving mpiexec; recovery {recovery_s:.3f} s (detection to "
              f"restored state, rank 0); finished, exit status {rc} ({t1:.1f} s)")
        reference = os.path.join(work, "reference.npy")
        rc, _, _, t3, _, err = _run("reference", args.ranks, common + [
            "--cache", os.path.join(work, "ref-cache", "node{node}"), "--every", "0", "--result", reference],
            args.timeout)
        if rc != 0:
            print(f"hpcckpt demo --online: the reference run failed (exit status {rc}):\n{err[-3000:]}", file=sys.stderr)
            return 1
        print(f"2. failure-free run:  the reference ({t3:.1f} s)")
        # the relaunch path, for its time: crash, then a new mpiexec that restarts from the cache
        cache = os.path.join(work, "relaunch-cache", "node{node}")
        relaunched = os.path.join(work, "relaunched.npy")
        _run("crashing", args.ranks, common + every + ["--cache", cache, "--crash-at", str(args.crash_at),
                                                       "--result", relaunched], args.timeout)
        rc, restart, _, t2, out, err = _run("restarted", args.ranks, common + every + [
            "--cache", cache, "--result", relaunched], args.timeout)
        stamps = [float(ln.split()[2]) for ln in out.splitlines() if ln.startswith("RESTART ") and len(ln.split()) > 2]
        relaunch_s = stamps[0] - _run.launched if stamps else float("nan")
        print(f"3. the relaunch path: a new mpiexec restarted from step {restart}: {relaunch_s:.3f} s from the "
              f"launch to the restored state")
        a, b = np.load(result), np.load(reference)
        same = a.shape == b.shape and a.tobytes() == b.tobytes()
        print(f"final field after the online recovery is {'BIT-FOR-BIT IDENTICAL to' if same else 'DIFFERENT from'} "
              f"the failure-free run (max |diff| = {float(np.max(np.abs(a - b))):.3g})")
        print(f"recovery: online {recovery_s:.3f} s vs relaunch + restart {relaunch_s:.3f} s "
              f"({relaunch_s / recovery_s:.1f}x)")
        return 0 if same else 1
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
        leftovers.remove()


if __name__ == "__main__":
    heat_app()
