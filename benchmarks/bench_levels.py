"""Checkpoint and restart time and bandwidth of every level, against the limits measured in the
same job, on 2, 4 and 8 ranks and 16-512 MiB per rank, with reuse_files true (the default) and
false (new files at every checkpoint, as FTI writes them).

    python benchmarks/bench_levels.py [--grid 4x64,4x256,...] [--levels local,partner,xor,rs,pfs]
                                      [--reps 3] [--no-new-files] [--gap SECONDS] [--quick] [--out FILE]
    (--quick: grid 4x16 and 2 repetitions; every level, both passes and every limit still measured)

One mpiexec job per (ranks, MiB per rank). Each job first measures, every rank at once, the
limits (common.measure_limits: memcpy, tmpfs new file / overwrite, disk write + fsync, new disk
files back to back with the previous one removed, MPI ring Sendrecv), then for each level two
passes, one after the other, each with a Checkpointer of its own (fresh cache and pfs
directories, removed after the pass):
  1. reuse_files = true: 3 warm-up checkpoints (the first is reported as ``first``; from the 4th
     on, with keep = 2, every file overwrites a retired one), ``reps`` timed checkpoints, and
     ``reps`` timed restarts, each after losing what the level exists for:
       - local:            nothing lost (restart from the cache as it is)
       - partner/xor/rs:   node 1's cache directory deleted (rebuilt from copies / parity)
       - pfs:              every node's cache deleted (read back from the HDF5 files on disk)
  2. reuse_files = false (``new_files`` in the JSON; skipped with --no-new-files): the same
     3 warm-ups and ``reps`` timed checkpoints, each creating new files and unlinking those of the
     checkpoint it retires; no restarts (they read the same files either way).
One virtual node per rank (ranks_per_node=1, cache_dir <shm>/cache-<level>-<pass>/node{node}),
group_size 4, rs_parity 2 (with 2 ranks the group is 2 ranks, so rs uses 1 parity), pfs_dir on
disk (/tmp). Time = slowest rank between barriers; aggregate = ranks x bytes per rank / time;
medians. At 4 ranks and 64 / 256 MiB, ``x_fti`` and ``x_fti_new_files`` = the checkpoint
bandwidth of pass 1 / pass 2 over FTI's (common.FTI_MIB_S).
``--gap SECONDS`` (default 0: back to back): every rank idles that long after each checkpoint,
warm-ups included, and after each step of the disk_new_files limit, as an application computes
between checkpoints; what a level leaves to run in the background (the removal of retired files)
then runs in the gap instead of in the next checkpoint. Restarts are timed back to back either way.
"""
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (FTI_MIB_S, FTI_RANKS, FTI_SOURCE, LIMITS, MiB, command, measure_limits, parse_grid, parser,  # noqa: E402
                    result_line, run_mpi, say, scratch, summarize, timed, world, write_json)

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
    res = {"limits": measure_limits(comm, data, scratch, shm_root, disk_root, a.reps, gap=a.gap)}
    del scratch
    res["new_files"] = {}
    for level in a.levels.split(","):
        r = res[level] = {"first": [], "checkpoint": [], "restart": []}
        passes = [(True, r)]
        if not a.no_new_files:
            res["new_files"][level] = {"first": [], "checkpoint": []}
            passes.append((False, res["new_files"][level]))
        for reuse, r in passes:
            tag = "reuse" if reuse else "new"
            cache_root, pfs_dir = os.path.join(a.shm, f"cache-{level}-{tag}"), os.path.join(a.disk, f"pfs-{level}-{tag}")
            my_cache = os.path.join(cache_root, f"node{comm.rank}")
            with hpcckpt.Checkpointer(comm, name="bench", cache_dir=os.path.join(cache_root, "node{node}"), pfs_dir=pfs_dir,
                                      ranks_per_node=1, group_size=4, rs_parity=2, reuse_files=reuse) as ckpt:
                ckpt.protect("data", data)
                step = 0
                # steady state from the 4th checkpoint on (keep = 2): with reuse_files only then do
                # the files (data, and the copies / parity held for others) overwrite retired ones;
                # without, every checkpoint creates new files and unlinks those of a retired one
                for w in range(3):
                    t = timed(comm, lambda: ckpt.checkpoint(step, level))
                    if w == 0:
                        r["first"].append(t)
                    step += 1
                    time.sleep(a.gap)
                for _ in range(a.reps):
                    r["checkpoint"].append(timed(comm, lambda: ckpt.checkpoint(step, level)))
                    step += 1
                    time.sleep(a.gap)
                last = step - 1
                for _ in range(a.reps if reuse else 0):    # restarts: the reuse_files pass only
                    if level == "pfs" or (level in ("partner", "xor", "rs") and comm.rank == 1):
                        shutil.rmtree(my_cache, ignore_errors=True)
                    data[:] = 0
                    got = []
                    r["restart"].append(timed(comm, lambda: got.append(ckpt.restart())))
                    ok = got[0] == last and xxhash.xxh3_64_hexdigest(data) == digest
                    if not all(comm.allgather(ok)):
                        raise SystemExit(f"restart after {level} returned {got[0]}, expected {last}, or wrong data")
            shutil.rmtree(my_cache, ignore_errors=True)          # free the memory before the next pass
            if comm.rank == 0:
                shutil.rmtree(pfs_dir, ignore_errors=True)
            comm.Barrier()
            if comm.rank == 0:
                print(f"  {comm.size} ranks x {a.size} MiB {level} (reuse_files {str(reuse).lower()}): checkpoint "
                      f"{sorted(r['checkpoint'])[len(r['checkpoint']) // 2]:.3f} s", flush=True)
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
        nf = raw.get("new_files", {}).get(level)
        if nf and nf["checkpoint"]:
            n = summarize(nf, total)
            d["new_files"] = {**n, "checkpoint_fraction_of_tmpfs_new": n["mib_s"]["checkpoint"] / lim["mib_s"]["tmpfs_new"]}
            if level == "pfs" and "disk_new_files" in lim["mib_s"]:
                d["new_files"]["checkpoint_fraction_of_disk_new_files"] = (n["mib_s"]["checkpoint"]
                                                                          / lim["mib_s"]["disk_new_files"])
        fti = FTI_MIB_S[level].get(size) if ranks == FTI_RANKS else None
        if fti:
            d["fti_mib_s"] = fti
            d["x_fti"] = s["mib_s"]["checkpoint"] / fti
            if "new_files" in d:
                d["x_fti_new_files"] = d["new_files"]["mib_s"]["checkpoint"] / fti
        row["levels"][level] = d
    return row


