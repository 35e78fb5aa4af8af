"""hpcckpt.mpi_launch against the real launcher of this Python (MPICH or Open MPI): the library
the ranks load is the flavour detected, a killed rank gives the exit status the flavour names,
a job killed from outside leaves no process and none of the segments it mapped, and the test
harness says what a job that hung was doing and ends a launcher that outlives its application."""
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcckpt import mpi_launch
import harness
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


def test_a_job_past_its_timeout_fails_with_what_was_running_and_the_ranks_python_stacks(hello):
    """The harness's timeout: every process killed, and the failure names what was still running
    (the ranks' command lines) and shows where each rank's Python was (faulthandler's dump)."""
    with pytest.raises(AssertionError) as failed:
        run_mpi(2, hello, "sleep", timeout=15)
    text = str(failed.value)
    sleeping = HELLO.splitlines().index("    time.sleep(120)") + 1
    assert "timed out after 15 s" in text and "still running at the timeout" in text, text
    assert f"{sys.executable} {hello} sleep" in text, text
    assert f'File "{hello}", line {sleeping} in <module>' in text, text


def test_a_launcher_that_outlives_its_application_is_ended(tmp_path, monkeypatch):
    """A launcher still running LAUNCHER_LINGER s after every process of its application ended
    (Open MPI's prterun, rarely) is killed and reported as hung, with what the application printed."""
    monkeypatch.setattr(harness, "LAUNCHER_LINGER", 1.0)
    app = tmp_path / "app.py"
    app.write_text("import time\ntime.sleep(3)\nprint('APPLICATION-DONE')\n")     # seen running first
    launcher = subprocess.Popen(["sh", "-c", f'"{sys.executable}" "{app}"; exec sleep 300'], start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        res = harness._wait(launcher, str(app), timeout=120)
    finally:
        mpi_launch.kill_job(launcher)
    assert not res.timed_out and "APPLICATION-DONE" in res.stdout, str(res)
    assert f"the launcher (pid {launcher.pid}) was still running" in res.launcher_hung and "sleep 300" in \
        res.launcher_hung, res.launcher_hung
    assert launcher.returncode == -signal.SIGKILL
