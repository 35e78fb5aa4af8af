"""What one collective call costs as the number of ranks grows (the library's own overhead).

    python benchmarks/bench_calls.py [--ranks 2,4,8,16] [--reps 50] [--quick]

For each rank count one mpiexec job (ranks_per_node = 1, a tiny state: 8 KiB per rank, local
level) measures, medians over ``reps`` calls, the slowest rank's time of
  - need_checkpoint(step)                      (the per-step decision)
  - checkpoint(step, state) at the local level (metadata agreement + a tiny write + commit)
  - restart(state)                             (the scan and choice of a step; a new Checkpointer)
and the bytes each rank unpickles per call (mpi4py's pickle hook): on the success path these
must not grow with the number of ranks. Then, in this process, the per-rank Python work that
does depend on P — placing partner copies and encoding groups at start-up — for simulated P up
to 100,000. Ranks above the core count share cores: times at 8-16 ranks on 2 cores measure
oversubscription as much as the library.
"""
import json
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command, median, parser, result_line, run_mpi, say, scratch, world, write_json  # noqa: E402


def worker(a):
    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    unpickled = [0]

    def loads(data, *args, **kw):
        unpickled[0] += len(data)
        return pickle.loads(data, *args, **kw)
    MPI.pickle.__init__(pickle.dumps, loads)
    comm = world()
    kwargs = dict(name="calls", cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"),
                  ranks_per_node=1, log_level="ERROR")
    u = np.arange(1024, dtype=np.float64)
    res = {}

    def measure(key, fn, reps):
        times, nbytes = [], []
        for _ in range(reps):
            comm.Barrier()
            unpickled[0] = 0
            t = time.perf_counter()
            fn()
            elapsed, mine = time.perf_counter() - t, unpickled[0]     # before the benchmark's own messages
            times.append(comm.allreduce(elapsed, op=MPI.MAX))
            nbytes.append(comm.allreduce(mine, op=MPI.MAX))
        res[key] = {"seconds": median(times), "unpickled_max_per_rank": max(nbytes)}

    with hpcckpt.Checkpointer(comm, **kwargs) as ckpt:
        step = [0]

        def one_checkpoint():
            ckpt.checkpoint(step[0], {"u": u, "t": float(step[0])}, level="local")
            step[0] += 1
        one_checkpoint()                                   # first call: Numba kernel load
        measure("need_checkpoint", lambda: ckpt.need_checkpoint(step[0]), a.reps)
        measure("checkpoint_local_8KiB", one_checkpoint, a.reps)

    def one_restart():
        with hpcckpt.Checkpointer(comm, **kwargs) as c:
            c.restart({"u": np.empty_like(u), "t": 0.0})
    measure("construct_and_restart", one_restart, max(3, a.reps // 10))
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def simulated(ps):
    from hpcckpt.topology import encoding_groups, partner_holders
    out = []
    for p in ps:
        node_of = [r // 4 for r in range(p)]
        t = time.perf_counter()
        partner_holders(node_of)
        t1 = time.perf_counter()
        encoding_groups(node_of, 4)
        t2 = time.perf_counter()
        out.append({"P": p, "partner_holders_s": t1 - t, "encoding_groups_s": t2 - t1})
        say(f"   simulated P={p}: partner_holders {t1 - t:.3f} s, encoding_groups {t2 - t1:.3f} s (once, at start-up)")
    return out


def main(argv=None):
    p = parser(__doc__, "2 and 4 ranks, 10 repetitions, simulated P up to 10,000")
    p.add_argument("--ranks", default="2,4,8,16")
    p.add_argument("--reps", type=int, default=50)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    ranks = [2, 4] if a.quick else [int(x) for x in a.ranks.split(",")]
    reps = 10 if a.quick else a.reps
    rows = []
    for n in ranks:
        with scratch("calls") as (shm, disk):
            out = run_mpi(n, [os.path.abspath(__file__), "--worker", "--shm", shm, "--disk", disk, "--reps", str(reps)])
        row = {"ranks": n, **result_line(out)}
        rows.append(row)
        say(f"calls on {n:2d} ranks: " + "; ".join(
            f"{k} {v['seconds'] * 1e3:.2f} ms, {v['unpickled_max_per_rank']} B unpickled/rank"
            for k, v in row.items() if k != "ranks"))
    sim = simulated([1000, 10000] if a.quick else [1000, 10000, 100000])
    path = write_json("calls", {"command": command("bench_calls.py", argv), "reps": reps, "results": rows,
                                "simulated": sim}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
