"""Background work in the schedules applications run: how long ``checkpoint()`` keeps the
application waiting at each level of a multilevel schedule, with ``background = true``.

    python benchmarks/bench_cycle.py [--ranks 4] [--size 64] [--iters 36] [--frac 0.1]
                                     [--schedules "local:1,partner:3,xor:6,pfs:12;..."] [--quick] [--out FILE]

One mpiexec job, one virtual node per rank (``ranks_per_node = 1``), ``keep = 2``. For each
schedule, one Checkpointer with ``background = true`` and ``schedule`` set (``policy = "fixed"``:
``need_checkpoint(step)`` says the level of each step, the most resilient level due winning, as
a multilevel schedule produces them: local often, partner and xor less, pfs rarely); a schedule
written ``a,b,c`` instead cycles those levels in turn. Each iteration changes ``frac`` of the
protected array's 4 KiB pages at random (as applications change their state where the physics
goes), then ``checkpoint(step)`` (timed: the slowest rank), then ``wait()`` (not timed, as the
application's compute would hide it). Medians per level after the first cycle.
Target (issue: fast in the schedules users run): every level's call <= 1.5x the local level's.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, command, median, parser, result_line, run_mpi, say, scratch, world, write_json  # noqa: E402

SCHEDULES = "local:1,partner:3,xor:6,pfs:12;local,partner,xor;xor,local,partner;local,partner,xor,rs,pfs"
TARGET = 1.5


def parse_schedule(text):
    """{"schedule": {level: every}} for ``level:N,...``, or {"cycle": [level, ...]} for ``a,b,c``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if all(":" in p for p in parts):
        return {"schedule": {p.split(":")[0]: int(p.split(":")[1]) for p in parts}}
    return {"cycle": parts}


def worker(a):
    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = world()
    u = np.random.default_rng(comm.rank).random(a.size * MiB // 8)
    pages = u.nbytes // 4096
    rng = np.random.default_rng(1000 + comm.rank)
    res = {}
    for n, text in enumerate(a.schedules.split(";")):
        sched = parse_schedule(text)
        cfg = dict(name=f"cycle{n}", cache_dir=os.path.join(a.shm, "node{node}"), pfs_dir=os.path.join(a.disk, "pfs"),
                   ranks_per_node=1, group_size=min(4, comm.size), rs_parity=1 if comm.size < 4 else 2, keep=2,
                   background=True)
        if "schedule" in sched:
            cfg.update(policy="fixed", schedule=sched["schedule"])
        calls, order = {}, []
        with hpcckpt.Checkpointer(comm, **cfg) as ckpt:
            ckpt.protect("u", u)
            warm = a.iters // 6
            for step in range(1, a.iters + 1):
                if "cycle" in sched:
                    level = sched["cycle"][(step - 1) % len(sched["cycle"])]
                else:
                    level = ckpt.need_checkpoint(step)
                    if level is None:
                        continue
                u.view(np.uint8).reshape(pages, 4096)[rng.choice(pages, int(pages * a.frac), replace=False), :8] += 1
                comm.Barrier()
                t = time.perf_counter()
                ckpt.checkpoint(step, level=level)
                t = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                ckpt.wait()
                order.append(level)
                if step > warm:
                    calls.setdefault(level, []).append(t)
        res[text] = {"calls": calls, "order": order}
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 18 iterations", hidden=("shm", "disk"))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--size", type=int, default=64, help="MiB per rank")
    p.add_argument("--iters", type=int, default=36)
    p.add_argument("--frac", type=float, default=0.1, help="fraction of 4 KiB pages changed before each checkpoint")
    p.add_argument("--schedules", default=SCHEDULES, help="';'-separated: level:every_n_steps,... or a,b,c (a cycle)")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    if a.quick:
        a.size, a.iters = 16, 18
    say(f"cycle: {a.ranks} ranks x {a.size} MiB, background = true, {a.iters} steps per schedule, "
        f"{a.frac:.0%} of the pages changed before each checkpoint")
    with scratch("cycle") as (shm, disk):
        raw = result_line(run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(a.size), "--iters",
                                            str(a.iters), "--frac", str(a.frac), "--schedules", a.schedules,
                                            "--shm", shm, "--disk", disk]))
    medians, targets = {}, {}
    for text, r in raw.items():
        m = {lv: median(ts) for lv, ts in r["calls"].items()}
        local = m.get("local")
        medians[text] = m
        say(f"  {text}: " + ", ".join(f"{lv} {t * 1e3:.1f} ms" + (f" ({t / local:.2f}x local)" if local else "")
                                      for lv, t in m.items()))
        if local:
            worst = max(t / local for t in m.values())
            targets[text] = {"target": f"every level's call <= {TARGET}x local", "value": worst, "met": worst <= TARGET}
    path = write_json("cycle", {"command": command("bench_cycle.py", argv), "ranks": a.ranks, "mib_per_rank": a.size,
                                "iters": a.iters, "frac": a.frac, "medians": medians, "targets": targets,
                                "samples": raw}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
