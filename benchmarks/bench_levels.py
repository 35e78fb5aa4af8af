"""Checkpoint and restart time and bandwidth of every level, against the limits measured in the
same job, on 2, 4 and 8 ranks and 16-512 MiB per rank.

    python benchmarks/bench_levels.py [--grid 4x64,4x256,...] [--levels local,partner,xor,rs,pfs]
                                      [--reps 3] [--quick] [--out FILE]
    (--quick: grid 4x16 and 2 repetitions; every level and every limit still measured)

One mpiexec job per (ranks, MiB per rank). Each job first measures, every rank at once, the
limits (common.measure_limits: memcpy, tmpfs new file / overwrite, disk write + fsync, MPI ring
Sendrecv), then for each level: 3 warm-up checkpoints (the first is reported as ``first``; from
the 4th on, with keep = 2, every file overwrites a retired one), ``reps`` timed checkpoints, and ``reps`` timed restarts, each after losing
what the level exists for:
  - local:            nothing lost (restart from the cache as it is)
  - partner/xor/rs:   node 1's cache directory deleted (rebuilt from copies / parity)
  - pfs:              every node's cache deleted (read back from the HDF5 files on disk)
One virtual node per rank (ranks_per_node=1, cache_dir <shm>/node{node}), group_size 4,
rs_parity 2 (with 2 ranks the group is 2 ranks, so rs uses 1 parity), pfs_dir on disk (/tmp).
Time = slowest rank between barriers; aggregate = ranks x bytes per rank / time; medians.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (FTI_MIB_S, LIMITS, MiB, command, measure_limits, parser, result_line, run_mpi,  # noqa: E402
                    say, scratch, summarize, timed, world, write_json)

LEVELS = ("local", "partner", "xor", "rs", "pfs")
FULL_GRID = "4x16,4x64,4x256,4x512,2x64,2x256,8x64,8x256"
QUICK_GRID = "4x16"
QUICK_REPS = 2
LIMIT_OF = {"local": "tmpfs_overwrite", "partner": "tmpfs_overwrite", "xor": "tmpfs_overwrite",
            "rs": "tmpfs_overwrite", "pfs": "disk_fsync"}


def worker(a):
    import numpy as np
    import xxhash
    import hpcckpt

    comm = world()
    nbytes = a.size * MiB
    data = np.random.default_rng(comm.rank).integers(0, 2**63, nbytes // 8, dtype=np.int64)
    digest = xxhash.xxh3_64_hexdigest(data)
    scratch = np.ones_like(data)
    shm_root, disk_root = os.path.join(a.shm, "limits"), os.path.join(a.disk, "limits")
    os.makedirs(shm_root, exist_ok=True)
    os.makedirs(disk_root, exist_ok=True)
    res = {"limits": measure_limits(comm, data, scratch, shm_root, disk_root, a.reps)}
    del scratch
    cache = os.path.join(a.shm, "cache", "node{node}")
    my_cache = os.path.join(a.shm, "cache", f"node{comm.rank}")
    with hpcckpt.Checkpointer(comm, name="bench", cache_dir=cache, pfs_dir=os.path.join(a.disk, "pfs"),
                              ranks_per_node=1, group_size=4, rs_parity=2) as ckpt:
        ckpt.protect("data", data)
        step = 0
        for level in a.levels.split(","):
            r = res[level] = {"first": [], "checkpoint": [], "restart": []}
            # steady state from the 4th checkpoint of a level on (keep = 2): only then do the
            # files (data, and the copies / parity held for others) overwrite retired ones
            for w in range(3):
                t = timed(comm, lambda: ckpt.checkpoint(step, level))
                if w == 0:
                    r["first"].append(t)
                step += 1
            for _ in range(a.reps):
                r["checkpoint"].append(timed(comm, lambda: ckpt.checkpoint(step, level)))
                step += 1
            last = step - 1
            for _ in range(a.reps):
                if level == "pfs" or (level in ("partner", "xor", "rs") and comm.rank == 1):
                    shutil.rmtree(my_cache, ignore_errors=True)
                data[:] = 0
                got = []
                r["restart"].append(timed(comm, lambda: got.append(ckpt.restart())))
                ok = got[0] == last and xxhash.xxh3_64_hexdigest(data) == digest
                if not all(comm.allgather(ok)):
                    raise SystemExit(f"restart after {level} returned {got[0]}, expected {last}, or wrong data")
            if comm.rank == 0:
                print(f"  {comm.size} ranks x {a.size} MiB {level}: checkpoint {sorted(r['checkpoint'])[len(r['checkpoint']) // 2]:.3f} s",
                      flush=True)
    if comm.rank == 0:
        print("RESULT " + __import__("json").dumps(res), flush=True)


def analyse(ranks, size, raw, levels):
    total = ranks * size
    lim = summarize(raw["limits"], total)
    row = {"ranks": ranks, "mib_per_rank": size, "limits": lim, "levels": {}}
    for level in levels:
        s = summarize(raw[level], total)
        limit_key = LIMIT_OF[level]
        d = {**s, "limit": limit_key,
             "checkpoint_fraction_of_limit": s["mib_s"]["checkpoint"] / lim["mib_s"][limit_key],
             "checkpoint_fraction_of_tmpfs_new": s["mib_s"]["checkpoint"] / lim["mib_s"]["tmpfs_new"],
             "restart_fraction_of_memcpy": s["mib_s"]["restart"] / lim["mib_s"]["memcpy"]}
        if level == "partner" and "mpi_ring" in lim["mib_s"]:
            d["checkpoint_fraction_of_mpi_ring"] = s["mib_s"]["checkpoint"] / lim["mib_s"]["mpi_ring"]
        fti = FTI_MIB_S[level].get(size) if ranks == 4 else None
        if fti:
            d["fti_mib_s"] = fti
            d["x_fti"] = s["mib_s"]["checkpoint"] / fti
        row["levels"][level] = d
    return row


def main(argv=None):
    p = parser(__doc__, f"grid {QUICK_GRID}, {QUICK_REPS} repetitions")
    p.add_argument("--grid", default=None, help=f"RANKSxMIB,... (default {FULL_GRID}; --quick {QUICK_GRID})")
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--reps", type=int, default=None, help=f"default 3 ({QUICK_REPS} with --quick)")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.reps is None:
        a.reps = QUICK_REPS if a.quick else 3
    grid = [tuple(int(x) for x in g.split("x")) for g in (a.grid or (QUICK_GRID if a.quick else FULL_GRID)).split(",")]
    levels = a.levels.split(",")
    rows = []
    for n, (ranks, size) in enumerate(grid, 1):
        say(f"levels [{n}/{len(grid)}] {ranks} ranks x {size} MiB per rank: limits, then {', '.join(levels)}")
        with scratch("levels") as (shm, disk):
            out = run_mpi(ranks, [os.path.abspath(__file__), "--worker", "--size", str(size), "--reps", str(a.reps),
                                  "--levels", a.levels, "--shm", shm, "--disk", disk])
        row = analyse(ranks, size, result_line(out), levels)
        rows.append(row)
        lm = row["limits"]["mib_s"]
        say("  limits MiB/s: " + ", ".join(f"{k} {lm[k]:.0f}" for k in LIMITS if k in lm))
        for level, d in row["levels"].items():
            say(f"  {level:8s} checkpoint {d['mib_s']['checkpoint']:7.0f} MiB/s ({d['checkpoint_fraction_of_limit']:.0%} "
                f"of {d['limit']}), restart {d['mib_s']['restart']:7.0f} MiB/s"
                + (f", {d['x_fti']:.1f}x FTI {d['fti_mib_s']:.0f}" if "x_fti" in d else ""))
    path = write_json("levels", {"command": command("bench_levels.py", argv),
                                 "reps": a.reps, "grid": [list(g) for g in grid], "levels": levels,
                                 "config": {"ranks_per_node": 1, "group_size": 4, "rs_parity": 2,
                                            "cache": "tmpfs (/dev/shm)", "pfs_dir": "disk (/tmp)"},
                                 "rows": rows}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
