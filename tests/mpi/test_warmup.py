"""``hpcckpt warmup`` fills the Numba cache with every kernel a job uses: afterwards a job that
checkpoints (local write, rs parity, pfs flush) and restarts (an rs rebuild, a pfs restore)
compiles nothing: no cache file is written or changed. (xor uses the same GF(2^8) kernel as rs.)"""
import json
import os
import subprocess
import sys

import pytest

from harness import run_mpi
from hpcckpt import warmup

pytestmark = pytest.mark.mpi


def cache_files(d):
    out = {}
    for root, _, names in os.walk(d):
        for n in names:
            p = os.path.join(root, n)
            out[p] = os.stat(p).st_mtime_ns
    return out


def hpcckpt_warmup(cache):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    return subprocess.run([sys.executable, "-m", "hpcckpt", "warmup"], capture_output=True, text=True,
                          env=env, timeout=300)


def test_warmup_compiles_once_then_jobs_only_load(tmp_path):
    cache = str(tmp_path / "numba")
    first = hpcckpt_warmup(cache)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("compiled and cached") == len(warmup.KERNELS), first.stdout
    second = hpcckpt_warmup(cache)
    assert second.returncode == 0 and second.stdout.count("loaded from the cache") == len(warmup.KERNELS), \
        second.stdout
    warm = cache_files(cache)
    assert warm
    for level in ("rs", "pfs"):      # every kernel a job calls: the local write, GF(2^8) encode + rebuild
        cfg = json.dumps({"ranks_per_node": 1, "group_size": 4, "rs_parity": 2})
        root = tmp_path / level
        # arrays of 4.8 MB: over the kernels' thresholds (codecs.xxh3.FUSED_MIN_BYTES, rs.KERNEL_MIN_BYTES)
        common = ("--cache", str(root / "node{node}"), "--steps", 10, "--every", 5, "--level", level,
                  "--config-json", cfg, "--n", 600000, "--report-numba")
        res = run_mpi(4, "app.py", *common, "--crash-at", 7, "--crash-rank", 3, env={"NUMBA_CACHE_DIR": cache})
        assert res.returncode != 0
        os.remove(os.path.join(root, "node3", "app", "step_0000000004", "rank_000003.dat"))   # a rebuild
        res = run_mpi(4, "app.py", *common, env={"NUMBA_CACHE_DIR": cache})
        assert res.returncode == 0, str(res)
        assert res.lines("RESTART") == ["4"], str(res)
        assert sorted(res.lines("NUMBA")) == [f"rank={r} loaded=True" for r in range(4)], str(res)
    assert cache_files(cache) == warm, "a job compiled a kernel that hpcckpt warmup did not"


def test_warmup_is_a_cli_command():
    res = subprocess.run([sys.executable, "-m", "hpcckpt", "--help"], capture_output=True, text=True, timeout=60)
    assert "warmup" in res.stdout
