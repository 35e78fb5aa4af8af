"""PFS-level (HDF5) checkpoint bandwidth against the disk write+fsync limit, on N ranks.

    python benchmarks/bench_pfs.py [--ranks 4] [--sizes 64,256] [--reps 3] [--quick] [--dir DIR] [--out FILE]

For each size (MiB per rank) one mpiexec job measures, every rank working at once, on a disk
directory (default: a fresh folder under /tmp; never tmpfs):
  - limit:   each rank writes its bytes to a new plain file and fsyncs it (the disk's limit)
  - save:    PfsStore.save (HDF5 node files + master + commit marker, all fsynced; every rank
             writes its own datasets in its node's file), with 2 ranks per node (2 node files)
             and 1 (file per rank); the checksums are given, as the cache gives them
  - restore: PfsStore.restore of the last step (verify checksums, then read; page cache warm)
Time = slowest rank between two barriers; aggregate bandwidth = ranks x bytes / time; medians.
FTI 1.6 L4, measured in one session with hpcckpt (../shared/ANCHORS.md; common.FTI_MIB_S): 542 MiB/s at
64 MiB per rank, 399 at 256.
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (DISK, FTI_MIB_S, MiB, command, median, parser, result_line, run_mpi, say, timed, world,  # noqa: E402
                    write_file, write_json)

FTI_L4 = FTI_MIB_S["pfs"]           # MiB/s aggregate, 4 ranks (common: the same-session figures)
CONFIGS = (("direct", 2), ("direct", 1))


def worker(a):
    import numpy as np
    import hpcckpt
    from hpcckpt.levels.pfs import PfsStore
    from hpcckpt.levels.pfs_items import items_from_arrays
    from hpcckpt.topology import Topology

    comm = world()
    data = np.random.default_rng(comm.rank).integers(0, 2**63, a.size * MiB // 8, dtype=np.int64)
    rows = a.size * MiB // 8 // 1024
    field = data.reshape(rows, 1024)

    res = {"limit": []}
    raw = os.path.join(a.dir, f"raw{comm.rank}.dat")
    for _ in range(a.reps):
        res["limit"].append(timed(comm, lambda: write_file(data, raw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, fsync=True)))
        os.unlink(raw)
    arrays = [("field", field, (rows * comm.size, 1024), (rows * comm.rank, 0)),
              ("it", np.array(comm.rank, np.int64), None, None)]
    items = items_from_arrays(arrays)       # hashed once here, as the cache hashes while writing
    for transfer, rpn in CONFIGS:
        key = f"{transfer}_rpn{rpn}"
        cfg = hpcckpt.Config.load(None, name=f"bench_{key}", pfs_dir=a.dir, ranks_per_node=rpn)
        store = PfsStore(cfg, comm, Topology.build(comm, rpn))
        res[f"save_{key}"] = []
        for step in range(a.reps):
            ckpt_id = comm.bcast(f"b{step}" if comm.rank == 0 else None)
            res[f"save_{key}"].append(timed(comm, lambda: store.save(step, ckpt_id, items)))
            store.retire(1)
        if key == "direct_rpn2":
            target = [("field", np.empty_like(field), hpcckpt.Block(arrays[0][2], arrays[0][3])),
                      ("it", np.zeros((), np.int64), hpcckpt.PER_RANK)]
            res["restore"] = [timed(comm, lambda: store.restore(a.reps - 1, target))]
            assert target[0][1].tobytes() == field.tobytes()
        store.retire(1)
        if comm.rank == 0:
            shutil.rmtree(store.root, ignore_errors=True)
        store.close()
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, one size", hidden=("size",))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="64,256")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None, help="a directory on the disk (default: under /tmp)")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    sizes = [16] if a.quick else [int(s) for s in a.sizes.split(",")]
    base = tempfile.mkdtemp(prefix="hpcckpt-bench-pfs-", dir=a.dir or DISK)
    results = []
    try:
        for size in sizes:
            out = run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(size), "--reps", str(a.reps),
                                    "--dir", base])
            raw = result_line(out)
            total = a.ranks * size
            row = {"mib_per_rank": size, "seconds": {k: median(v) for k, v in raw.items()}, "raw": raw}
            row["mib_s"] = {k: total / t for k, t in row["seconds"].items()}
            row["fraction_of_limit"] = {k: row["mib_s"][k] / row["mib_s"]["limit"]
                                        for k in row["mib_s"] if k.startswith("save_")}
            if size in FTI_L4:
                row["fti_l4_mib_s"] = FTI_L4[size]
                row["x_fti"] = {k: v / FTI_L4[size] for k, v in row["mib_s"].items() if k.startswith("save_")}
            results.append(row)
            print(f"{size:4d} MiB/rank: limit {row['mib_s']['limit']:.0f} MiB/s; " +
                  "; ".join(f"{k[5:]} {row['mib_s'][k]:.0f} MiB/s ({row['fraction_of_limit'][k]:.0%})"
                            for k in row["fraction_of_limit"]) +
                  f"; restore {row['seconds']['restore']:.2f} s", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    path = write_json("pfs", {"command": command("bench_pfs.py", argv), "ranks": a.ranks, "directory": base,
                              "reps": a.reps, "results": results}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
