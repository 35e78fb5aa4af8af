"""FTI 1.6 and hpcckpt in one session, interleaved: the same-session ratios the README's FTI
figures come from (../shared/ANCHORS.md measured them this way on 2026-12-03).

    python benchmarks/bench_fti.py --fti-prefix DIR | --fti-src DIR
                                   [--grid 4x64] [--levels local,partner,rs,pfs]
                                   [--rounds 3] [--reps 3] [--gap SECONDS] [--quick] [--out FILE]
    (--quick: grid 4x16, 1 round, 2 repetitions)

Optional (not in the default suite: it needs FTI, which is not on PyPI): ``python -m benchmarks
fti`` with FTI_PREFIX or FTI_SRC set in the environment. ``--fti-prefix``: an FTI installation
(include/fti.h, lib/libfti.so) built against the MPI of this Python; ``--fti-src``: FTI's source
tree (``git clone https://github.com/leobago/fti && git -C fti checkout v1.6``), configured with
cmake (CC = this MPI's mpicc, no examples, no Fortran) and installed into DIR/build-hpcckpt/install
unless that exists already. benchmarks/fti/fti_driver.c is compiled with the same mpicc.

Per round, per (ranks, MiB per rank): first FTI, one mpiexec job (fti_driver: FTI_Init, one
protected buffer of incompressible bytes, then per level 1 warm-up and ``reps`` timed
``FTI_Checkpoint`` calls back to back, each timed between barriers, slowest rank); then the same
levels of hpcckpt by bench_levels.py (its own job: 3 warm-ups and ``reps`` timed checkpoints per
level, with ``reuse_files`` true and then false). FTI is configured as ANCHORS.md says: one node
per rank (Node_size 1, Local_test 1), Group_size 4, no head rank, every level inline, POSIX
files; L1 files on tmpfs, L4 and FTI's metadata on disk (the directories bench_levels uses).
Levels compared: FTI L1 - local, L2 - partner, L3 (Reed-Solomon, 4 data + 4 parity) - rs (and
xor when asked: FTI has no XOR level), L4 - pfs. Figures: the median over every round's timed
samples; aggregate MiB/s = ranks x MiB per rank / seconds; ``x_fti`` = hpcckpt / FTI with
``reuse_files`` true, ``x_fti_new_files`` with new files at every checkpoint (FTI's file work).
``disk_new_files_mib_s``: the limit bench_levels measures in each of its jobs for that file work
done by hand (common.disk_new_files: new files written with direct I/O, the previous one removed,
back to back); for pfs, ``disk_new_files_x_fti`` = that limit / FTI L4 (the most any writer of
new files reaches against FTI here) and ``new_files_of_disk_new_files`` = pfs with new files / it.
``--gap SECONDS`` (default 0: back to back): both libraries idle that long after every checkpoint
(warm-ups included), and so does the disk_new_files limit after each of its steps, as an
application computes between checkpoints: file removals (FTI's of its previous checkpoint, the
levels' of retired steps) are device work on a file system mounted with ``discard``, and then run
in the gap instead of in the next checkpoint. Its JSON is results/fti_gap.json (report.py reads
it beside fti.json).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_levels  # noqa: E402
from common import (DISK, SHM, command, median, mpi, parse_grid, parser, result_line, run_mpi,  # noqa: E402
                    say, write_json)

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER_SOURCE = os.path.join(HERE, "fti", "fti_driver.c")
FTI_LEVEL = {"local": 1, "partner": 2, "xor": 3, "rs": 3, "pfs": 4}
LEVELS = ("local", "partner", "rs", "pfs")


def fti_config(path, local_dir, global_dir, meta_dir):
    """Write FTI's configuration file (every key FTI 1.6 reads; intervals 0: checkpoints only
    when the driver asks)."""
    sections = {
        "Basic": {"Head": 0, "Node_size": 1, "Ckpt_dir": local_dir, "Glbl_dir": global_dir, "Meta_dir": meta_dir,
                  "Ckpt_L1": 0, "Ckpt_L2": 0, "Ckpt_L3": 0, "Ckpt_L4": 0, "Dcp_L4": 0,
                  "Inline_L2": 1, "Inline_L3": 1, "Inline_L4": 1, "keep_last_ckpt": 0, "keep_l4_ckpt": 0,
                  "Group_size": 4, "max_sync_intv": 0, "ckpt_io": 1, "Enable_Staging": 0, "Enable_dCP": 0,
                  "dCP_Mode": 0, "dCP_Block_Size": 16384, "Verbosity": 3},
        "Restart": {"Failure": 0, "Exec_ID": "XXXX-XX-XX_XX-XX-XX"},
        "Injection": {"rank": 0, "number": 0, "position": 0, "frequency": 0},
        "Advanced": {"Block_size": 1024, "Transfer_size": 16, "general_tag": 2612, "ckpt_tag": 711,
                     "stage_tag": 406, "final_tag": 3107, "Local_test": 1, "lustre_striping_unit": 4194304,
                     "lustre_striping_factor": -1, "lustre_striping_offset": -1},
    }
    with open(path, "w") as f:
        for name, keys in sections.items():
            f.write(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) + "\n")


def mpicc():
    """The mpicc beside this Python's mpiexec (FTI and the driver must use this MPI)."""
    path = os.path.join(os.path.dirname(mpi().mpiexec), "mpicc")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"bench_fti: no mpicc beside {mpi().mpiexec}")
    return path


