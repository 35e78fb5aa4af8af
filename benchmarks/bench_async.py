"""Async flush overlap: how much of the pfs flush time the application gets back with
``async_flush=true``, against synchronous pfs checkpoints.

    python benchmarks/bench_async.py [--ranks 4] [--size 64] [--iters 4] [--quick] [--out FILE]

One mpiexec job. The application loop: compute (passes of ``u = u * a + b`` over the protected
float64 array, calibrated so one compute phase lasts about as long as one synchronous pfs
checkpoint), then ``checkpoint(step, "pfs")``; ``iters`` iterations, then ``wait()``.
Measured (slowest rank): the whole loop, the compute phases, and the checkpoint calls, for
  - sync:  async_flush=false (each call returns once the HDF5 files are fsynced and committed)
  - async: async_flush=true  (each call returns once the step is in the cache; the flush runs in
           a background thread, and the next checkpoint/wait() waits for it)
  - local: the same loop with local checkpoints (what a checkpoint costs without the flush)
flush = median sync checkpoint - median local checkpoint;
gained = (loop_sync - loop_async) / (iters x flush): 1 means the flush is completely hidden.
The background thread competes with the application for 2 cores here: ``compute_slowdown``
is compute time under async / compute time under sync.
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, command, median, parser, result_line, run_mpi, say, scratch, world, write_json  # noqa: E402


def worker(a):
    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = world()
    u = np.random.default_rng(comm.rank).random(a.size * MiB // 8)

    def one_pass():
        np.multiply(u, 0.999999, out=u)
        np.add(u, 1e-7, out=u)

    def mx(t):
        return comm.allreduce(t, op=MPI.MAX)

    cfg = dict(cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"), ranks_per_node=1)
    res = {}
    passes = None
    step = 0
    for mode in ("sync", "calibrate", "async", "local", "sync"):
        if mode == "calibrate":
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(5):
                one_pass()
            per_pass = mx(time.perf_counter() - t) / 5
            passes = max(1, math.ceil(median(res["sync"]["checkpoint"][1:] or res["sync"]["checkpoint"]) / per_pass))
            res["passes"], res["pass_seconds"] = passes, per_pass
            del res["sync"]                 # the first sync round only calibrated (and warmed up)
            continue
        level = "local" if mode == "local" else "pfs"
        r = {"loop": 0.0, "compute": [], "checkpoint": []}
        with hpcckpt.Checkpointer(comm, name=f"async_{mode}_{step}", async_flush=(mode == "async"), **cfg) as ckpt:
            ckpt.protect("u", u)
            ckpt.checkpoint(step, level)   # warm-up: files, kernels
            ckpt.wait()
            step += 1
            comm.Barrier()
            t_loop = time.perf_counter()
            for _ in range(a.iters if passes else min(3, a.iters)):
                t = time.perf_counter()
                for _ in range(passes or 1):
                    one_pass()
                r["compute"].append(time.perf_counter() - t)
                t = time.perf_counter()
                ckpt.checkpoint(step, level)
                r["checkpoint"].append(time.perf_counter() - t)
                step += 1
            ckpt.wait()
            r["loop"] = mx(time.perf_counter() - t_loop)
        r["compute"] = [mx(x) for x in r["compute"]]
        r["checkpoint"] = [mx(x) for x in r["checkpoint"]]
        res[mode] = r
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 2 iterations", hidden=("shm", "disk"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=int, default=64, help="MiB per rank")
    p.add_argument("--iters", type=int, default=4)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size, a.iters = 16, 2
    say(f"async flush: {a.ranks} ranks x {a.size} MiB, {a.iters} iterations of compute + pfs checkpoint, sync vs async")
    with scratch("async") as (shm, disk):
        raw = result_line(run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(a.size),
                                            "--iters", str(a.iters), "--shm", shm, "--disk", disk]))
    m = {mode: {"loop": raw[mode]["loop"], "compute": median(raw[mode]["compute"]),
                "checkpoint": median(raw[mode]["checkpoint"])} for mode in ("sync", "async", "local")}
    flush = m["sync"]["checkpoint"] - m["local"]["checkpoint"]
    gained = (m["sync"]["loop"] - m["async"]["loop"]) / (a.iters * flush) if flush > 0 else None
    summary = {"flush_seconds": flush, "fraction_of_flush_gained": gained,
               "loop_speedup": m["sync"]["loop"] / m["async"]["loop"],
               "compute_slowdown": m["async"]["compute"] / m["sync"]["compute"],
               "async_checkpoint_call_vs_local": m["async"]["checkpoint"] / m["local"]["checkpoint"]}
    say(f"  loop: sync {m['sync']['loop']:.2f} s, async {m['async']['loop']:.2f} s, local-only {m['local']['loop']:.2f} s; "
        f"checkpoint call: sync {m['sync']['checkpoint']:.2f} s, async {m['async']['checkpoint']:.2f} s; "
        f"flush {flush:.2f} s, {gained:.0%} of it gained; compute slowdown {summary['compute_slowdown']:.2f}x")
    path = write_json("async", {"command": command("bench_async.py", argv),
                                "ranks": a.ranks, "mib_per_rank": a.size, "iters": a.iters,
                                "passes_per_compute": raw["passes"], "pass_seconds": raw["pass_seconds"],
                                "medians": m, "summary": summary, "samples": raw}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