def main(argv=None):
    p = parser(__doc__, f"grid {QUICK_GRID}, {QUICK_REPS} repetitions")
    p.add_argument("--grid", default=None, help=f"RANKSxMIB,... (default {FULL_GRID}; --quick {QUICK_GRID})")
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--reps", type=int, default=None, help=f"default 3 ({QUICK_REPS} with --quick)")
    p.add_argument("--no-new-files", action="store_true",
                   help="skip the second pass per level with reuse_files = false (new files at every checkpoint)")
    p.add_argument("--gap", type=float, default=0.0,
                   help="seconds every rank idles after each checkpoint, as an application computes (default 0)")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.reps is None:
        a.reps = QUICK_REPS if a.quick else 3
    grid = parse_grid(a.grid or (QUICK_GRID if a.quick else FULL_GRID))
    levels = a.levels.split(",")
    rows = []
    for n, (ranks, size) in enumerate(grid, 1):
        say(f"levels [{n}/{len(grid)}] {ranks} ranks x {size} MiB per rank: limits, then {', '.join(levels)}")
        with scratch("levels") as (shm, disk):
            out = run_mpi(ranks, [os.path.abspath(__file__), "--worker", "--size", str(size), "--reps", str(a.reps),
                                  "--levels", a.levels, "--shm", shm, "--disk", disk, "--gap", str(a.gap)]
                          + (["--no-new-files"] if a.no_new_files else []))
        row = analyse(ranks, size, result_line(out), levels)
        rows.append(row)
        lm = row["limits"]["mib_s"]
        say("  limits MiB/s: " + ", ".join(f"{k} {lm[k]:.0f}" for k in LIMITS if k in lm))
        for level, d in row["levels"].items():
            say(f"  {level:8s} checkpoint {d['mib_s']['checkpoint']:7.0f} MiB/s ({d['checkpoint_fraction_of_limit']:.0%} "
                f"of {d['limit']}), restart {d['mib_s']['restart']:7.0f} MiB/s"
                + (f", new files {d['new_files']['mib_s']['checkpoint']:7.0f} MiB/s" if "new_files" in d else "")
                + (f" ({d['new_files']['checkpoint_fraction_of_disk_new_files']:.0%} of disk_new_files)"
                   if "checkpoint_fraction_of_disk_new_files" in d.get("new_files", {}) else "")
                + (f", {d['x_fti']:.1f}x FTI {d['fti_mib_s']:.0f}" if "x_fti" in d else "")
                + (f" ({d['x_fti_new_files']:.1f}x with new files)" if "x_fti_new_files" in d else ""))
    path = write_json("levels", {"command": command("bench_levels.py", argv),
                                 "reps": a.reps, "grid": [list(g) for g in grid], "levels": levels,
                                 "new_files": not a.no_new_files, "gap_s": a.gap, "fti_source": FTI_SOURCE,
                                 "config": {"ranks_per_node": 1, "group_size": 4, "rs_parity": 2,
                                            "cache": "tmpfs (/dev/shm)", "pfs_dir": "disk (/tmp)"},
                                 "rows": rows}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
