"""Run real MPI jobs from pytest: ``mpiexec -n N python script.py`` under a timeout, with the MPI
this Python uses (hpcckpt.mpi_launch: MPICH or Open MPI, its launcher's own environment).

On timeout every process of the job is killed (no test can hang; Open MPI's ranks sit outside
the launcher's process group) and the MPI's leftovers created during the run, that no live
process uses, are removed. Before that, the failure message gets what was still running (each
process's state, kernel wait channel and command line) and the Python stacks of the application's
processes (PYTHONFAULTHANDLER is set in every job but ULFM ones; they are sent SIGABRT, core dumps
off). A ULFM job keeps the signal handlers Open MPI installs: in the first CI run with
faulthandler's instead, a process of an online test's job segfaulted inside MPI_Comm_shrink
(whether by chance is not known).

A launcher that outlives every process of its application by LAUNCHER_LINGER seconds has hung
after the job (Open MPI 5's prterun does, rarely: openpmix/prrte#1839): it is killed and the job
launched again once, as a launcher that fails before the application starts is.
"""
import contextlib
import dataclasses
import glob
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time

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
    if not fault_tolerant:      # a hung rank's stacks on SIGABRT (_wait); ULFM jobs keep Open MPI's own handlers
        full_env.setdefault("PYTHONFAULTHANDLER", "1")
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(m.command(nprocs, argv, fault_tolerant=fault_tolerant), env=full_env, start_new_session=True,
                            preexec_fn=_no_core_dumps, **kw)


def _no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


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
    running: str = ""               # at a timeout: the job's processes still running (_running)
    launcher_hung: str = ""         # the launcher outlived the application (LAUNCHER_LINGER): what was seen

    def lines(self, prefix):
        """stdout lines starting with ``prefix``, prefix stripped."""
        return [ln[len(prefix):].strip() for ln in self.stdout.splitlines() if ln.startswith(prefix)]

    def __str__(self):
        return (f"rc={self.returncode} timed_out={self.timed_out}\n--- stdout\n{_ends(self.stdout)}\n"
                f"--- stderr\n{_ends(self.stderr)}")


def _ends(text, head=2000, tail=6000):
    """``text``, or its beginning and end when it is long."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"


# Open MPI's launcher failing before any rank starts (PMIx's help text "The PMIx server's listener
# thread failed to start. We cannot continue.", exit 213, nothing on stdout): seen once in many CI
# runs, a start-up failure of the launcher, not of the application; such a launch is tried again once.
LAUNCHER_FAILED = "We cannot\ncontinue."
LAUNCHER_LINGER = 20.0     # seconds a launcher may outlive every process of its application


def run_mpi(nprocs, script, *args, env=None, timeout=240, fault_tolerant=False):
    """Run ``script`` (a path, or a file name in tests/mpi/apps) on ``nprocs`` ranks; return a Result.
    A launch whose launcher failed before the application started (LAUNCHER_FAILED) is tried again once."""
    result = _run_mpi_once(nprocs, script, *args, env=env, timeout=timeout, fault_tolerant=fault_tolerant)
    if result.returncode and not result.stdout and LAUNCHER_FAILED in result.stderr:
        sys.stderr.write(f"harness: the launcher failed before the application started; launching again:\n"
                         f"{result.stderr}")
        result = _run_mpi_once(nprocs, script, *args, env=env, timeout=timeout, fault_tolerant=fault_tolerant)
    elif result.launcher_hung:
        sys.stderr.write(f"harness: {result.launcher_hung}; launching again. What it had printed:\n{result}\n")
        result = _run_mpi_once(nprocs, script, *args, env=env, timeout=timeout, fault_tolerant=fault_tolerant)
        assert not result.launcher_hung, f"{result.launcher_hung}, twice:\n{result}"
    return result


def _run_mpi_once(nprocs, script, *args, env=None, timeout=240, fault_tolerant=False):
    if not os.path.isabs(script):
        script = os.path.join(APPS, script)
    m = mpi()
    with m.cleanup():      # only our job's leftovers: removing one of a job starting meanwhile hangs its MPI_Init
        proc = popen_mpi(nprocs, [sys.executable, script, *args], env=env, fault_tolerant=fault_tolerant,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            result = _wait(proc, script, timeout)
        finally:
            if proc.poll() is None or mpi_launch.job_processes(proc.pid):
                mpi_launch.kill_job(proc)       # also ranks the launcher left behind
    assert not result.timed_out, (f"mpiexec timed out after {timeout} s (every process of the job killed):\n"
                                  f"{result}\n--- still running at the timeout\n{result.running}")
    return result


def _wait(proc, script, timeout):
    """The Result of the job ``proc`` runs (``script`` on each rank): its end, its timeout (what
    was running then, with the application's Python stacks in its stderr), or a launcher that
    outlived every process of the application by LAUNCHER_LINGER seconds (killed)."""
    t0 = time.monotonic()
    seen = gone = None          # when the application's processes were first seen, all gone
    while True:
        try:
            out, err = proc.communicate(timeout=1.0)
            return Result(proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        app = _application_processes(proc.pid, script)
        if app:
            seen, gone = seen or now, None
        elif seen is not None:
            gone = gone or now
            if now - gone > LAUNCHER_LINGER:
                hung = (f"the launcher (pid {proc.pid}) was still running {now - gone:.0f} s after every process of "
                        f"the application had ended: {_running(proc.pid)}")
                mpi_launch.kill_job(proc)
                out, err = proc.communicate()
                return Result(proc.returncode, out, err, launcher_hung=hung)
        if now - t0 > timeout:
            running = _running(proc.pid)
            for pid in app:             # PYTHONFAULTHANDLER: each prints its threads' stacks, then ends
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            mpi_launch.kill_job(proc)
            out, err = proc.communicate()
            return Result(proc.returncode, out, err, timed_out=True, running=running)


def _application_processes(launcher, script):
    """The live processes of the job started as ``launcher`` that run ``script`` (a Python whose
    first argument it is; not the launcher, whose command line names it too)."""
    found = []
    for pid in mpi_launch.job_processes(launcher):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and os.path.basename(argv[0]).startswith(b"python") and argv[1] == os.fsencode(script):
            found.append(pid)
    return found


def _running(launcher):
    """A line per live process of the job started as ``launcher``: pid, state, wait channel, command."""
    rows = []
    for pid in sorted(mpi_launch.job_processes(launcher)):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip() or "-"
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rows.append(f"{pid} {state} {wchan} {argv[:300]}")
    return "\n".join(rows) or "(no process of the job)"


def snapshot(path):
    """{path: (mode, size, mtime)} of everything under ``path`` (links not followed): taken
    before and after a job to show it touched nothing there."""
    out = {}
    for dirpath, dirnames, files in os.walk(path):
        for name in files + dirnames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def outputs(path):
    """{file name: bytes} of the .npy files an application wrote to ``path``."""
    return {os.path.basename(f): open(f, "rb").read() for f in sorted(glob.glob(os.path.join(path, "*.npy")))}


def npz_arrays(path):
    """{(file, array): bytes} of the .npz files an application (sim_app) wrote to ``path``."""
    import numpy as np
    out = {}
    for f in sorted(glob.glob(os.path.join(path, "*.npz"))):
        with np.load(f, allow_pickle=False) as z:
            out.update({(os.path.basename(f), k): z[k].tobytes() for k in z.files})
    return out


def restart_step(res):
    """The step an application's one "RESTART <step>" line names (None: nothing restored)."""
    (value,) = res.lines("RESTART")
    return None if value == "None" else int(value)
