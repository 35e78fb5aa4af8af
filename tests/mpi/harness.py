"""Run real MPI jobs from pytest: ``mpiexec -n N python script.py`` under a timeout.

On timeout the whole process group is killed (no test can hang) and MPICH's /dev/shm leftovers
created during the run, that no live process uses, are removed.
"""
import dataclasses
import os
import shutil
import signal
import subprocess
import sys

from hpcckpt import mpich_shm

HERE = os.path.dirname(os.path.abspath(__file__))
APPS = os.path.join(HERE, "apps")


def mpiexec_path():
    """The mpiexec beside this Python (the mpich wheel in the venv), else the one on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else shutil.which("mpiexec")


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    def lines(self, prefix):
        """stdout lines starting with ``prefix``, prefix stripped."""
        return [ln[len(prefix):].strip() for ln in self.stdout.splitlines() if ln.startswith(prefix)]

    def __str__(self):
        return f"rc={self.returncode} timed_out={self.timed_out}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"


def run_mpi(nprocs, script, *args, env=None, timeout=240):
    """Run ``script`` (a path, or a file name in tests/mpi/apps) on ``nprocs`` ranks; return a Result."""
    if not os.path.isabs(script):
        script = os.path.join(APPS, script)
    cmd = [mpiexec_path(), "-n", str(nprocs), sys.executable, script, *map(str, args)]
    full_env = dict(os.environ)
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    before = mpich_shm.snapshot()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
        result = Result(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        result = Result(proc.returncode, out, err, timed_out=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # only our job's segments: removing one of a job starting meanwhile hangs its MPI_Init
        mpich_shm.remove_leftovers(before)
    assert not result.timed_out, f"mpiexec timed out after {timeout} s (process group killed):\n{result}"
    return result
