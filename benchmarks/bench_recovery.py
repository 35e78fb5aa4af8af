"""Recovery time after a crash, per level, in a new job: init + restart, the way FTI's recovery
figures are measured (ANCHORS.md: 256 MiB per rank, 4 ranks: L1 2.1 s, L2 4.9 s, L3 16.9 s, L4 2.7 s).

    python benchmarks/bench_recovery.py [--ranks 4] [--size 256] [--reps 3] [--quick] [--out FILE]

For each level: job 1 protects the arrays, takes two checkpoints at that level and ends (the
crash: its committed files are all that is left; a killed job leaves the same files). Then, ``reps`` times: delete what the
level must survive losing, and start job 2, which times (slowest rank, from a barrier after
MPI start-up) Checkpointer(...) + protect() (init) and restart() (read, rebuild, verify), and
checks the data bit for bit. What is deleted before each job 2:
  - local:            nothing (a process crash)
  - partner/xor/rs:   the cache directory of virtual node 1 (one rank per virtual node:
                      ranks_per_node=1, cache_dir <shm>/node{node})
  - pfs:              every node's cache (the job restarts from the HDF5 files on disk)
``wall`` is the whole job 2 as seen from outside (mpiexec, Python, imports, MPI start-up included).
Note: ``init`` includes the first use of hpcckpt's lazily imported internals (NumPy kernels,
Numba), as FTI's figure includes FTI_Init.
"""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (FTI_RECOVERY_S, MiB, command, median, parser, result_line, run_mpi, say, scratch,  # noqa: E402
                    world, write_json)

LEVELS = ("local", "partner", "xor", "rs", "pfs")


def worker(a):
    import numpy as np
    import xxhash
    from mpi4py import MPI
    import hpcckpt

    comm = world()
    n = a.size * MiB // 8
    cfg = dict(name="rec", cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"),
               ranks_per_node=1, group_size=4, rs_parity=2)
    if a.phase == "save":
        data = np.random.default_rng(comm.rank).integers(0, 2**63, n, dtype=np.int64)
        ckpt = hpcckpt.Checkpointer(comm, **cfg)
        ckpt.protect("data", data)
        for step in range(2):
            ckpt.checkpoint(step, a.level)
        ckpt.close()                 # the job then ends: its committed files are all that is left
        return
    data = np.empty(n, np.int64)
    data[:] = 0                      # touched, as an application's arrays would be
    comm.Barrier()
    t0 = time.perf_counter()
    ckpt = hpcckpt.Checkpointer(comm, **cfg)
    ckpt.protect("data", data)
    t1 = time.perf_counter()
    step = ckpt.restart()
    t2 = time.perf_counter()
    init, read = comm.allreduce(t1 - t0, op=MPI.MAX), comm.allreduce(t2 - t1, op=MPI.MAX)
    total = comm.allreduce(t2 - t0, op=MPI.MAX)
    ref = np.random.default_rng(comm.rank).integers(0, 2**63, n, dtype=np.int64)
    ok = step == 1 and xxhash.xxh3_64_intdigest(data) == xxhash.xxh3_64_intdigest(ref)
    ckpt.close()
    if not all(comm.allgather(ok)):
        raise SystemExit(f"recovery from {a.level} returned step {step} or wrong data")
    if comm.rank == 0:
        print("RESULT " + json.dumps({"init": init, "restart": read, "total": total}), flush=True)


def main(argv=None):
    p = parser(__doc__, "rs only, 16 MiB per rank, 1 repetition", hidden=("shm", "disk", "phase", "level"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=int, default=256, help="MiB per rank")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--levels", default=",".join(LEVELS))
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size, a.reps, a.levels = 16, 1, "rs"
    rows = {}
    for level in a.levels.split(","):
        say(f"recovery {level}: {a.ranks} ranks x {a.size} MiB, crash then {a.reps} restarts")
        samples = {"init": [], "restart": [], "total": [], "wall": []}
        with scratch("rec") as (shm, disk):
            common_args = [os.path.abspath(__file__), "--worker", "--size", str(a.size), "--level", level,
                           "--shm", shm, "--disk", disk]
            run_mpi(a.ranks, common_args + ["--phase", "save"])
            for _ in range(a.reps):
                if level in ("partner", "xor", "rs"):
                    shutil.rmtree(os.path.join(shm, "node1"))
                elif level == "pfs":
                    for d in os.listdir(shm):
                        shutil.rmtree(os.path.join(shm, d))
                t = time.perf_counter()
                r = result_line(run_mpi(a.ranks, common_args + ["--phase", "restart"]))
                samples["wall"].append(time.perf_counter() - t)
                for k in ("init", "restart", "total"):
                    samples[k].append(r[k])
        row = {"lost": {"local": "nothing", "pfs": "every node's cache"}.get(level, "virtual node 1's cache"),
               "seconds": {k: median(v) for k, v in samples.items()}, "samples": samples}
        row["restart_mib_s"] = a.ranks * a.size / row["seconds"]["restart"]
        if a.ranks == 4 and a.size == 256:
            row["fti_s"] = FTI_RECOVERY_S[level]
            row["x_fti"] = FTI_RECOVERY_S[level] / row["seconds"]["total"]
        rows[level] = row
        s = row["seconds"]
        say(f"  {level}: init {s['init']:.2f} s + restart {s['restart']:.2f} s = {s['total']:.2f} s "
            f"(whole job {s['wall']:.1f} s)" + (f"; FTI {row['fti_s']} s: {row['x_fti']:.1f}x FTI's speed" if "x_fti" in row else ""))
    path = write_json("recovery", {"command": command("bench_recovery.py", argv),
                                   "ranks": a.ranks, "mib_per_rank": a.size, "reps": a.reps, "levels": rows}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
