"""Local-level checkpoint and restart bandwidth against the tmpfs write limit, on N ranks.

    python benchmarks/bench_local.py [--ranks 4] [--sizes 64,256] [--reps 15] [--quick] [--out FILE]

For each size (MiB per rank) one mpiexec job measures, with every rank working at once:
  - limit_new:        each rank writes its buffer to a new file on the cache filesystem (os.write)
  - limit_overwrite:  each rank overwrites an existing file of that size, the fastest of write()
                      and a copy into a mapping of it kept open (common.tmpfs_overwrite_ways)
  - checkpoint:       Checkpointer.checkpoint(step, "local") (steady state: files reused)
  - checkpoint_first: the first checkpoint (new files)
  - no_integrity_*:   the same checkpoint with no checksum at all, the data copied into the mapped
                      file by memcpy (np.copyto) or by the kernel's own loop without the hashing
                      (non-temporal stores, ntcopy), or written in io_chunk system calls (pwrite);
                      integrity_share = 1 - (the fastest of the three) / checkpoint
  - hash_cache_hot:   each rank hashes as many bytes as it checkpoints, from a cache-hot piece of
                      data_file.HASH_PIECE bytes: what a separate hashing pass costs at least
  - restart:          Checkpointer.restart() (verify checksums, then read into the arrays)
Time = slowest rank between two barriers; aggregate bandwidth = ranks x bytes / time; medians.
FTI 1.6 L1, measured in one session with hpcckpt (../shared/ANCHORS.md; common.FTI_MIB_S): 985 MiB/s at
64 MiB per rank, 1089 at 256.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (FTI_MIB_S, MiB, command, compile_nt_copy, median, parser, result_line, run_mpi, say,  # noqa: E402
                    timed, tmpfs_overwrite_ways, world, write_file, write_json)

FTI_L1 = FTI_MIB_S["local"]         # MiB/s aggregate, 4 ranks (common: the same-session figures)
NO_INTEGRITY = ("no_integrity_memcpy", "no_integrity_ntcopy", "no_integrity_pwrite")


def worker(a):
    import numpy as np
    import hpcckpt
    from hpcckpt import data_file

    comm = world()
    data = np.random.default_rng(comm.rank).integers(0, 2**63, a.size * MiB // 8, dtype=np.int64)
    root = os.path.join(a.dir, f"r{comm.rank}")
    os.makedirs(root, exist_ok=True)

    res = {"limit_new": [], "limit_overwrite": [], "checkpoint": [], "checkpoint_first": [], "hash_cache_hot": [],
           "no_integrity_memcpy": [], "no_integrity_ntcopy": [], "no_integrity_pwrite": [], "restart": []}
    for _ in range(a.reps):
        path = os.path.join(root, "raw.dat")
        if os.path.exists(path):
            os.unlink(path)
        res["limit_new"].append(timed(comm, lambda: write_file(data, path, os.O_WRONLY | os.O_CREAT)))
        ways, close = tmpfs_overwrite_ways(data, path)      # the fastest way (common.measure_limits)
        res["limit_overwrite"].append(min(timed(comm, fn) for fn in ways.values()))
        close()
        os.unlink(path)

    cache = os.path.join(a.dir, "cache", "node{node}")
    if a.hash_piece:
        data_file.HASH_PIECE = a.hash_piece << 10
    with hpcckpt.Checkpointer(comm, name="bench", cache_dir=cache, ranks_per_node=1, io_chunk=a.io_chunk,
                              write_method=a.write_method) as ckpt:
        ckpt.protect("data", data)
        step = 0
        res["checkpoint_first"].append(timed(comm, lambda: ckpt.checkpoint(0, "local")))
        for _ in range(2):                   # fill keep=2 and the spare: steady state from here
            step += 1
            ckpt.checkpoint(step, "local")
        real = data_file.new_hasher, data_file.HASH_PIECE, data_file.copy_and_hash, data_file.write_arrays

        class NoHash:
            def update(self, b):
                pass

            def hexdigest(self):
                return "0"

        nt_copy = compile_nt_copy()

        def memcpy(src, dst, chunk, after_chunk=None):
            np.copyto(dst, src)   # glibc: non-temporal stores for large arrays
            return 0

        def ntcopy(src, dst, chunk, after_chunk=None):
            whole = src.size // 64 * 64
            nt_copy(src[:whole].view(np.uint64), dst[:whole].view(np.uint64))
            dst[whole:] = src[whole:]
            return 0

        def without_integrity(method, copy=memcpy):
            def write_by(*args):   # local.py passes write_arrays' arguments in order, the method 8th
                return real[3](*args[:7], method, *args[8:])
            data_file.new_hasher, data_file.HASH_PIECE, data_file.copy_and_hash, data_file.write_arrays = (
                NoHash, 1 << 40, copy, write_by)
            try:
                ckpt.checkpoint(step, "local")
            finally:
                data_file.new_hasher, data_file.HASH_PIECE, data_file.copy_and_hash, data_file.write_arrays = real
        real_hasher = real[0]
        hot = memoryview(data.view(np.uint8)[:data_file.HASH_PIECE])

        def hash_hot():
            h = real_hasher()
            for _ in range(data.nbytes // hot.nbytes):
                h.update(hot)
        for _ in range(a.reps):              # interleaved, so that a drift of the machine hits all alike
            step += 1
            res["checkpoint"].append(timed(comm, lambda: ckpt.checkpoint(step, "local")))
            step += 1
            res["no_integrity_memcpy"].append(timed(comm, lambda: without_integrity("mmap")))
            step += 1
            res["no_integrity_ntcopy"].append(timed(comm, lambda: without_integrity("mmap", ntcopy)))
            step += 1
            res["no_integrity_pwrite"].append(timed(comm, lambda: without_integrity("pwrite")))
            res["hash_cache_hot"].append(timed(comm, hash_hot))
        step += 1
        ckpt.checkpoint(step, "local")  # a checkpoint with real checksums to restart from
        for _ in range(a.reps):
            res["restart"].append(timed(comm, ckpt.restart))
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 2 repetitions", hidden=("size",))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="64,256", help="MiB per rank, comma-separated")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--dir", default=f"/dev/shm/hpcckpt-bench-local-{os.getpid()}")
    p.add_argument("--io-chunk", default="1MiB", help="Checkpointer io_chunk (default 1MiB)")
    p.add_argument("--write-method", default="mmap", choices=("mmap", "pwrite"),
                   help="Checkpointer write_method (default mmap)")
    p.add_argument("--hash-piece", type=int, default=0,
                   help="KiB per write-then-hash system call (default: data_file.HASH_PIECE, 128)")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    from hpcckpt import data_file
    if a.quick:
        a.sizes, a.reps = "16", 2
    rows = []
    for size in [int(s) for s in a.sizes.split(",")]:
        say(f"integrity / L1: {a.ranks} ranks x {size} MiB, local checkpoints with and without checksums")
        shutil.rmtree(a.dir, ignore_errors=True)
        try:
            out = run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(size), "--reps",
                                    str(a.reps), "--dir", a.dir, "--io-chunk", a.io_chunk, "--hash-piece", str(a.hash_piece),
                                    "--write-method", a.write_method])
        finally:
            shutil.rmtree(a.dir, ignore_errors=True)
        raw = result_line(out)
        total = a.ranks * size * MiB
        row = {"ranks": a.ranks, "mib_per_rank": size, "io_chunk": a.io_chunk, "write_method": a.write_method, "hash_piece_kib": a.hash_piece or data_file.HASH_PIECE >> 10, "seconds": {k: median(v) for k, v in raw.items()},
               "samples": raw}
        row["mib_s"] = {k: total / MiB / t for k, t in row["seconds"].items()}
        row["checkpoint_fraction_of_limit_overwrite"] = row["mib_s"]["checkpoint"] / row["mib_s"]["limit_overwrite"]
        row["checkpoint_fraction_of_limit_new"] = row["mib_s"]["checkpoint"] / row["mib_s"]["limit_new"]
        row["seconds"]["no_integrity"] = min(row["seconds"][k] for k in NO_INTEGRITY)
        row["integrity_share"] = 1 - row["seconds"]["no_integrity"] / row["seconds"]["checkpoint"]
        row["integrity_floor"] = row["seconds"]["hash_cache_hot"] / row["seconds"]["checkpoint"]
        if size in FTI_L1 and a.ranks == 4:
            row["fti_mib_s"] = FTI_L1[size]
            row["speedup_vs_fti"] = row["mib_s"]["checkpoint"] / FTI_L1[size]
        rows.append(row)
        m = row["mib_s"]
        print(f"{a.ranks} ranks x {size} MiB: checkpoint {m['checkpoint']:.0f} MiB/s (first {m['checkpoint_first']:.0f}), "
              f"restart {m['restart']:.0f} MiB/s; tmpfs limit new {m['limit_new']:.0f} / overwrite "
              f"{m['limit_overwrite']:.0f} MiB/s; checkpoint = {row['checkpoint_fraction_of_limit_overwrite']:.0%} of "
              f"the overwrite limit; integrity {row['integrity_share']:.1%} of the checkpoint time "
              f"(cache-hot hashing alone {row['integrity_floor']:.1%})"
              + (f"; {row['speedup_vs_fti']:.1f}x FTI" if "speedup_vs_fti" in row else ""), flush=True)
    path = write_json("local", {"rows": rows, "command": command("bench_local.py", argv)}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