def build_fti(src):
    """FTI configured, built and installed from the source tree ``src`` (once); its prefix."""
    build = os.path.join(os.path.abspath(src), "build-hpcckpt")
    prefix = os.path.join(build, "install")
    if os.path.isfile(os.path.join(prefix, "include", "fti.h")):
        return prefix
    if shutil.which("cmake") is None:
        raise SystemExit("bench_fti: building FTI needs cmake (apt-get install cmake)")
    os.makedirs(build, exist_ok=True)
    env = dict(os.environ, CC=mpicc())
    steps = [["cmake", "-S", src, "-B", build, f"-DCMAKE_INSTALL_PREFIX={prefix}", "-DCMAKE_BUILD_TYPE=Release",
              "-DENABLE_EXAMPLES=OFF", "-DENABLE_FORTRAN=OFF", f"-DMPI_C_COMPILER={env['CC']}"],
             ["cmake", "--build", build, "-j", str(os.cpu_count() or 2)],
             ["cmake", "--install", build]]
    for cmd in steps:
        say("  " + " ".join(cmd))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"bench_fti: {' '.join(cmd)} failed:\n{(res.stdout + res.stderr)[-3000:]}")
    return prefix


def compile_driver(prefix, outdir):
    """benchmarks/fti/fti_driver.c compiled against the FTI at ``prefix``; the program's path."""
    if not os.path.isfile(os.path.join(prefix, "include", "fti.h")):
        raise SystemExit(f"bench_fti: {prefix} has no include/fti.h (an FTI installation prefix)")
    lib = os.path.join(prefix, "lib")
    exe = os.path.join(outdir, "fti_driver")
    cmd = [mpicc(), "-O2", "-I", os.path.join(prefix, "include"), DRIVER_SOURCE, "-o", exe,
           "-L", lib, "-lfti", f"-Wl,-rpath,{lib}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"bench_fti: compiling the driver failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return exe


def run_fti(driver, ranks, mib, reps, levels, gap):
    """One FTI job; {FTI level: [seconds of each timed checkpoint]} (its warm-up dropped)."""
    shm = tempfile.mkdtemp(prefix="hpcckpt-bench-fti-", dir=SHM)
    disk = tempfile.mkdtemp(prefix="hpcckpt-bench-fti-", dir=DISK)
    try:
        dirs = [os.path.join(shm, "local"), os.path.join(disk, "global"), os.path.join(disk, "meta")]
        for d in dirs:
            os.makedirs(d)
        config = os.path.join(disk, "config.fti")     # FTI writes into it (the execution id)
        fti_config(config, *dirs)
        out = run_mpi(ranks, [driver, config, str(mib), str(reps + 1), str(gap), *map(str, levels)],
                      timeout=1800, executable=None)
        return {int(k): v[1:] for k, v in result_line(out).items()}
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)


def run_hpcckpt(ranks, mib, reps, levels, gap):
    """bench_levels.py for one cell: ({level: (samples reuse_files true, samples new files)},
    samples of its disk_new_files limit)."""
    with tempfile.TemporaryDirectory(prefix="hpcckpt-bench-fti-") as tmp:
        path = bench_levels.main(["--grid", f"{ranks}x{mib}", "--levels", ",".join(levels), "--reps", str(reps),
                                  "--gap", str(gap), "--out", os.path.join(tmp, "levels.json")])
        with open(path) as f:
            row = json.load(f)["rows"][0]
    return ({lv: (row["levels"][lv]["samples"]["checkpoint"], row["levels"][lv]["new_files"]["samples"]["checkpoint"])
             for lv in levels}, row["limits"]["samples"].get("disk_new_files", []))


