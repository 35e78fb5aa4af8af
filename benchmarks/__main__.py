"""Run the benchmark suite: ``python -m benchmarks [names...] [--quick] [--out DIR]``.

Each name is one question, one script (benchmarks/bench_<script>.py), one JSON file in DIR
(default benchmarks/results). Afterwards benchmarks/report.py writes DIR/TABLE.md and the PNG
plots; ``--readme`` also inserts TABLE.md into README.md between the bench-table markers.
A script that fails is reported and the suite goes on; the exit status is 1 if any failed.
"""
import argparse
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import RESULTS, machine, say  # noqa: E402

# name -> (module, what it answers); in the order they run (scaling reads levels' JSON)
SUITE = {
    "levels": ("bench_levels", "checkpoint/restart per level vs memcpy, tmpfs, disk fsync and MPI limits"),
    "recovery": ("bench_recovery", "recovery (init + restart) after a crash and the loss of a node, per level"),
    "codecs": ("bench_codecs", "XOR and RS kernels vs NumPy, zfec and ISA-L"),
    "integrity": ("bench_local", "L1 in detail: checksums' share of the checkpoint time"),
    "async": ("bench_async", "async flush: how much of the pfs flush the application gets back"),
    "background": ("bench_background", "background redundancy: how long checkpoint() blocks per level, off vs on"),
    "incremental": ("bench_incremental", "incremental redundancy: partner/xor/rs time and bytes with 10% of blocks changed, off vs on"),
    "naive": ("bench_naive", "np.save / h5py straight to the PFS directory vs hpcckpt"),
    "scaling": ("bench_scaling", "how checkpoint cost grows with ranks and size (from levels.json)"),
    "numba": ("bench_numba", "Numba start-up with a cold and a warm cache"),
}
OPTIONAL = {"pfs": ("bench_pfs", "pfs level internals: node files and restore"),
            "growing": ("bench_growing", "a state that changes size at every checkpoint vs a fixed-size one, per level"),
            "pfs_phases": ("bench_pfs_phases", "where a synchronous pfs step's time goes, phase by phase, new files and reuse_files"),
            "overhead": ("bench_overhead", "end-to-end: a heat-equation loop at the Daly interval, with vs without checkpoints"),
            "online": ("bench_online", "online recovery (ULFM, spares) vs relaunch + restart, same job and level, 4 and 8 ranks"),
            "cycle": ("bench_cycle", "background work in multilevel schedules: checkpoint() per level vs local"),
            "calls": ("bench_calls", "per-call cost and bytes per rank at 2-16 ranks; start-up placement at simulated P"),
            "fti": ("bench_fti", "FTI 1.6 and hpcckpt interleaved in one session (needs FTI_PREFIX or FTI_SRC)")}


def cpu_seconds():
    """User + system CPU seconds of this process and of its finished children (mpiexec jobs
    with their ranks, probes): unlike wall time, hardly changed by other load on the machine."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main(argv=None):
    names = {**SUITE, **OPTIONAL}
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="benchmarks: " + "; ".join(f"{k}: {v[1]}" for k, v in names.items()))
    p.add_argument("names", nargs="*", help=f"default: {' '.join(SUITE)}")
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (about 1 minute on 2 idle cores)")
    p.add_argument("--out", default=RESULTS, help="directory for the JSON, TABLE.md and plots (default %(default)s)")
    p.add_argument("--readme", action="store_true", help="insert the generated table into README.md")
    p.add_argument("--no-report", action="store_true", help="skip TABLE.md and the plots")
    a = p.parse_args(argv)
    unknown = [n for n in a.names if n not in names]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    chosen = a.names or list(SUITE)
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(HERE), ".numba-cache"))
    suite = {"command": " ".join(["python -m benchmarks"] + (argv if argv is not None else sys.argv[1:])),
             "quick": a.quick, "machine_start": machine(), "runs": {}}
    t_all = time.perf_counter()
    failed = []
    for i, name in enumerate(chosen, 1):
        module, what = names[name]
        say(f"== [{i}/{len(chosen)}] {name}: {what}")
        load0 = os.getloadavg()
        t, cpu0 = time.perf_counter(), cpu_seconds()
        run = {"script": f"benchmarks/{module}.py", "loadavg_start": list(load0)}
        try:
            args = ["--out", os.path.join(a.out, f"{name}.json")] + (["--quick"] if a.quick else [])
            if name == "scaling":
                args += ["--levels", os.path.join(a.out, "levels.json")]
            importlib.import_module(module).main(args)
            run["status"] = "ok"
            run["json"] = f"{name}.json"
        except (Exception, SystemExit) as e:   # noqa: BLE001 (report and go on)
            run["status"] = f"failed: {type(e).__name__}: {str(e)[-2000:]}"
            failed.append(name)
            say(f"   {name} FAILED: {str(e)[-500:]}")
        run["seconds"] = time.perf_counter() - t
        run["cpu_seconds"] = cpu_seconds() - cpu0
        run["loadavg_end"] = list(os.getloadavg())
        suite["runs"][name] = run
        say(f"   {name}: {run['status']} in {run['seconds']:.0f} s, {run['cpu_seconds']:.0f} CPU s "
            f"(load average {load0[0]:.1f} -> {run['loadavg_end'][0]:.1f})")
    suite["seconds"] = time.perf_counter() - t_all
    suite["cpu_seconds"] = sum(r["cpu_seconds"] for r in suite["runs"].values())
    suite["machine_end"] = machine()
    with open(os.path.join(a.out, "suite.json"), "w") as f:
        json.dump(suite, f, indent=1)
    say(f"suite: {len(chosen) - len(failed)}/{len(chosen)} ok in {suite['seconds']:.0f} s ({suite['cpu_seconds']:.0f} CPU s); "
        f"wrote {os.path.join(a.out, 'suite.json')}")
    if not a.no_report:
        import report
        t = time.perf_counter()
        report.main([a.out] + (["--readme"] if a.readme else []))
        say(f"report: {time.perf_counter() - t:.0f} s; everything: {time.perf_counter() - t_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
