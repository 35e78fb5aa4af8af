"""Numba start-up cost: a fresh process importing hpcckpt's kernels and calling each once, with
a cold cache (NUMBA_CACHE_DIR pointed at an empty temporary directory: every kernel compiles)
and a warm one (the same directory again: kernels load from the cache).

    python benchmarks/bench_numba.py [--reps 3] [--job-mib 16] [--quick] [--out FILE]

Each sample is a new ``python -c`` process timing, with 1 MiB blocks: ``import hpcckpt``,
``import hpcckpt.codecs`` (no Numba yet), the first xor_into (imports Numba), rs_encode (4+2)
and rs_decode (2 lost) calls (1 MiB: over rs.KERNEL_MIN_BYTES, so the kernels run), and the first Checkpointer-free checksum. The warm figures are what every
restarted job pays; the cold ones what the first job on a new machine (or a read-only,
uncached install) pays. Then what a job sees: the slowest rank's first and second rs
checkpoint (4 ranks, one node each, --job-mib MiB per rank; it runs the local copy-and-checksum
kernel and the GF(2^8) kernel) in a fresh job with a cold cache, and in a fresh job after
``hpcckpt warmup`` filled the cache (its own time recorded too). And what a ported
application with little state sees (issue 41): the slowest rank's first and second checkpoint
at the xor and local levels of a fresh 4-rank job after ``hpcckpt warmup``, with 1.4 MB per
rank in a state dict, as 8 arrays of 172 KiB and as one array (``--small-only``: only that).
``--thresholds``: only where the NumPy paths stop being as fast as the kernels, in this process
(copy-and-checksum into a mapped tmpfs file, 1 MiB chunks, 1-16 MiB arrays; plain XOR of 3 and 7
inputs, 256 KiB-64 MiB; medians of 9). --quick: warm only, one sample, after filling the project's cache
(NUMBA_CACHE_DIR) with the same calls, in this process when its Numba caches there (in the
suite that costs next to nothing: bench_codecs loaded the kernels already), else in a process
of its own; no job.
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command, env_for_jobs, median, parser, result_line, run_mpi, say, write_json  # noqa: E402

PROBE = r"""
import json, time
t = {}
t0 = time.perf_counter()
import numpy as np
t["import_numpy"] = time.perf_counter() - t0; t0 = time.perf_counter()
import hpcckpt
t["import_hpcckpt"] = time.perf_counter() - t0; t0 = time.perf_counter()
from hpcckpt import codecs as C
t["import_codecs_numba"] = time.perf_counter() - t0
n = 1 << 20
blocks = [np.full(n, i + 1, np.uint8) for i in range(4)]
out = np.zeros(n, np.uint8)
t0 = time.perf_counter(); C.xor_into(out, blocks); t["first_xor"] = time.perf_counter() - t0
data = np.stack(blocks)
t0 = time.perf_counter(); par = C.rs_encode(data, 2); t["first_rs_encode"] = time.perf_counter() - t0
surv = {b: (data[b] if b < 4 else par[b - 4]) for b in range(2, 6)}
t0 = time.perf_counter(); C.rs_decode(surv, 4, 2, n); t["first_rs_decode"] = time.perf_counter() - t0
t0 = time.perf_counter(); C.xor_into(out, blocks); C.rs_encode(data, 2); t["second_calls"] = time.perf_counter() - t0
print("RESULT " + json.dumps(t))
"""


FIRST_CHECKPOINT = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from common import world
comm = world()
from mpi4py import MPI
import hpcckpt
root = sys.argv[2]
t = {}
with hpcckpt.Checkpointer(comm, name="numba", cache_dir=os.path.join(root, "node{node}"), pfs_dir=os.path.join(root, "pfs"),
                          ranks_per_node=1, group_size=4, rs_parity=2, keep=1) as ckpt:
    u = np.full((int(sys.argv[3]) << 20) // 8, comm.rank + 1.0)
    ckpt.protect("u", u)
    for i in range(2):
        comm.Barrier(); t0 = time.perf_counter()
        ckpt.checkpoint(i, level="rs")
        mine = np.array([time.perf_counter() - t0])
        comm.Allreduce(mine.copy(), mine, op=MPI.MAX)
        t["first" if i == 0 else "second"] = float(mine[0])
if comm.rank == 0:
    print("RESULT " + json.dumps(t), flush=True)
"""


