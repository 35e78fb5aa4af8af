"""The README's main job, shrunk: `hpcckpt demo` crashes, restarts and matches bit for bit."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.mpi


def test_demo_restarts_bit_for_bit():
    res = subprocess.run([sys.executable, "-m", "hpcckpt", "demo", "--nx", "256", "--ny", "128", "--steps", "60",
                          "--every", "10", "--crash-at", "37", "--timeout", "60"],
                         capture_output=True, text=True, timeout=200, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "restarted from step 29" in res.stdout
    assert "BIT-FOR-BIT IDENTICAL" in res.stdout
    assert "median aggregate checkpoint bandwidth" in res.stdout


def test_demo_online_recovers_bit_for_bit_or_is_refused():
    """Open MPI (ULFM): one job, a spare replaces the killed rank, bitwise; other MPIs: exit 2."""
    from harness import mpi
    res = subprocess.run([sys.executable, "-m", "hpcckpt", "demo", "--online", "--nx", "256", "--ny", "128",
                          "--steps", "60", "--every", "10", "--crash-at", "37", "--timeout", "60"],
                         capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    if not mpi().supports_ulfm:
        assert res.returncode == 2, res.stdout + res.stderr
        assert "online recovery needs an MPI with ULFM" in res.stderr
        return
    assert res.returncode == 0, res.stdout + res.stderr
    assert "restarted from step 29 without leaving mpiexec" in res.stdout
    assert "BIT-FOR-BIT IDENTICAL" in res.stdout
    assert "recovery: online" in res.stdout and "vs relaunch + restart" in res.stdout
