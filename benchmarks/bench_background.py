"""Background redundancy: how long ``checkpoint()`` keeps the application waiting, per level,
with ``background`` off and on.

    python benchmarks/bench_background.py [--ranks 4] [--size 64] [--iters 8] [--quick] [--out FILE]

One mpiexec job, one virtual node per rank (``ranks_per_node = 1``). For each level (local,
partner, xor, rs, pfs) and each mode (blocking: ``background = false``; background: ``true``) an
application loop of ``iters`` iterations: compute (passes of ``u = u * a + b`` over the
protected float64 array, calibrated so one compute phase lasts about six blocking checkpoints
of the slowest of partner, rs and pfs: applications compute far longer between checkpoints than
a checkpoint takes, and the background work needs that time: it shares the cores with the
compute), then ``checkpoint(step, level)``; ``wait()`` after the loop. Measured (slowest rank,
medians over the iterations after a warm-up checkpoint and the first ``WARMUP_CALLS`` calls,
which write new files until the retired ones are there to be overwritten and may wait for the
warm-up's background work; every call is kept in the JSON's samples):
  - ``call``: the time ``checkpoint()`` kept the application waiting;
  - ``loop``: the whole loop, compute included (the background thread competes with compute for
    the cores: 4 ranks on 2 cores here);
  - ``background``: with ``background``, the time the background work took (``Policy``'s
    measured background cost).
Targets (issue: background redundancy): with ``background``, partner and xor keep the
application waiting at most 1.5x the local level (its call: the median over both modes' calls,
the same work in both).
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, command, median, parser, result_line, run_mpi, say, scratch, world, write_json  # noqa: E402

LEVELS = ("local", "partner", "xor", "rs", "pfs")
TARGET = 1.5        # background partner/xor call <= TARGET x local call
COMPUTE_FACTOR = 6  # one compute phase ~ this many blocking checkpoints of the slowest level
WARMUP_CALLS = 2    # the first calls of each loop, left out of the medians


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

    cfg = dict(cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"), ranks_per_node=1,
               group_size=min(4, comm.size), rs_parity=1 if comm.size < 4 else 2, keep=1)
    res = {"levels": {}}
    step = 0

    def loop(level, background, passes, iters, tag="run"):
        nonlocal step
        r = {"call": [], "compute": [], "background": None}
        with hpcckpt.Checkpointer(comm, name=f"bg_{tag}_{level}_{int(background)}", background=background, level=level, **cfg) as ckpt:
            ckpt.protect("u", u)
            ckpt.checkpoint(step, level)       # warm-up: files, kernels, communicators
            ckpt.wait()
            step += 1
            comm.Barrier()
            t_loop = time.perf_counter()
            for _ in range(iters):
                t = time.perf_counter()
                for _ in range(passes):
                    one_pass()
                r["compute"].append(mx(time.perf_counter() - t))
                t = time.perf_counter()
                ckpt.checkpoint(step, level)
                r["call"].append(mx(time.perf_counter() - t))
                step += 1
            ckpt.wait()
            r["loop"] = mx(time.perf_counter() - t_loop)
            if background and comm.rank == 0:
                r["background"] = ckpt.policy.background_cost(level)
        return r

    # calibrate: one compute phase ~ COMPUTE_FACTOR blocking checkpoints of the slowest level
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(5):
        one_pass()
    per_pass = mx(time.perf_counter() - t) / 5
    slowest = max(median(loop(lv, False, 1, 2, tag="calibrate")["call"]) for lv in ("partner", "rs", "pfs"))
    passes = max(1, math.ceil(COMPUTE_FACTOR * slowest / per_pass))
    res["passes"], res["pass_seconds"] = passes, per_pass
    for level in LEVELS:
        res["levels"][level] = {mode: loop(level, mode == "background", passes, a.iters)
                                for mode in ("blocking", "background")}
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 3 iterations", hidden=("shm", "disk"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=int, default=64, help="MiB per rank")
    p.add_argument("--iters", type=int, default=8)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size, a.iters = 16, 4
    say(f"background: {a.ranks} ranks x {a.size} MiB, {a.iters} iterations of compute + checkpoint per level, "
        "background off vs on")
    with scratch("background") as (shm, disk):
        raw = result_line(run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(a.size),
                                            "--iters", str(a.iters), "--shm", shm, "--disk", disk]))
    def steady(xs):       # without the warm-up calls (all of them when there are no others)
        return xs[WARMUP_CALLS:] or xs

    m = {}
    for level, modes in raw["levels"].items():
        m[level] = {mode: {"call": median(steady(r["call"])), "compute": median(steady(r["compute"])),
                           "loop": r["loop"],
                           "background": r["background"]} for mode, r in modes.items()}
    # the local level does the same work in both modes: its time is the median of both modes' calls
    local = median(steady(raw["levels"]["local"]["blocking"]["call"]) + steady(raw["levels"]["local"]["background"]["call"]))
    summary = {"local_call": local}
    for level in LEVELS:
        blocking, background = m[level]["blocking"], m[level]["background"]
        summary[level] = {"blocking_call_vs_local": blocking["call"] / local,
                          "background_call_vs_local": background["call"] / local,
                          "loop_speedup": blocking["loop"] / background["loop"]}
        say(f"  {level:8s} call: blocking {blocking['call'] * 1e3:7.1f} ms ({summary[level]['blocking_call_vs_local']:.2f}x local), "
            f"background {background['call'] * 1e3:7.1f} ms ({summary[level]['background_call_vs_local']:.2f}x local)"
            + (f", {background['background'] * 1e3:.0f} ms in the background" if background["background"] else "")
            + f"; loop {blocking['loop']:.2f} s -> {background['loop']:.2f} s")
    targets = {lv: {"target": f"background call <= {TARGET}x local",
                    "value": summary[lv]["background_call_vs_local"],
                    "met": summary[lv]["background_call_vs_local"] <= TARGET} for lv in ("partner", "xor")}
    path = write_json("background", {"command": command("bench_background.py", argv),
                                     "ranks": a.ranks, "mib_per_rank": a.size, "iters": a.iters,
                                     "passes_per_compute": raw["passes"], "pass_seconds": raw["pass_seconds"],
                                     "medians": m, "summary": summary, "targets": targets, "samples": raw}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
