"""Numba start-up cost: a fresh process importing hpcckpt's kernels and calling each once, with
a cold cache (NUMBA_CACHE_DIR pointed at an empty temporary directory: every kernel compiles)
and a warm one (the same directory again: kernels load from the cache).

    python benchmarks/bench_numba.py [--reps 3] [--quick] [--out FILE]

Each sample is a new ``python -c`` process timing, with 1 MiB blocks: ``import hpcckpt``,
``import hpcckpt.codecs`` (imports Numba), the first xor_into, rs_encode (4+2) and rs_decode
(2 lost) calls, and the first Checkpointer-free checksum. The warm figures are what every
restarted job pays; the cold ones what the first job on a new machine (or a read-only,
uncached install) pays. --quick: warm only, one sample, after filling the project's cache
(NUMBA_CACHE_DIR) with the same calls, in this process when its Numba caches there (in the
suite that costs next to nothing: bench_codecs loaded the kernels already), else in a process
of its own.
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command, env_for_jobs, median, parser, say, write_json  # noqa: E402

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
    a = p.parse_args(argv)
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
    med = {kind: {k: median([s[k] for s in v]) for k in v[0]} for kind, v in samples.items()}
    for kind in med:
        m = med[kind]
        m["kernels_first_calls"] = m["first_xor"] + m["first_rs_encode"] + m["first_rs_decode"]
        m["total"] = m["import_hpcckpt"] + m["import_codecs_numba"] + m["kernels_first_calls"]
        say(f"  {kind}: import hpcckpt {m['import_hpcckpt']:.2f} s, codecs+numba {m['import_codecs_numba']:.2f} s, "
            f"first xor/rs-encode/rs-decode {m['first_xor']:.2f}/{m['first_rs_encode']:.2f}/{m['first_rs_decode']:.2f} s, "
            f"total {m['total']:.2f} s")
    path = write_json("numba", {"command": command("bench_numba.py", argv),
                                "reps": a.reps, "medians": med, "samples": samples}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
