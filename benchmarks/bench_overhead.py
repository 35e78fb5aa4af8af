"""End-to-end overhead: an application loop with checkpoints at the Daly interval of a stated
MTBF, total run time with vs without checkpointing, per level.

    python benchmarks/bench_overhead.py [--ranks 4] [--size 64] [--steps 1000] [--mtbf 10min]
                                        [--reps 2] [--quick] [--out FILE]

One mpiexec job, one virtual node per rank. The application: a 2-D heat equation (5-point
stencil, halo rows exchanged with Sendrecv every step) on ``size`` MiB of float64 per rank.
Modes, interleaved ``reps`` times in the same job (medians): ``none`` (no Checkpointer at all),
then for ``local``, ``partner`` and ``partner`` with ``background = true``: a Checkpointer with
``policy = "daly"``, ``mtbf`` and that level, ``need_checkpoint(step)`` every step and
``checkpoint(step, level)`` when it answers. Once per job and not in the loop's time: the
Checkpointer's set-up and a first checkpoint, from which the policy knows the level's cost and
sets the interval (reported as ``start_seconds``: what a job pays once, whatever its length).
overhead = (loop time of the mode − loop time of ``none``) / loop time of ``none``; beside it
``blocked_share`` = time spent inside ``checkpoint()`` / loop time of ``none`` (the part of the
overhead that does not depend on how the loop's own time varies between runs on a loaded
machine). Target (issue: background redundancy, after CheckFreq): ≤ 3.5 % for local and partner.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, command, median, parser, result_line, run_mpi, say, scratch, world, write_json  # noqa: E402

MODES = ("none", "local", "partner", "partner+background")
TARGET = 0.035


def worker(a):
    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = world()
    rank, size = comm.rank, comm.size
    ny = 1024
    nloc = max(4, a.size * MiB // 8 // ny)
    up = rank - 1 if rank > 0 else MPI.PROC_NULL
    down = rank + 1 if rank < size - 1 else MPI.PROC_NULL
    u = np.zeros((nloc + 2, ny))
    new = np.empty((nloc, ny - 2))

    def reset():
        u[...] = 0.0
        u[1:-1] = np.random.default_rng(rank).random((nloc, ny))
        if rank == size - 1:
            u[-1] = 1.0

    def step():
        comm.Sendrecv(u[1], dest=up, recvbuf=u[-1], source=down)
        comm.Sendrecv(u[-2], dest=down, recvbuf=u[0], source=up)
        c, d = u[1:-1, 1:-1], new
        np.add(u[:-2, 1:-1], u[2:, 1:-1], out=d)
        d += u[1:-1, :-2]
        d += u[1:-1, 2:]
        d -= 4.0 * c
        d *= 0.2
        c += d

    cfg = dict(cache_dir=os.path.join(a.shm, "node{node}"), ranks_per_node=1, policy="daly", mtbf=a.mtbf)
    runs = {m: [] for m in MODES}
    for rep in range(a.reps):
        for mode in MODES:
            reset()
            comm.Barrier()
            t = time.perf_counter()
            taken, blocked, start = [], 0.0, 0.0
            if mode == "none":
                for s in range(a.steps):
                    step()
            else:
                level = mode.split("+")[0]
                with hpcckpt.Checkpointer(comm, name=f"overhead_{mode.replace('+', '_')}_{rep}", level=level,
                                          background=mode.endswith("background"), **cfg) as ckpt:
                    ckpt.protect("u", u[1:-1])
                    # once per job, not timed with the loop: set-up and a first checkpoint (the
                    # policy's measurement of the level's cost; files and kernels are created)
                    ckpt.checkpoint(0, level)
                    ckpt.wait()
                    start = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                    t = time.perf_counter()
                    for s in range(1, a.steps + 1):
                        step()
                        due = ckpt.need_checkpoint(s)
                        if due:
                            info = ckpt.checkpoint(s, due)
                            taken.append(due)
                            blocked += info.seconds
                    summary = ckpt.policy.summary() if rank == 0 else None
            seconds = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            runs[mode].append({"seconds": seconds, "start_seconds": start, "checkpoints": len(taken),
                               "levels": sorted(set(taken)), "blocked": blocked, "policy": None if mode == "none" else summary})
    if rank == 0:
        print("RESULT " + json.dumps({"runs": runs, "rows_per_rank": nloc, "cols": ny}), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 200 steps, MTBF 30 s, 2 repetitions", hidden=("shm", "disk"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=int, default=64, help="MiB per rank")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--mtbf", default="10min", help="the system MTBF the Daly interval is computed for")
    p.add_argument("--reps", type=int, default=2)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size, a.steps, a.mtbf, a.reps = 16, 200, "30s", 2
    say(f"overhead: {a.ranks} ranks x {a.size} MiB heat equation, {a.steps} steps, Daly interval for MTBF {a.mtbf}, "
        f"{a.reps} repetitions of {', '.join(MODES)}")
    with scratch("overhead") as (shm, disk):
        raw = result_line(run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(a.size),
                                            "--steps", str(a.steps), "--mtbf", a.mtbf, "--reps", str(a.reps),
                                            "--shm", shm, "--disk", disk], timeout=3600))
    runs = raw["runs"]
    base = median([r["seconds"] for r in runs["none"]])
    summary = {}
    for mode in MODES:
        t = median([r["seconds"] for r in runs[mode]])
        summary[mode] = {"seconds": t, "overhead": (t - base) / base,
                         "checkpoints": median([r["checkpoints"] for r in runs[mode]]),
                         "blocked_seconds": median([r["blocked"] for r in runs[mode]]),
                         "start_seconds": median([r["start_seconds"] for r in runs[mode]])}
        summary[mode]["blocked_share"] = summary[mode]["blocked_seconds"] / base
        if mode != "none":
            summary[mode]["policy"] = runs[mode][-1]["policy"]
        say(f"  {mode:20s} {t:7.2f} s" + ("" if mode == "none" else
            f"  overhead {summary[mode]['overhead']:+.1%}, {summary[mode]['checkpoints']:.0f} checkpoints, "
            f"{summary[mode]['blocked_seconds']:.2f} s blocked in checkpoint() "
            f"({summary[mode]['blocked_share']:.1%}); "
            f"start (set-up + first checkpoint, once per job) {summary[mode]['start_seconds']:.2f} s"))
    targets = {m: {"target": f"overhead <= {TARGET:.1%}", "value": summary[m]["overhead"],
                   "blocked_share": summary[m]["blocked_share"],
                   "met": summary[m]["overhead"] <= TARGET} for m in MODES if m != "none"}
    path = write_json("overhead", {"command": command("bench_overhead.py", argv), "ranks": a.ranks,
                                   "mib_per_rank": a.size, "steps": a.steps, "mtbf": a.mtbf, "reps": a.reps,
                                   "summary": summary, "targets": targets, "samples": raw}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