def main(argv=None):
    p = parser(__doc__, "grid 4x16, 1 round, 2 repetitions", hidden=())
    p.add_argument("--fti-prefix", default=os.environ.get("FTI_PREFIX"), help="an FTI installation (default $FTI_PREFIX)")
    p.add_argument("--fti-src", default=os.environ.get("FTI_SRC"), help="FTI's source tree, built once (default $FTI_SRC)")
    p.add_argument("--grid", default=None, help="RANKSxMIB,... (default 4x64; --quick 4x16); ranks a multiple of 4")
    p.add_argument("--levels", default=",".join(LEVELS), help="hpcckpt levels: local, partner, xor, rs, pfs")
    p.add_argument("--rounds", type=int, default=None, help="FTI, then hpcckpt, this many times (default 3)")
    p.add_argument("--reps", type=int, default=None, help="timed checkpoints per level and round (default 3)")
    p.add_argument("--gap", type=float, default=0.0,
                   help="seconds both idle after each checkpoint, as an application computes (default 0)")
    a = p.parse_args(argv)
    if a.gap < 0:
        p.error("--gap must be at least 0")
    levels = [lv.strip() for lv in a.levels.split(",") if lv.strip()]
    unknown = [lv for lv in levels if lv not in FTI_LEVEL]
    if unknown or not levels:
        p.error(f"unknown level(s) {unknown}; choose from {', '.join(FTI_LEVEL)}")
    cells = parse_grid(a.grid or ("4x16" if a.quick else "4x64"))
    if any(r % 4 for r, _ in cells):
        p.error("FTI needs the rank count to be a multiple of its group size (4)")
    rounds = a.rounds or (1 if a.quick else 3)
    reps = a.reps or (2 if a.quick else 3)
    if not (a.fti_prefix or a.fti_src):
        raise SystemExit("bench_fti: give --fti-prefix or --fti-src (or set FTI_PREFIX / FTI_SRC); see its docstring")
    prefix = os.path.abspath(a.fti_prefix) if a.fti_prefix else build_fti(a.fti_src)
    fti_levels = sorted({FTI_LEVEL[lv] for lv in levels})
    samples = {cell: {"fti": {lv: [] for lv in fti_levels}, "reuse": {lv: [] for lv in levels},
                      "new": {lv: [] for lv in levels}, "disk_new_files": []} for cell in cells}
    with tempfile.TemporaryDirectory(prefix="hpcckpt-bench-fti-") as build:
        driver = compile_driver(prefix, build)
        for rnd in range(1, rounds + 1):
            for ranks, mib in cells:
                say(f"round {rnd}/{rounds}, {ranks} x {mib} MiB: FTI levels {fti_levels}")
                for lv, secs in run_fti(driver, ranks, mib, reps, fti_levels, a.gap).items():
                    samples[(ranks, mib)]["fti"][lv] += secs
                say(f"round {rnd}/{rounds}, {ranks} x {mib} MiB: hpcckpt {', '.join(levels)}")
                ours, floor = run_hpcckpt(ranks, mib, reps, levels, a.gap)
                for lv, (reuse, new) in ours.items():
                    samples[(ranks, mib)]["reuse"][lv] += reuse
                    samples[(ranks, mib)]["new"][lv] += new
                samples[(ranks, mib)]["disk_new_files"] += floor
    rows = []
    for (ranks, mib), s in samples.items():
        total = ranks * mib
        row = {"ranks": ranks, "mib_per_rank": mib, "fti_mib_s": {}, "levels": {}}
        for lv in fti_levels:
            row["fti_mib_s"][f"L{lv}"] = total / median(s["fti"][lv])
        for lv in levels:
            fti = row["fti_mib_s"][f"L{FTI_LEVEL[lv]}"]
            reuse, new = total / median(s["reuse"][lv]), total / median(s["new"][lv])
            row["levels"][lv] = {"fti_level": f"L{FTI_LEVEL[lv]}", "mib_s": reuse, "new_files_mib_s": new,
                                 "x_fti": reuse / fti, "x_fti_new_files": new / fti}
            say(f"  {ranks} x {mib} MiB {lv:8s} {reuse:7.0f} MiB/s, new files {new:6.0f}; FTI L{FTI_LEVEL[lv]} "
                f"{fti:5.0f}: {reuse / fti:.1f}x, new files {new / fti:.2f}x")
        if s["disk_new_files"]:
            floor = row["disk_new_files_mib_s"] = total / median(s["disk_new_files"])
            if "pfs" in row["levels"]:
                pfs = row["levels"]["pfs"]
                pfs["disk_new_files_x_fti"] = floor / row["fti_mib_s"]["L4"]
                pfs["new_files_of_disk_new_files"] = pfs["new_files_mib_s"] / floor
                say(f"  {ranks} x {mib} MiB the disk alone, new files (disk_new_files) {floor:.0f} MiB/s: "
                    f"{pfs['disk_new_files_x_fti']:.2f}x FTI L4; pfs with new files {pfs['new_files_of_disk_new_files']:.0%} of it")
        row["samples_s"] = {"fti": {f"L{k}": v for k, v in s["fti"].items()}, "hpcckpt": s["reuse"],
                            "hpcckpt_new_files": s["new"], "disk_new_files": s["disk_new_files"]}
        rows.append(row)
    path = write_json("fti_gap" if a.gap > 0 else "fti", {"command": command("bench_fti.py", argv), "rounds": rounds, "reps": reps, "gap_s": a.gap,
                              "fti_prefix": prefix, "rows": rows}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
