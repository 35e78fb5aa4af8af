"""Where a synchronous ``pfs`` checkpoint's time goes: the phases of each step, per rank, with
``reuse_files`` false (a new file at every step, the same file work as FTI L4) and true.

    python benchmarks/bench_pfs_phases.py [--ranks 4] [--size 64] [--steps 8] [--quick] [--out FILE]
    (--quick: 16 MiB per rank, 3 steps)

One mpiexec job; one virtual node per rank (``ranks_per_node = 1``), cache on tmpfs, pfs_dir on
disk. First the disk's new-file and overwrite limits (common.measure_limits, "disk_fsync": each
way kept as ``disk_<way>``), then per mode 3 warm-up steps and ``steps`` timed
``checkpoint(step, "pfs")`` between barriers. A diagnostic, not a figure for the README table:
it times the library's internals by wrapping them (PHASES below; a wrapper costs about a
microsecond), and records for every timed step its total and, per rank, the time spent in each
phase, and for the last step of each mode every rank's timeline (the phases' start and end, ms
after the step began). Nested phases overlap: ``cache.write`` contains ``pipe.drain`` (the
wait, after the cache copy, for the pfs writer thread's last direct writes).
"""
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (MiB, command, measure_limits, median, parser, result_line, run_mpi, say, scratch, summarize,  # noqa: E402
                    world, write_json)

# (module path, object, attribute, phase name): what is timed
PHASES = (
    ("hpcckpt.levels.pfs_save", "PfsSave", "begin", "pfs.begin"),
    ("hpcckpt.levels.pfs_files", None, "create_node_file", "pfs.begin: create node file"),
    ("hpcckpt.levels.local", "LocalCache", "write", "cache.write"),
    ("hpcckpt.levels.pfs_save", "PendingStep", "drain", "pipe.drain"),
    ("hpcckpt.levels.local", "LocalCache", "commit", "commit (local)"),
    ("hpcckpt.levels.pfs_save", "PfsSave", "finish", "pfs.finish"),
    ("hpcckpt.levels.pfs_save", "PfsSave", "_write_node", "pfs.finish: node file durable"),
    ("hpcckpt.levels.pfs_files", None, "write_master", "pfs.finish: master file"),
    ("hpcckpt.levels.pfs_save", "PfsSave", "_commit", "pfs.finish: commit"),
    ("hpcckpt.levels.pfs", "PfsStore", "retire", "pfs.retire"),
)


def instrument(events, totals):
    """Wrap every PHASES function: each call appends (name, start) and ("/" + name, end) to
    ``events`` and its duration to ``totals[name]``."""
    import importlib

    for module, owner, attr, name in PHASES:
        target = importlib.import_module(module)
        target = getattr(target, owner) if owner else target
        fn = getattr(target, attr)

        def timed_fn(*args, __fn=fn, __name=name, **kw):
            t = time.perf_counter()
            events.append((__name, t))
            try:
                return __fn(*args, **kw)
            finally:
                end = time.perf_counter()
                totals[__name] += end - t
                events.append(("/" + __name, end))
        setattr(target, attr, timed_fn)


def worker(a):
    import shutil

    import numpy as np
    from mpi4py import MPI
    import hpcckpt

    comm = world()
    data = np.random.default_rng(comm.rank).integers(0, 2**63, a.size * MiB // 8, dtype=np.int64)
    res = {"limits": measure_limits(comm, data, None, a.disk, a.disk, 3, which=("disk_fsync",)), "modes": {}}
    events, totals = [], collections.defaultdict(float)
    instrument(events, totals)
    for reuse in (False, True):
        tag = "reuse_files" if reuse else "new_files"
        cache, pfs = os.path.join(a.shm, tag), os.path.join(a.disk, tag)
        steps, phases = [], collections.defaultdict(list)
        with hpcckpt.Checkpointer(comm, name="phases", cache_dir=os.path.join(cache, "node{node}"), pfs_dir=pfs,
                                  ranks_per_node=1, reuse_files=reuse) as ckpt:
            ckpt.protect("data", data)
            for step in range(3 + a.steps):
                events.clear()
                totals.clear()
                comm.Barrier()
                t0 = time.perf_counter()
                ckpt.checkpoint(step, "pfs")
                t = time.perf_counter() - t0
                comm.Barrier()
                if step >= 3:
                    steps.append(comm.allreduce(t, op=MPI.MAX))
                    for name, seconds in totals.items():
                        phases[name].append(seconds)
        timeline = [(name, round((t - t0) * 1e3, 2)) for name, t in events]
        everyone = comm.gather({"phases_s": dict(phases), "last_step_timeline_ms": timeline}, root=0)
        if comm.rank == 0:
            res["modes"][tag] = {"step_s": steps, "ranks": everyone}
            print(f"  {tag}: median step {median(steps) * 1e3:.0f} ms", flush=True)
        shutil.rmtree(os.path.join(cache, f"node{comm.rank}"), ignore_errors=True)
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(pfs, ignore_errors=True)
    if comm.rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def analyse(raw, ranks, size):
    out = {"limits_mib_s": summarize(raw["limits"], ranks * size)["mib_s"], "modes": {}}
    for tag, m in raw["modes"].items():
        names = sorted({n for r in m["ranks"] for n in r["phases_s"]})
        out["modes"][tag] = {
            "step_ms": median(m["step_s"]) * 1e3,
            "mib_s": ranks * size / median(m["step_s"]),
            # per phase: the median over the steps of each rank's time, then the slowest rank
            "phase_ms_slowest_rank": {n: max(median(r["phases_s"][n]) for r in m["ranks"] if r["phases_s"].get(n)) * 1e3
                                      for n in names},
        }
    return out


def main(argv=None):
    p = parser(__doc__, "16 MiB per rank, 3 timed steps")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=None, help="timed steps per mode (default 8; 3 with --quick)")
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    size = a.size or (16 if a.quick else 64)
    steps = a.steps or (3 if a.quick else 8)
    say(f"pfs phases: {a.ranks} ranks x {size} MiB, {steps} steps per mode (new files, then reuse_files)")
    with scratch("pfs-phases") as (shm, disk):
        out = run_mpi(a.ranks, [os.path.abspath(__file__), "--worker", "--size", str(size), "--steps", str(steps),
                                "--shm", shm, "--disk", disk])
    raw = result_line(out)
    summary = analyse(raw, a.ranks, size)
    for tag, m in summary["modes"].items():
        say(f"  {tag}: step {m['step_ms']:.0f} ms ({m['mib_s']:.0f} MiB/s); slowest rank per phase: "
            + ", ".join(f"{n} {ms:.1f}" for n, ms in m["phase_ms_slowest_rank"].items()))
    lim = summary["limits_mib_s"]
    say("  disk MiB/s: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(lim.items())))
    path = write_json("pfs_phases", {"command": command("bench_pfs_phases.py", argv), "ranks": a.ranks,
                                     "mib_per_rank": size, "steps": steps, "summary": summary, "raw": raw}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
