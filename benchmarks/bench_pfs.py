"""PFS-level (HDF5) checkpoint bandwidth against the disk write+fsync limit, on N ranks.

    python benchmarks/bench_pfs.py [--ranks 4] [--sizes 64,256] [--reps 3] [--quick] [--dir DIR] [--out FILE]

For each size (MiB per rank) one mpiexec job measures, every rank working at once, on a disk
directory (default: a fresh folder under /tmp; never tmpfs):
  - limit:   each rank writes its bytes to a new plain file and fsyncs it (the disk's limit)
  - save:    PfsStore.save (HDF5 node files + master + commit marker, all fsynced), for
             transfer "mpi" (ranks send to the node aggregator) and "direct" (ranks write their
             own datasets in the node file), with 2 ranks per node (2 node files) and 1 (file per rank)
  - restore: PfsStore.restore of the last step (verify checksums, then read; page cache warm)
Time = slowest rank between two barriers; aggregate bandwidth = ranks x bytes / time; medians.
FTI 1.6 L4 on the same machine (../shared/ANCHORS.md): 162 MiB/s at 64 MiB per rank, 216 at 256.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, median, run_mpi, write_json  # noqa: E402

FTI_L4 = {64: 162.0, 256: 216.0}   # MiB/s aggregate, 4 ranks
CONFIGS = (("mpi", 2), ("direct", 2), ("mpi", 1))


def worker(a):
    import numpy as np
    from mpi4py import MPI
    import hpcckpt
    from hpcckpt.levels.pfs import PfsStore
    from hpcckpt.topology import Topology

    comm = MPI.COMM_WORLD
    nbytes = a.size * MiB
    data = np.random.default_rng(comm.rank).integers(0, 2**63, nbytes // 8, dtype=np.int64)
    rows = nbytes // 8 // 1024
    field = data.reshape(rows, 1024)

    def timed(fn):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        return comm.allreduce(t, op=MPI.MAX)

    def limit(path):
        def go():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            view = memoryview(data).cast("B")
            for s in range(0, nbytes, 1 << 20):
                os.write(fd, view[s:s + (1 << 20)])
            os.fsync(fd)
            os.close(fd)
        return go

    res = {"limit": []}
    raw = os.path.join(a.dir, f"raw{comm.rank}.dat")
    for _ in range(a.reps):
        res["limit"].append(timed(limit(raw)))
        os.unlink(raw)
    arrays = [("field", field, (rows * comm.size, 1024), (rows * comm.rank, 0)),
              ("it", np.array(comm.rank, np.int64), None, None)]
    for transfer, rpn in CONFIGS:
        key = f"{transfer}_rpn{rpn}"
        cfg = hpcckpt.Config.load(None, name=f"bench_{key}", pfs_dir=a.dir, ranks_per_node=rpn)
        store = PfsStore(cfg, comm, Topology.build(comm, rpn), transfer=transfer)
        res[f"save_{key}"] = []
        for step in range(a.reps):
            ckpt_id = comm.bcast(f"b{step}" if comm.rank == 0 else None)
            res[f"save_{key}"].append(timed(lambda: store.save(step, ckpt_id, arrays)))
            store.retire(1)
        if key == "mpi_rpn2":
            target = [("field", np.empty_like(field), arrays[0][2], arrays[0][3]),
                      ("it", np.zeros((), np.int64), None, None)]
            res["restore"] = [timed(lambda: store.restore(a.reps - 1, target))]
            assert target[0][1].tobytes() == field.tobytes()
        store.retire(1)
        if comm.rank == 0:
            shutil.rmtree(store.root, ignore_errors=True)
        store.close()
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="64,256")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="16 MiB per rank, one size")
    p.add_argument("--dir", default=None, help="a directory on the disk (default: under /tmp)")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    sizes = [16] if a.quick else [int(s) for s in a.sizes.split(",")]
    base = tempfile.mkdtemp(prefix="hpcckpt-bench-pfs-", dir=a.dir or "/tmp")
    results = []
    try:
        for size in sizes:
            out = run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(size), "--reps", str(a.reps),
                                    "--dir", base])
            raw = json.loads(next(ln[7:] for ln in out.splitlines() if ln.startswith("RESULT ")))
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
    path = write_json("pfs", {"ranks": a.ranks, "directory": base, "reps": a.reps, "results": results}, a.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
