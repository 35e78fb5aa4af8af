"""Running long: many checkpoints with retention (keep = 2), cycling through every level.

Each rank counts its open file descriptors (/proc/self/fd) and rank 0 its RSS and the bytes
under the caches and the pfs directory, every 10 checkpoints. After a warm-up (the first
checkpoint of each level opens its communicators and buffers) nothing may grow: the same fds,
RSS within a small margin, disk within what ``keep`` checkpoints and the newest step of each
redundancy level (plus one spare data file and one spare copy/parity file per rank) hold. Default: 100 checkpoints; ``RELIABILITY_FULL=1``: 1000 (a few minutes).
"""
import json
import os
import re
import shutil
import uuid

import pytest

from harness import run_mpi
from reliability import FULL, record

pytestmark = pytest.mark.mpi
CHECKPOINTS = 1000 if FULL else 100
LEVELS = "local,partner,xor,rs,pfs"


@pytest.mark.parametrize("count", [pytest.param(CHECKPOINTS, marks=[pytest.mark.slow] if FULL else [])])
def test_soak_no_growth(count, tmp_path):
    n = 4
    base = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path), f"hpcckpt-soak-{uuid.uuid4().hex[:8]}")
    try:
        cfg = {"ranks_per_node": 1, "group_size": 4, "rs_parity": 2, "keep": 2}
        res = run_mpi(n, "matrix_app.py", "--cache", os.path.join(base, "cache", "node{node}"),
                      "--pfs", os.path.join(base, "pfs"), "--levels", LEVELS, "--every", 1,
                      "--steps", count, "--n", 20000, "--no-restart", "--soak", 10,
                      "--config-json", json.dumps(cfg), timeout=60 + count * 1.5)
        assert res.returncode == 0 and "DONE" in res.stdout, str(res)
        rows = []
        for line in res.lines("SOAK"):
            i, *kv = line.split()
            rows.append(dict([("i", int(i))] + [(k, int(v)) for k, v in (x.split("=") for x in kv)]))
        assert len(rows) == count // 10
        warm = [r for r in rows if r["i"] >= 20] or rows
        per_ckpt = sum(20000 + r * 37 for r in range(n)) * 8          # u of every rank, bytes
        fds = {r["fds"] for r in warm}
        rss_growth = warm[-1]["rss"] - warm[0]["rss"]                   # kB
        max_cache = max(r["cache"] for r in rows)
        max_pfs = max(r["pfs"] for r in rows)
        figures = {"case": f"soak-{count}", "order": 0, "checkpoints": count, "ranks": n, "levels": LEVELS,
                   "bytes_per_checkpoint": per_ckpt, "fds": sorted(fds), "rss_first_kB": rows[0]["rss"],
                   "rss_warm_kB": warm[0]["rss"], "rss_last_kB": rows[-1]["rss"], "rss_growth_kB": rss_growth,
                   "cache_bytes_max": max_cache, "cache_bytes_last": rows[-1]["cache"],
                   "pfs_bytes_max": max_pfs, "pfs_bytes_last": rows[-1]["pfs"], "samples": rows}
        record("soak", figures)
        assert len(fds) == 1, f"open file descriptors changed: {sorted(fds)}"
        assert rss_growth < 8 * 1024, f"RSS grew by {rss_growth} kB"
        # keep = 2 steps, plus the newest partner, xor and rs step (retention keeps one per redundancy
        # level), each at most twice its data with its copies or parity (partner doubles, rs adds
        # m/(k-m) = 1) + one spare data file and one spare copy/parity per rank + manifests:
        # bounded by 12 checkpoints' worth, whatever the count
        assert max_cache < 12 * per_ckpt + (1 << 20), (max_cache, per_ckpt)
        assert max_pfs < 2 * per_ckpt * 1.2 + (1 << 20), (max_pfs, per_ckpt)
        steps = [d for d in os.listdir(os.path.join(base, "cache", "node0", "app")) if re.match(r"step_\d+$", d)]
        assert len(steps) <= 2 + 3, steps
    finally:
        shutil.rmtree(base, ignore_errors=True)
