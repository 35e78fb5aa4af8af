"""The benchmark suite keeps working: ``python -m benchmarks --quick`` runs every benchmark
(real mpiexec jobs) and writes valid JSON with the expected keys, TABLE.md and suite.json.
Nothing is asserted about speed."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.mpi
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPECTED = {
    "levels": ("rows", "grid", "levels"),
    "recovery": ("levels", "ranks", "mib_per_rank"),
    "codecs": ("summary", "results"),
    "integrity": ("rows",),
    "async": ("summary", "medians"),
    "naive": ("rows",),
    "scaling": ("by_size", "by_ranks"),
    "numba": ("medians", "samples"),
    "incremental": ("summary", "medians", "targets"),
}


def test_quick_suite_writes_json(tmp_path):
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", os.path.join(ROOT, ".numba-cache"))
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, keys in EXPECTED.items():
        with open(tmp_path / f"{name}.json") as f:
            data = json.load(f)
        assert "machine" in data and "loadavg" in data["machine"], name
        for key in keys:
            assert key in data, (name, key)
    lv = json.loads((tmp_path / "levels.json").read_text())
    row = lv["rows"][0]
    assert set(row["levels"]) == {"local", "partner", "xor", "rs", "pfs"}
    for level in row["levels"].values():
        assert {"checkpoint", "restart"} <= set(level["mib_s"]) and level["checkpoint_fraction_of_limit"] > 0
    assert {"memcpy", "tmpfs_new", "tmpfs_overwrite", "disk_fsync", "disk_new_files", "mpi_ring"} <= set(row["limits"]["mib_s"])
    assert row["levels"]["pfs"]["new_files"]["checkpoint_fraction_of_disk_new_files"] > 0
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert all(r["status"] == "ok" for r in suite["runs"].values()), suite["runs"]
    assert "| target | measured | status |" in (tmp_path / "TABLE.md").read_text()
