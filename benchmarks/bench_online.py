"""Online recovery (hpcckpt.online, ULFM) vs relaunch + restart: the same job, the same level,
the same kill, at 4 and 8 ranks.

    python benchmarks/bench_online.py [--ranks 4,8] [--size 64] [--level local] [--reps 1] [--quick] [--out FILE]

Needs Open MPI (ULFM); elsewhere it says so and writes nothing. The job: each rank holds --size
MiB (int64, seeded by its rank), checkpoints at --level after every step, and worker 1 SIGKILLs
itself at the start of step 3, after writing the time to a file (the kill time).
  - online: one ULFM job (``mpirun --with-ft ulfm``) with the workers + 1 spare; the survivors
    detect, revoke, shrink, the spare takes rank 1's number and every rank restores step 2. Figures:
    ``recovery`` (each rank from its own detection to its restored state, the slowest rank) and
    ``kill_to_restored`` (the kill time to the restored state of rank 0).
  - relaunch: the same job under a plain launch: the kill ends it; a new mpiexec starts at once
    and restarts from the cache. Figures: ``launch_to_restored`` (the new job's launch to its
    restored state) and ``kill_to_restored`` (the kill time to that state: the end of the killed job,
    the new start-up, MPI_Init, imports, Checkpointer, restart).
Both jobs finish the loop and check their data bit for bit against the expected values.
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, command, median, mpi, parser, run_mpi, say, scratch, world, write_json  # noqa: E402

STEPS, KILL_AT, VICTIM = 6, 3, 1


def worker(a):
    import numpy as np
    import xxhash
    from mpi4py import MPI
    comm = world()
    n = a.size * MiB // 8
    stamp = os.path.join(a.disk, "killed")
    cfg = dict(name="onl", cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"),
               ranks_per_node=1, group_size=4, rs_parity=2, schedule={a.level: 1})

    def init(c):
        return {"data": np.random.default_rng(c.rank).integers(0, 2**62, n, dtype=np.int64)}

    def step(c, state, i):
        if i == KILL_AT and c.rank == VICTIM and not os.path.exists(stamp):
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        state["data"][::4096] += 1
        c.Barrier()

    def expected(rank):
        d = np.random.default_rng(rank).integers(0, 2**62, n, dtype=np.int64)
        d[::4096] += STEPS
        return xxhash.xxh3_64_intdigest(d)

    if a.phase == "online":
        from hpcckpt import online
        out = online.run(comm, init, step, STEPS, spares=1, **cfg)
        if not out.worker:
            return
        w = out.comm
        rec = out.recoveries[0] if out.recoveries else None
        slowest = w.allreduce(rec.seconds if rec else float("nan"), op=MPI.MAX)
        ok = all(w.allgather(xxhash.xxh3_64_intdigest(out.state["data"]) == expected(w.rank)))
        if w.rank == 0:
            with open(stamp) as f:
                killed = float(f.read())
            print("RESULT " + json.dumps({"recovery": slowest, "restored_at": rec.restored_at,
                                          "kill_to_restored": rec.restored_at - killed,
                                          "from": rec.restarted_from, "ok": ok}), flush=True)
        return
    # relaunch: a plain job with the same loop (the hpcckpt calls online.run makes)
    import hpcckpt
    state = init(comm)
    ckpt = hpcckpt.Checkpointer(comm, **cfg)
    first = ckpt.restart(state)
    comm.Barrier()
    restored_at = time.time()
    for i in range(0 if first is None else first + 1, STEPS):
        step(comm, state, i)
        level = ckpt.need_checkpoint(i)
        if level:
            ckpt.checkpoint(i, state, level=level)
    ckpt.close()
    ok = all(comm.allgather(xxhash.xxh3_64_intdigest(state["data"]) == expected(comm.rank)))
    if comm.rank == 0 and first is not None:
        with open(stamp) as f:
            killed = float(f.read())
        print("RESULT " + json.dumps({"restored_at": restored_at, "kill_to_restored": restored_at - killed,
                                      "from": first, "ok": ok}), flush=True)


def _result(out):
    lines = [ln[7:] for ln in out.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[0]) if lines else None


def main(argv=None):
    p = parser(__doc__, "4 ranks only, 16 MiB per rank, 1 repetition", hidden=("size", "shm", "disk", "phase", "level"))
    p.add_argument("--ranks", default="4,8")
    p.add_argument("--reps", type=int, default=1)
    p.set_defaults(size=64, level="local")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size, a.reps, a.ranks = 16, 1, "4"
    if not mpi().supports_ulfm:
        say(f"bench_online: {mpi()} has no usable ULFM; run it under Open MPI (HPCCKPT_MPI=openmpi)")
        return None
    rows = {}
    for nranks in [int(x) for x in a.ranks.split(",")]:
        say(f"online vs relaunch: {nranks} ranks x {a.size} MiB, level {a.level}, rank {VICTIM} killed at step "
            f"{KILL_AT}, {a.reps} repetition(s)")
        samples = {"online_recovery": [], "online_kill_to_restored": [], "relaunch_launch_to_restored": [],
                   "relaunch_kill_to_restored": []}
        for _ in range(a.reps):
            with scratch("online") as (shm, disk):
                args = [os.path.abspath(__file__), "--worker", "--size", str(a.size), "--level", a.level,
                        "--shm", shm, "--disk", disk]
                r = _result(run_mpi(nranks + 1, args + ["--phase", "online"], timeout=300, fault_tolerant=True))
                if not r or not r["ok"] or r["from"] != KILL_AT - 1:
                    raise SystemExit(f"the online job did not recover to step {KILL_AT - 1} with the right data: {r}")
                samples["online_recovery"].append(r["recovery"])
                samples["online_kill_to_restored"].append(r["kill_to_restored"])
            with scratch("online") as (shm, disk):
                args = [os.path.abspath(__file__), "--worker", "--size", str(a.size), "--level", a.level,
                        "--shm", shm, "--disk", disk, "--phase", "relaunch"]
                run_mpi(nranks, args, timeout=300, check=False)          # killed at step KILL_AT
                launched = time.time()
                r = _result(run_mpi(nranks, args, timeout=300))
                if not r or not r["ok"] or r["from"] != KILL_AT - 1:
                    raise SystemExit(f"the relaunched job did not restart from step {KILL_AT - 1} with the right data: {r}")
                samples["relaunch_launch_to_restored"].append(r["restored_at"] - launched)
                samples["relaunch_kill_to_restored"].append(r["kill_to_restored"])
        s = {k: median(v) for k, v in samples.items()}
        row = {"seconds": s, "samples": samples,
               "x_kill_to_restored": s["relaunch_kill_to_restored"] / s["online_kill_to_restored"],
               "x_recovery_vs_launch_to_restored": s["relaunch_launch_to_restored"] / s["online_recovery"]}
        rows[str(nranks)] = row
        say(f"  {nranks} ranks: online recovery {s['online_recovery']:.3f} s (kill to restored "
            f"{s['online_kill_to_restored']:.3f} s); relaunch: launch to restored {s['relaunch_launch_to_restored']:.3f} s "
            f"(kill to restored {s['relaunch_kill_to_restored']:.3f} s); kill to restored "
            f"{row['x_kill_to_restored']:.1f}x faster online")
    path = write_json("online", {"command": command("bench_online.py", argv), "mib_per_rank": a.size,
                                 "level": a.level, "reps": a.reps, "spares": 1, "ranks": rows}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