SMALL_STATE = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from common import world
comm = world()
from mpi4py import MPI
import hpcckpt
root, level, narrays = sys.argv[2], sys.argv[3], int(sys.argv[4])
t = {}
with hpcckpt.Checkpointer(comm, name="small", cache_dir=os.path.join(root, "node{node}"), pfs_dir=os.path.join(root, "pfs"),
                          ranks_per_node=1, group_size=4, keep=1) as ckpt:
    rng = np.random.default_rng(comm.rank)
    state = {f"a{i}": rng.random(176000 // narrays) for i in range(narrays)}     # 1.4 MB per rank
    ckpt.restart(state)
    for i in range(2):
        comm.Barrier(); t0 = time.perf_counter()
        ckpt.checkpoint(i, state, level=level)
        mine = np.array([time.perf_counter() - t0])
        comm.Allreduce(mine.copy(), mine, op=MPI.MAX)
        t["first" if i == 0 else "second"] = float(mine[0])
    t["numba_loaded"] = bool(comm.allreduce("numba" in sys.modules, op=MPI.LOR))
if comm.rank == 0:
    print("RESULT " + json.dumps(t), flush=True)
"""
SMALL_CASES = (("xor", 8), ("xor", 1), ("local", 8), ("local", 1))


def small_state_checkpoints(cache_dir, nprocs=4):
    """{"<level>, <n> arrays": slowest rank's first and second checkpoint} of fresh jobs with
    1.4 MB per rank (SMALL_STATE), Numba's cache ``cache_dir`` (warmed by the caller)."""
    env = env_for_jobs()
    env["NUMBA_CACHE_DIR"] = cache_dir
    out = {}
    for level, narrays in SMALL_CASES:
        root = tempfile.mkdtemp(prefix="hpcckpt-bench-numba-small-")
        try:
            out[f"{level}, {narrays} arrays"] = result_line(run_mpi(
                nprocs, ["-c", SMALL_STATE, os.path.dirname(os.path.abspath(__file__)), root, level, str(narrays)],
                timeout=900, env=env))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


def first_checkpoint(cache_dir, mib, nprocs=4):
    """Slowest rank's first and second rs checkpoint of a fresh ``nprocs``-rank job (seconds)."""
    env = env_for_jobs()
    env["NUMBA_CACHE_DIR"] = cache_dir
    root = tempfile.mkdtemp(prefix="hpcckpt-bench-numba-job-")
    try:
        out = run_mpi(nprocs, ["-c", FIRST_CHECKPOINT, os.path.dirname(os.path.abspath(__file__)), root, str(mib)],
                      timeout=900, env=env)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result_line(out)


def hpcckpt_warmup(cache_dir):
    """Seconds of ``hpcckpt warmup`` into ``cache_dir``."""
    env = env_for_jobs()
    env["NUMBA_CACHE_DIR"] = cache_dir
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hpcckpt", "warmup"], env=env, check=True, timeout=900,
                   capture_output=True, cwd=tempfile.gettempdir())
    return time.perf_counter() - t0


def probe(cache_dir):
    env = env_for_jobs()
    env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600,
                         check=True, cwd=tempfile.gettempdir()).stdout
    return json.loads(next(ln[7:] for ln in out.splitlines() if ln.startswith("RESULT ")))


def warm_here(cache_dir):
    """Fill ``cache_dir`` by running the probe in this process, if this process's Numba caches
    there (in the suite, after bench_codecs, it costs next to nothing); False if it does not."""
    os.environ.setdefault("NUMBA_CACHE_DIR", cache_dir)    # read when Numba is first imported
    import numba
    if os.path.abspath(numba.config.CACHE_DIR or os.curdir) != os.path.abspath(cache_dir):
        return False
    with contextlib.redirect_stdout(io.StringIO()):
        exec(PROBE, {})
    return True


def main(argv=None):
    p = parser(__doc__, "warm only, from the project's own cache (a cold compile takes 10-80 s here)", hidden=())
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--job-mib", type=int, default=16, help="MiB per rank of the first-checkpoint job")
    p.add_argument("--thresholds", action="store_true", help="only the NumPy-vs-kernel sizes, in this process")
    p.add_argument("--small-only", action="store_true", help="only the small-state jobs, after hpcckpt warmup "
                   "into the project's cache")
    a = p.parse_args(argv)
    if a.small_only:
        return small_only(a, argv)
    if a.thresholds:
        return thresholds(a, argv)
    samples = {"cold": [], "warm": []}
    if a.quick:
        say("numba start-up (quick): warm only, from NUMBA_CACHE_DIR")
        cache = env_for_jobs()["NUMBA_CACHE_DIR"]
        if not warm_here(cache):          # the same calls in a process of their own, not timed
            probe(cache)
        samples = {"warm": [probe(cache)]}
    for i in range(0 if a.quick else a.reps):
        say(f"numba start-up [{i + 1}/{a.reps}]: a cold cache, then the same cache warm")
        d = tempfile.mkdtemp(prefix="hpcckpt-bench-numba-")
        try:
            samples["cold"].append(probe(d))
            samples["warm"].append(probe(d))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    jobs = {"cold": [], "after_warmup": [], "warmup_s": []}
    for i in range(0 if a.quick else a.reps):
        say(f"first checkpoint of a 4-rank rs job [{i + 1}/{a.reps}]: a cold cache, then after hpcckpt warmup")
        d = tempfile.mkdtemp(prefix="hpcckpt-bench-numba-")
        try:
            jobs["cold"].append(first_checkpoint(d, a.job_mib))
            shutil.rmtree(d)
            jobs["warmup_s"].append(hpcckpt_warmup(d))
            jobs["after_warmup"].append(first_checkpoint(d, a.job_mib))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    job_medians = {k: ({kk: median([x[kk] for x in v]) for kk in v[0]} if v and isinstance(v[0], dict)
                       else median(v)) for k, v in jobs.items() if v}
    for k in ("cold", "after_warmup"):
        if k in job_medians:
            say(f"  job, {k}: first checkpoint {job_medians[k]['first']:.2f} s, second {job_medians[k]['second']:.2f} s")
    if "warmup_s" in job_medians:
        say(f"  hpcckpt warmup (cold cache): {job_medians['warmup_s']:.1f} s")
    med = {kind: {k: median([s[k] for s in v]) for k in v[0]} for kind, v in samples.items()}
    for kind in med:
        m = med[kind]
        m["kernels_first_calls"] = m["first_xor"] + m["first_rs_encode"] + m["first_rs_decode"]
        m["total"] = m["import_hpcckpt"] + m["import_codecs_numba"] + m["kernels_first_calls"]
        say(f"  {kind}: import hpcckpt {m['import_hpcckpt']:.2f} s, codecs+numba {m['import_codecs_numba']:.2f} s, "
            f"first xor/rs-encode/rs-decode {m['first_xor']:.2f}/{m['first_rs_encode']:.2f}/{m['first_rs_decode']:.2f} s, "
            f"total {m['total']:.2f} s")
    path = write_json("numba", {"command": command("bench_numba.py", argv),
                                "reps": a.reps, "medians": med, "samples": samples,
                                "job": {"ranks": 4, "level": "rs", "mib_per_rank": a.job_mib,
                                        "medians": job_medians, "samples": jobs}}, a.out)
    say(f"wrote {path}")
    return path


def _median_ms(fn, reps=9):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(median(times) * 1e3, 3)


def thresholds(a, argv):
    """--thresholds: ms per call of the kernel and of the NumPy path at each size (this process)."""
    import mmap
    import numpy as np
    from hpcckpt.codecs import rs, xxh3
    from common import SHM
    assert xxh3.fused_available()
    out = {"copy_and_hash": {}, "plain_xor": {}}
    for mib in (1, 2, 4, 8, 16):
        n = mib << 20
        path = os.path.join(SHM, f"hpcckpt-bench-numba-{os.getpid()}")
        with open(path, "wb") as f:
            f.truncate(n)
        fd = os.open(path, os.O_RDWR)
        try:
            m = mmap.mmap(fd, n)
            dst = np.frombuffer(m, np.uint8)
            src = np.random.default_rng(mib).integers(0, 256, n, dtype=np.uint8)
            row = {}
            for way, minimum in (("kernel", 1), ("two_pass", 1 << 62)):
                saved, xxh3.FUSED_MIN_BYTES = xxh3.FUSED_MIN_BYTES, minimum
                try:
                    row[way] = _median_ms(lambda: xxh3.copy_and_hash(src, dst, 1 << 20))
                finally:
                    xxh3.FUSED_MIN_BYTES = saved
            out["copy_and_hash"][f"{mib} MiB"] = row
            del dst
            m.close()
        finally:
            os.close(fd)
            os.remove(path)
        say(f"  copy_and_hash {mib} MiB into a mapped file: kernel {row['kernel']} ms, two passes {row['two_pass']} ms")
    for kib in (256, 1024, 4096, 16384, 65536):
        for k in (3, 7):
            ins = [np.random.default_rng(i).integers(0, 256, kib << 10, dtype=np.uint8) for i in range(k)]
            o = np.zeros(kib << 10, np.uint8)
            coeffs = np.ones((1, k), np.uint8)
            row = {}
            for way, limit in (("kernel", -1), ("numpy", 1 << 62)):
                saved, rs.XOR_NUMPY_MAX_BYTES = rs.XOR_NUMPY_MAX_BYTES, limit
                try:
                    row[way] = _median_ms(lambda: rs.gf_combine_into([o], coeffs, ins))
                finally:
                    rs.XOR_NUMPY_MAX_BYTES = saved
            out["plain_xor"][f"{kib} KiB x {k}"] = row
            say(f"  plain XOR of {k} x {kib} KiB: kernel {row['kernel']} ms, NumPy {row['numpy']} ms")
    path = write_json("numba_thresholds", {"command": command("bench_numba.py", argv), "ms_median_of_9": out}, a.out)
    say(f"wrote {path}")
    return path


def small_only(a, argv):
    """--small-only: hpcckpt warmup into the project's cache, then --reps rounds of the
    small-state jobs (medians per case)."""
    cache = env_for_jobs()["NUMBA_CACHE_DIR"]
    warm = hpcckpt_warmup(cache)
    rounds = []
    for i in range(a.reps):
        say(f"first checkpoints with 1.4 MB per rank [{i + 1}/{a.reps}], after hpcckpt warmup")
        rounds.append(small_state_checkpoints(cache))
    med = {case: {k: median([r[case][k] for r in rounds]) for k in ("first", "second")} for case in rounds[0]}
    for case, m in med.items():
        loaded = sorted({r[case]["numba_loaded"] for r in rounds})
        m["numba_loaded"] = loaded[0] if len(loaded) == 1 else "varied"
        say(f"  {case}: first {m['first']:.3f} s, second {m['second']:.3f} s, Numba loaded: {m['numba_loaded']}")
    path = write_json("numba_small", {"command": command("bench_numba.py", argv), "reps": a.reps,
                                      "warmup_s": warm, "ranks": 4, "bytes_per_rank": 1408000,
                                      "medians": med, "samples": rounds}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
