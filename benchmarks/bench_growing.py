"""A state that changes size at every checkpoint: checkpoint time per level against a state of
fixed size.

    python benchmarks/bench_growing.py [--ranks 4] [--size 64] [--grow 4096] [--iters 8] [--quick] [--out FILE]

One mpiexec job, one virtual node per rank (``ranks_per_node = 1``), ``keep = 1``,
``reuse_files = true`` (the default), ``background = false``. Each rank protects ``size`` MiB of
random bytes and passes a state dict holding ``rows``, a uint8 array that on every rank grows
by ``grow`` bytes at every checkpoint (particles that arrive, a history that gains rows) —
"growing" — or keeps its first length — "fixed". Per level (local, partner, xor, pfs) the two
Checkpointers are open at once and checkpoint in alternating order (the same load for both):
3 warm-up checkpoints (until the retired files are the spares that ``reuse_files``
overwrites), then ``iters`` measured ones; medians of the slowest rank's time.
What it answers: whether data that changes size keeps the speed of ``reuse_files`` (the
retired data file's mapping resized, the retired pfs node file laid out anew and overwritten)
instead of paying for new files. No target: the ratio growing / fixed should be about 1.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, command, median, parser, result_line, run_mpi, say, scratch, world, write_json  # noqa: E402

LEVELS = ("local", "partner", "xor", "pfs")
WARMUP = 3


def worker(a):
    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = world()
    u = np.random.default_rng(comm.rank).integers(0, 256, a.size * MiB, dtype=np.uint8)
    cfg = dict(cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"), ranks_per_node=1,
               group_size=min(4, comm.size), keep=1)
    res = {}
    step = 0
    for level in LEVELS:
        modes = ("fixed", "growing")
        rows = {mode: np.zeros(a.grow, np.uint8) for mode in modes}
        times = {mode: [] for mode in modes}
        ckpts = {mode: hpcckpt.Checkpointer(comm, name=f"grow_{level}_{mode}", **cfg) for mode in modes}
        try:
            for ckpt in ckpts.values():
                ckpt.protect("u", u)
            for it in range(WARMUP + a.iters):
                rows["growing"] = np.concatenate([rows["growing"], np.full(a.grow, it % 251, np.uint8)])
                for mode in (modes if it % 2 else modes[::-1]):
                    comm.Barrier()
                    t = time.perf_counter()
                    ckpts[mode].checkpoint(step, {"rows": rows[mode]}, level)
                    times[mode].append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
                step += 1
        finally:
            for ckpt in ckpts.values():
                ckpt.close()
        res[level] = {mode: t[WARMUP:] for mode, t in times.items()}
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 5 measured checkpoints", hidden=("shm", "disk"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=int, default=64, help="MiB per rank")
    p.add_argument("--grow", type=int, default=4096, help="bytes each rank's state grows by per checkpoint")
    p.add_argument("--iters", type=int, default=8, help="measured checkpoints per level and mode")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size, a.iters = 16, 5
    say(f"growing: {a.ranks} ranks x {a.size} MiB + a state growing {a.grow} bytes per checkpoint on every rank, "
        f"vs one of fixed size, {a.iters} checkpoints per level")
    with scratch("growing") as (shm, disk):
        raw = result_line(run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(a.size),
                                            "--grow", str(a.grow), "--iters", str(a.iters),
                                            "--shm", shm, "--disk", disk]))
    medians = {}
    for level, modes in raw.items():
        m = medians[level] = {mode: median(t) for mode, t in modes.items()}
        m["ratio"] = m["growing"] / m["fixed"]
        say(f"  {level:8s} fixed {m['fixed'] * 1e3:7.1f} ms, growing {m['growing'] * 1e3:7.1f} ms ({m['ratio']:.2f}x)")
    path = write_json("growing", {"command": command("bench_growing.py", argv), "ranks": a.ranks,
                                  "mib_per_rank": a.size, "grow_bytes": a.grow, "iters": a.iters,
                                  "medians_seconds": medians, "samples": raw}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
