"""The naive baseline: every rank writes its arrays straight to the PFS directory at every
checkpoint (np.save, h5py), against hpcckpt's pfs and local levels and the disk fsync limit.

    python benchmarks/bench_naive.py [--ranks 4] [--sizes 64,256] [--reps 3] [--quick] [--out FILE]

One mpiexec job per size; every rank at once, a new file per checkpoint (the previous one
deleted afterwards, as an application keeping one checkpoint would):
  - np_save / np_save_fsync:  np.save(f"{pfs}/ckpt_{step}_{rank}.npy"), then fsync or not
  - h5py / h5py_fsync:        an h5py file per rank, one contiguous dataset, then fsync or not
  - hpcckpt_pfs:              Checkpointer.checkpoint(step, "pfs") (local copy + HDF5, fsynced, committed)
  - hpcckpt_local:            Checkpointer.checkpoint(step, "local") (tmpfs cache)
  - disk_fsync (limit):       the fastest way of writing the same bytes to a file + fsync (common.write_disk_ways:
                              a new file with 1 MiB writes, 8 MiB + early writeback, O_DIRECT; an existing one overwritten)
Without fsync the bytes are only in the page cache when the call returns: not durable.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (MiB, command, measure_limits, parser, result_line, run_mpi, say, scratch, summarize,  # noqa: E402
                    timed, world, write_json)

METHODS = ("np_save", "np_save_fsync", "h5py", "h5py_fsync", "hpcckpt_pfs", "hpcckpt_local")


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def worker(a):
    import h5py
    import numpy as np
    import hpcckpt

    comm = world()
    data = np.random.default_rng(comm.rank).integers(0, 2**63, a.size * MiB // 8, dtype=np.int64)
    pfs = os.path.join(a.disk, "naive")
    os.makedirs(pfs, exist_ok=True)
    res = {"limits": measure_limits(comm, data, None, a.disk, a.disk, a.reps, which=("disk_fsync",))}

    def np_save(step, sync):
        path = os.path.join(pfs, f"ckpt_{step}_{comm.rank}.npy")
        np.save(path, data)
        if sync:
            fsync_path(path)

    def h5(step, sync):
        path = os.path.join(pfs, f"ckpt_{step}_{comm.rank}.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=data)
        if sync:
            fsync_path(path)

    def remove_mine(keep):
        for old in os.listdir(pfs):
            if old.endswith((f"_{comm.rank}.npy", f"_{comm.rank}.h5")) and not old.startswith(f"ckpt_{keep}_"):
                os.unlink(os.path.join(pfs, old))

    step = 0
    for name, fn, sync in (("np_save", np_save, False), ("np_save_fsync", np_save, True),
                           ("h5py", h5, False), ("h5py_fsync", h5, True)):
        res[name] = []
        for _ in range(a.reps):
            res[name].append(timed(comm, lambda: fn(step, sync)))
            remove_mine(step)          # keep only the newest checkpoint (each rank its own files)
            step += 1
        remove_mine(step)
    with hpcckpt.Checkpointer(comm, name="naive", cache_dir=os.path.join(a.shm, "node{node}"),
                              pfs_dir=os.path.join(a.disk, "pfs"), ranks_per_node=1) as ckpt:
        ckpt.protect("data", data)
        for level in ("pfs", "local"):
            for _ in range(3):             # warm-up: from the 4th on, files of retired checkpoints are overwritten
                ckpt.checkpoint(step, level)
                step += 1
            res[f"hpcckpt_{level}"] = []
            for _ in range(a.reps):
                res[f"hpcckpt_{level}"].append(timed(comm, lambda: ckpt.checkpoint(step, level)))
                step += 1
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 2 repetitions")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="64,256")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.sizes, a.reps = "16", 2
    rows = []
    for size in [int(s) for s in a.sizes.split(",")]:
        say(f"naive {a.ranks} ranks x {size} MiB: np.save, h5py (with and without fsync), hpcckpt pfs and local")
        with scratch("naive") as (shm, disk):
            raw = result_line(run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(size),
                                                "--reps", str(a.reps), "--shm", shm, "--disk", disk]))
        limit = summarize(raw.pop("limits"), a.ranks * size)
        row = {"mib_per_rank": size, "limit": limit, **summarize(raw, a.ranks * size)}
        lim = limit["mib_s"]["disk_fsync"]
        row["fraction_of_disk_fsync"] = {k: v / lim for k, v in row["mib_s"].items()}
        row["hpcckpt_pfs_vs"] = {k: row["mib_s"]["hpcckpt_pfs"] / row["mib_s"][k] for k in METHODS[:4]}
        row["hpcckpt_local_vs"] = {k: row["mib_s"]["hpcckpt_local"] / row["mib_s"][k] for k in METHODS[:4]}
        rows.append(row)
        say(f"  disk fsync limit {lim:.0f} MiB/s; " + ", ".join(f"{k} {row['mib_s'][k]:.0f}" for k in METHODS) + " MiB/s")
    path = write_json("naive", {"command": command("bench_naive.py", argv),
                                "ranks": a.ranks, "reps": a.reps, "rows": rows}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
