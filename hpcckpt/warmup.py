"""``hpcckpt warmup``: compile every Numba kernel of hpcckpt once, into the Numba cache (local).

The kernels compile on their first call and are cached on disk (``cache=True``). Without a warm
cache, the first checkpoint of a job compiles them — on every rank at once. Run this once per
installation, on a machine with the compute nodes' CPU (Numba's cache is keyed by the CPU it
compiled for: a login node of another CPU type leaves the compute nodes a cold cache). Afterwards
every rank only loads the kernels. Where the cache lives: ``NUMBA_CACHE_DIR`` when set (use the
same directory for the warm-up and the jobs), else ``__pycache__`` beside hpcckpt's modules when
writable, else Numba's per-user cache directory. See docs/CODECS.md "Start-up".
"""
import contextlib
import os
import time
import warnings

import numpy as np


def _copy_and_checksum():
    from .codecs import xxh3
    from .codecs.xxh3_kernel import compiled_kernel
    if not xxh3.fused_available():          # compiles or loads, then checks against xxhash
        raise RuntimeError("the kernel is unavailable or gives wrong digests here (see the warning above)")
    compiled_kernel()


def _gf256_combine():
    from .codecs import rs
    n = max(rs.PARALLEL_MIN_BYTES, rs.KERNEL_MIN_BYTES)     # long enough for the kernel, and its threads
    data = [np.full(n, i + 1, np.uint8) for i in range(4)]
    parity = rs.rs_encode(np.stack(data), 2)                         # aligned: whole words
    odd = [d[1:] for d in data]                                      # misaligned: byte loops
    rs.gf_combine_into([np.zeros(n - 1, np.uint8)], np.array([[1, 2, 3, 4]], np.uint8), odd)
    rs.rs_encode(np.stack(data), 2, threads=2)                       # the threaded variant
    rebuilt = rs.rs_decode({1: data[1], 2: data[2], 3: data[3], 4: parity[0]}, 4, 2, n)
    if not np.array_equal(rebuilt[0], data[0]):
        raise RuntimeError("rs_decode gave a wrong block")


def _xor():
    from .codecs import xor
    blocks = [np.full(4096, i + 1, np.uint8) for i in range(3)]
    out = np.empty(4096, np.uint8)
    xor.xor_into(out, blocks)
    xor.xor_accumulate(out, blocks[0])


def _simulate():
    from . import simulate
    level = simulate.LEVELS[0]
    simulate.simulate(3600.0, {level: 600.0}, {level: 5.0}, {"node": (86400.0, level)}, seed=1)


KERNELS = (("copy-and-checksum (local level)", _copy_and_checksum),
           ("GF(2^8) combine (xor and rs levels)", _gf256_combine),
           ("XOR (codecs)", _xor),
           ("failure simulator (hpcckpt interval)", _simulate))


def cache_dirs():
    """Local: the directories Numba may cache hpcckpt's kernels in, in Numba's order of choice."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return [os.environ["NUMBA_CACHE_DIR"]]
    here = os.path.dirname(os.path.abspath(__file__))
    from numba.misc.appdirs import user_cache_dir
    return [os.path.join(here, "__pycache__"), os.path.join(here, "codecs", "__pycache__"),
            user_cache_dir("numba")]


def _cache_files():
    found = {}
    for top in cache_dirs():
        for root, _, names in os.walk(top):
            for name in names:
                if name.endswith((".nbi", ".nbc")):
                    path = os.path.join(root, name)
                    with contextlib.suppress(OSError):
                        found[path] = os.stat(path).st_mtime_ns
    return found


def warm(out=print):
    """Local: load or compile every kernel; print a line each. Returns the number of kernels that
    failed or could not be cached."""
    import numba
    out(f"Numba {numba.__version__}; cache: {' or '.join(cache_dirs())}")
    failed = 0
    for name, fn in KERNELS:
        before = _cache_files()
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - one line per kernel, then go on
                out(f"  {name}: FAILED ({type(e).__name__}: {e})")
                failed += 1
                continue
        dt = time.perf_counter() - t0
        written = _cache_files().items() - before.items()
        how = "compiled and cached" if written else "loaded from the cache"
        not_cached = [str(w.message).splitlines()[0] for w in caught if "cach" in str(w.message).lower()]
        if not_cached:
            how = f"compiled, NOT cached ({not_cached[0]})"
            failed += 1
        out(f"  {name}: {how} in {dt:.2f} s")
    return failed


def cmd_warmup(args):
    failed = warm()
    if failed:
        print("hpcckpt warmup: some kernels are not cached; jobs will compile them on every rank "
              "(set NUMBA_CACHE_DIR to a writable directory shared by the jobs)")
        return 1
    return 0
