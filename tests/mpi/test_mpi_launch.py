"""hpcckpt.mpi_launch against the real launcher of this Python (MPICH or Open MPI): the library
the ranks load is the flavour detected, a killed rank gives the exit status the flavour names,
and a job killed from outside leaves no process and none of the segments it mapped."""
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcckpt import mpi_launch
from harness import mpi, popen_mpi, readline, run_mpi

pytestmark = pytest.mark.mpi
TIMEOUT = 60
NAMES = {"mpich": "MPICH", "openmpi": "Open MPI", "intelmpi": "Intel(R) MPI"}

HELLO = """import os, sys, time
from mpi4py import MPI
c = MPI.COMM_WORLD
mine = (c.rank, c.size, os.getpid(), MPI.Get_library_version().splitlines()[0])
every = c.gather(mine)              # rank 0 prints every line: the ranks' own output can interleave
if c.rank == 0:
    print("".join("RANK %d %d %d %s\\n" % r for r in every), end="", flush=True)
c.Barrier()
if sys.argv[1] == "kill" and c.rank == 1:
    os.kill(os.getpid(), 9)
if sys.argv[1] == "sleep":
    time.sleep(120)
c.Barrier()
"""


@pytest.fixture
def hello(tmp_path):
    path = tmp_path / "hello.py"
    path.write_text(HELLO)
    return str(path)


def test_the_ranks_load_the_mpi_of_the_launcher(hello):
    m = mpi()
    res = run_mpi(4, hello, "ok", timeout=TIMEOUT)
    assert res.returncode == 0, str(res)
    ranks = [ln.split(None, 3) for ln in res.lines("RANK")]      # rank, size, pid, the library's first line
    assert sorted(int(r[0]) for r in ranks) == [0, 1, 2, 3] and all(r[1] == "4" for r in ranks), str(res)
    if m.name in NAMES:
        assert all(NAMES[m.name] in r[3] and m.version in r[3] for r in ranks), f"{m}: {ranks}"


def test_a_killed_rank_gives_the_flavours_exit_status(hello):
    m = mpi()
    res = run_mpi(4, hello, "kill", timeout=TIMEOUT)
    assert res.returncode == m.killed_status(signal.SIGKILL) and m.rank_killed(res.returncode), \
        f"{m}: expected {m.killed_status()}\n{res}"


def _mapped_segments(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {ln.split(None, 5)[5] for ln in f if len(ln.split(None, 5)) == 6
                    and ln.split(None, 5)[5].startswith("/dev/shm/")}
    except OSError:
        return set()


def test_a_job_killed_from_outside_leaves_no_process_and_no_segment(hello):
    m = mpi()
    with m.cleanup():
        proc = popen_mpi(4, [sys.executable, hello, "sleep"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
        try:
            lines = [readline(proc, TIMEOUT) for _ in range(4)]
            pids = [int(ln.split()[3]) for ln in lines if ln.startswith("RANK")]
            assert len(pids) == 4, lines
            segments = set().union(*(_mapped_segments(p) for p in pids))
            assert set(pids) <= mpi_launch.job_processes(proc.pid)
        finally:
            mpi_launch.kill_job(proc)
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
              for p in pids):
        assert time.monotonic() < deadline, f"ranks {pids} survived kill_job ({m})"
        time.sleep(0.1)
    left = {s.split(" (deleted)")[0] for s in segments} & {os.path.join("/dev/shm", n) for n in os.listdir("/dev/shm")}
    assert not left, f"{m}: the killed job's segments are still there: {sorted(left)}"
    if m.name == "openmpi":
        assert not os.path.exists(f"/tmp/ompi.{proc.pid}"), "the launcher's session directory is still there"
