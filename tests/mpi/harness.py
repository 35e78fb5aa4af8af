"""Run real MPI jobs from pytest: ``mpiexec -n N python script.py`` under a timeout, with the MPI
this Python uses (hpcckpt.mpi_launch: MPICH or Open MPI, its launcher's own environment).

On timeout every process of the job is killed (no test can hang; Open MPI's ranks sit outside
the launcher's process group) and the MPI's leftovers created during the run, that no live
process uses, are removed.
"""
import dataclasses
import glob
import os
import queue
import subprocess
import sys
import threading

from hpcckpt import mpi_launch

HERE = os.path.dirname(os.path.abspath(__file__))
APPS = os.path.join(HERE, "apps")


def mpi():
    """The MPI of this Python (hpcckpt.mpi_launch.MPI: command, env, exit statuses, cleanup)."""
    return mpi_launch.detect()


def mpiexec_path():
    """The launcher of the MPI this Python uses."""
    return mpi().mpiexec


def popen_mpi(nprocs, argv, env=None, fault_tolerant=False, **kw):
    """Start ``argv`` on ``nprocs`` ranks in a session of its own (stop it with
    mpi_launch.kill_job); ``env``: extra variables over os.environ; ``fault_tolerant``: a ULFM
    job (hpcckpt.online)."""
    m = mpi()
    full_env = m.env(nprocs=nprocs)
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(m.command(nprocs, argv, fault_tolerant=fault_tolerant), env=full_env, start_new_session=True, **kw)


def readline(proc, timeout):
    """The next line of ``proc``'s stdout (text mode), or "" at its end or after ``timeout`` s
    (a reader thread per process: a select() on the pipe misses lines already buffered)."""
    q = getattr(proc, "_lines", None)
    if q is None:
        q = proc._lines = queue.Queue()

        def pump():
            for line in proc.stdout:
                q.put(line)
            q.put("")
        threading.Thread(target=pump, daemon=True).start()
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        return ""


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


# Open MPI's launcher failing before any rank starts (PMIx's help text "The PMIx server's listener
# thread failed to start. We cannot continue.", exit 213, nothing on stdout): seen once in many CI
# runs, a start-up failure of the launcher, not of the application; such a launch is tried again once.
LAUNCHER_FAILED = "We cannot\ncontinue."


def run_mpi(nprocs, script, *args, env=None, timeout=240, fault_tolerant=False):
    """Run ``script`` (a path, or a file name in tests/mpi/apps) on ``nprocs`` ranks; return a Result.
    A launch whose launcher failed before the application started (LAUNCHER_FAILED) is tried again once."""
    result = _run_mpi_once(nprocs, script, *args, env=env, timeout=timeout, fault_tolerant=fault_tolerant)
    if result.returncode and not result.stdout and LAUNCHER_FAILED in result.stderr:
        sys.stderr.write(f"harness: the launcher failed before the application started; launching again:\n"
                         f"{result.stderr}")
        result = _run_mpi_once(nprocs, script, *args, env=env, timeout=timeout, fault_tolerant=fault_tolerant)
    return result


def _run_mpi_once(nprocs, script, *args, env=None, timeout=240, fault_tolerant=False):
    if not os.path.isabs(script):
        script = os.path.join(APPS, script)
    m = mpi()
    with m.cleanup():      # only our job's leftovers: removing one of a job starting meanwhile hangs its MPI_Init
        proc = popen_mpi(nprocs, [sys.executable, script, *args], env=env, fault_tolerant=fault_tolerant,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            result = Result(proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            mpi_launch.kill_job(proc)
            out, err = proc.communicate()
            result = Result(proc.returncode, out, err, timed_out=True)
        finally:
            if proc.poll() is None or mpi_launch.job_processes(proc.pid):
                mpi_launch.kill_job(proc)       # also ranks the launcher left behind
    assert not result.timed_out, f"mpiexec timed out after {timeout} s (every process of the job killed):\n{result}"
    return result


def outputs(path):
    """{file name: bytes} of the .npy files an application wrote to ``path``."""
    return {os.path.basename(f): open(f, "rb").read() for f in sorted(glob.glob(os.path.join(path, "*.npy")))}


def restart_step(res):
    """The step an application's one "RESTART <step>" line names (None: nothing restored)."""
    (value,) = res.lines("RESTART")
    return None if value == "None" else int(value)
