"""Incremental redundancy: time and bytes of partner, xor and rs checkpoints when 10 % of the
blocks changed, with ``incremental`` off and on.

    python benchmarks/bench_incremental.py [--ranks 4] [--size 64] [--iters 6] [--frac 0.1] [--grow BYTES]
                                           [--quick] [--out FILE]

One mpiexec job, one virtual node per rank (``ranks_per_node = 1``), ``background = false``
(the time measured is what ``checkpoint()`` blocks), ``keep = 1``, ``incremental_block`` 1 MiB.
Each rank protects ``size`` MiB of random bytes. Per level, two Checkpointers (``incremental``
off and on) are open at once; each takes a first checkpoint (full: the base); then, before
every further checkpoint, the same ``frac`` of each rank's 1 MiB blocks is rewritten (a fixed
random set per rank: the part of the state that changes between checkpoints) and both
Checkpointers checkpoint, in alternating order (both see the same load on a shared machine):
2 warm-up checkpoints (until the files, and the spares that ``reuse_files`` overwrites, are
those of a steady state), ``iters`` measured ones, then one more: with the default
``incremental_full_every = 8`` the 9th after the base, full again ("first periodic": a new
base, written to new files, since the first base is pinned and no earlier base's files are
spares yet), then a second cycle of 8 incremental ones (measured too) and its full step
("periodic", the steady state: the first base's retired files are the spares it overwrites).
Measured (medians over the measured checkpoints): the time (slowest rank), the bytes the
redundancy level sent per rank and wrote into other ranks' held directories per rank (largest
rank); the periodic full step's time, and the mean over a cycle of 8 incremental + 1 full.
With different blocks changing at every step a cumulative delta grows with each step, up to
``incremental_max_changed`` (docs/LEVELS.md).
With ``--grow BYTES`` rank 0 also checkpoints a state dict holding a history that grows by BYTES
at every checkpoint (after ``u`` in the data file), so its data size changes every time.
Target (issue #18): with ``incremental`` and 10 % changed, partner and xor take at most 0.6x a
full checkpoint.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, command, median, parser, result_line, run_mpi, say, scratch, world, write_json  # noqa: E402

LEVELS = ("partner", "xor", "rs")
WARMUP = 2          # checkpoints after the base before measuring (new files, spares)
FULL_EVERY = 8      # incremental_full_every (the default)
TARGET = 0.6        # incremental partner/xor time <= TARGET x full


def worker(a):
    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = world()
    rng = np.random.default_rng(comm.rank)
    u = rng.integers(0, 256, a.size * MiB, dtype=np.uint8)
    nblocks = a.size
    hot = np.sort(rng.choice(nblocks, max(1, int(round(a.frac * nblocks))), replace=False))
    cfg = dict(cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"), ranks_per_node=1,
               group_size=min(4, comm.size), rs_parity=1 if comm.size < 4 else 2, keep=1,
               incremental_block=MiB)

    def mx(x):
        return comm.allreduce(x, op=MPI.MAX)

    def held_bytes(ckpt, step):
        d = ckpt.cache.held_dir(step)
        return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if not n.endswith(".json")) \
            if os.path.isdir(d) else 0

    res = {"levels": {}, "hot_blocks": int(hot.size), "blocks": nblocks}
    history = np.zeros(0, np.uint8)

    def state():                     # with --grow: a history, growing on rank 0 (empty elsewhere)
        return {"history": history} if a.grow else None
    step = 0
    for level in LEVELS:
        modes = ("full", "incremental")
        r = {mode: {"seconds": [], "sent": [], "written": [], "incremental": [], "phase": []} for mode in modes}
        # both modes open at once, their checkpoints interleaved: the same load for both
        ckpts = {mode: hpcckpt.Checkpointer(comm, name=f"inc_{level}_{mode}", incremental=(mode == "incremental"),
                                            level=level, **cfg) for mode in modes}
        try:
            for ckpt in ckpts.values():
                ckpt.protect("u", u)
                ckpt.checkpoint(step, state(), level)       # the base
            step += 1
            second = a.iters + 1 + FULL_EVERY            # the second cycle's full step
            for it in range(-WARMUP, second + 1):
                for b in hot:                      # the changing part of the state
                    u[b * MiB:(b + 1) * MiB] += np.uint8(it + 100)
                if comm.rank == 0:
                    history = np.concatenate([history, np.full(a.grow, it % 251, np.uint8)])
                for mode in (modes if it % 2 else modes[::-1]):
                    ckpt = ckpts[mode]
                    comm.Barrier()
                    t = time.perf_counter()
                    ckpt.checkpoint(step, state(), level)
                    r[mode]["seconds"].append(mx(time.perf_counter() - t))
                    # warm-up: until the files (spares) are those of a steady state; after the
                    # measured ones, the full step that incremental_full_every forces
                    r[mode]["phase"].append("warmup" if it < 0 else "first_periodic" if it == a.iters
                                            else "periodic" if it == second else "steady")
                    r[mode]["sent"].append(mx(ckpt._ctx.levels[level].sent))
                    r[mode]["written"].append(mx(held_bytes(ckpt, step)))
                    m = ckpt.cache.read_manifest(step)
                    r[mode]["incremental"].append(comm.allreduce(m.base is not None, op=MPI.LAND))
                step += 1
        finally:
            for ckpt in ckpts.values():
                ckpt.close()
        res["levels"][level] = r
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank", hidden=("shm", "disk"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=int, default=64, help="MiB per rank")
    p.add_argument("--iters", type=int, default=6, help="measured checkpoints (at most 6 with the default "
                   "incremental_full_every = 8 and 2 warm-up ones)")
    p.add_argument("--frac", type=float, default=0.1, help="fraction of the blocks changed between checkpoints")
    p.add_argument("--grow", type=int, default=0, help="rank 0's history grows by this many bytes per checkpoint")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size = 16
    say(f"incremental: {a.ranks} ranks x {a.size} MiB, {a.frac:.0%} of the 1 MiB blocks changed, "
        f"{a.iters} checkpoints per level, incremental off vs on"
        + (f", rank 0's history growing {a.grow} bytes per checkpoint" if a.grow else ""))
    with scratch("incremental") as (shm, disk):
        raw = result_line(run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(a.size),
                                            "--iters", str(a.iters), "--frac", str(a.frac), "--grow", str(a.grow),
                                            "--shm", shm, "--disk", disk]))
    m, summary = {}, {}
    for level, modes in raw["levels"].items():
        def steady(r, key):
            return [x for x, ph in zip(r[key], r["phase"]) if ph == "steady"]

        def periodic(r, key, phase="periodic"):
            return next(x for x, ph in zip(r[key], r["phase"]) if ph == phase)
        m[level] = {mode: {"seconds": median(steady(r, "seconds")), "sent_bytes": median(steady(r, "sent")),
                           "written_bytes": median(steady(r, "written")),
                           "incremental_steps": sum(steady(r, "incremental")), "steps": len(steady(r, "incremental")),
                           "periodic_seconds": periodic(r, "seconds"),
                           "first_periodic_seconds": periodic(r, "seconds", "first_periodic"),
                           "periodic_incremental": periodic(r, "incremental")}
                    for mode, r in modes.items()}
        inc_ = m[level]["incremental"]
        # over one cycle of incremental_full_every + 1 checkpoints: the incremental ones and one full
        inc_["cycle_seconds"] = (FULL_EVERY * inc_["seconds"] + inc_["periodic_seconds"]) / (FULL_EVERY + 1)
        full, inc = m[level]["full"], m[level]["incremental"]
        summary[level] = {"time_ratio": inc["seconds"] / full["seconds"],
                          "cycle_time_ratio": inc["cycle_seconds"] / full["seconds"],
                          "sent_ratio": inc["sent_bytes"] / max(1, full["sent_bytes"]),
                          "written_ratio": inc["written_bytes"] / max(1, full["written_bytes"])}
        say(f"  {level:8s} full {full['seconds'] * 1e3:7.1f} ms, sent {full['sent_bytes'] / MiB:6.1f} MiB, "
            f"written {full['written_bytes'] / MiB:6.1f} MiB | incremental {inc['seconds'] * 1e3:7.1f} ms "
            f"({summary[level]['time_ratio']:.2f}x), sent {inc['sent_bytes'] / MiB:6.1f} MiB, written "
            f"{inc['written_bytes'] / MiB:6.1f} MiB ({inc['incremental_steps']}/{inc['steps']} steps incremental); "
            f"the periodic full step {inc['periodic_seconds'] * 1e3:.0f} ms (the first one "
            f"{inc['first_periodic_seconds'] * 1e3:.0f} ms), over a cycle of {FULL_EVERY + 1}: "
            f"{summary[level]['cycle_time_ratio']:.2f}x")
    targets = {lv: {"target": f"incremental, {a.frac:.0%} changed: time <= {TARGET}x full",
                    "value": summary[lv]["time_ratio"], "met": summary[lv]["time_ratio"] <= TARGET}
               for lv in ("partner", "xor")}
    path = write_json("incremental", {"command": command("bench_incremental.py", argv), "ranks": a.ranks,
                                      "mib_per_rank": a.size, "iters": a.iters, "frac": a.frac, "grow": a.grow,
                                      "medians": m, "summary": summary, "targets": targets, "samples": raw}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
