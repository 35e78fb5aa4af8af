"""A virtual cluster (jobs/vcluster) for pytest: nodes as Linux namespaces, MPI jobs across them.

Every command runs under a timeout in its own session; on timeout its process group is killed
and so is every process left in the nodes (`jobs/vcluster killprocs`). Without root or without
namespaces the tests skip with the reason, except when CI=true: then they fail.
"""
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from hpcckpt import mpi_launch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
VCLUSTER = os.path.join(REPO, "jobs", "vcluster")
APPS = os.path.join(HERE, "apps")
LOCAL = "/vcluster/local"          # the node-local directory: a tmpfs per node, same path everywhere


def unavailable(reason):
    """Skip, or fail in CI (CI=true) where these tests must run."""
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"vcluster tests must run in CI, but: {reason}")
    pytest.skip(reason)


def problem():
    """Why no virtual cluster can be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "virtual clusters need Linux namespaces"
    if os.geteuid() != 0:
        return "virtual clusters need root (namespaces, mounts, veth pairs): run as root, e.g. in CI"
    missing = [c for c in ("unshare", "nsenter", "ip", "mount", "setsid", "flock") if shutil.which(c) is None]
    if missing:
        return f"commands not found: {', '.join(missing)} (Debian: util-linux, iproute2)"
    if mpiexec_path() is None:
        return "no mpiexec beside this Python nor on PATH"
    return None


def mpiexec_path():
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else shutil.which("mpiexec")


@dataclasses.dataclass
class Result:
    cmd: list
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0

    def lines(self, prefix):
        """stdout lines starting with ``prefix``, prefix stripped."""
        return [ln[len(prefix):].strip() for ln in self.stdout.splitlines() if ln.startswith(prefix)]

    def __str__(self):
        return (f"{' '.join(map(str, self.cmd))}\nrc={self.returncode} timed_out={self.timed_out} "
                f"({self.seconds:.1f} s)\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")


def run(cmd, timeout, env=None, during=None):
    """Run ``cmd`` in a new session under ``timeout``; on timeout kill its process group.
    ``during(deadline)`` (time.monotonic), if given, runs while the command does (its output goes
    to files meanwhile); if it raises, the command's process group is killed and the error raised."""
    import tempfile
    import time
    full_env = dict(os.environ)
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    t0 = time.monotonic()
    if during is not None:
        with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
            proc = subprocess.Popen([str(c) for c in cmd], stdout=fo, stderr=fe, text=True, env=full_env,
                                    start_new_session=True, stdin=subprocess.DEVNULL, cwd=REPO)
            timed_out = False
            try:
                during(t0 + timeout)
                proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            fo.seek(0)
            fe.seek(0)
            return Result(list(cmd), proc.returncode, fo.read(), fe.read(), timed_out, time.monotonic() - t0)
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, start_new_session=True, stdin=subprocess.DEVNULL, cwd=REPO)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return Result(list(cmd), proc.returncode, out, err, timed_out, time.monotonic() - t0)


class Cluster:
    """``jobs/vcluster --name NAME``: nodes n1..nN."""

    def __init__(self, name, nnodes):
        self.name, self.nnodes = name, nnodes
        self.nodes = [f"n{i}" for i in range(1, nnodes + 1)]
        self.mpi = mpi_launch.detect(mpiexec_path()) if mpiexec_path() else None
        self.env = {"VCLUSTER_NAME": name, "VCLUSTER_MPIEXEC": mpiexec_path(), "PYTHONUNBUFFERED": "1",
                    "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                    "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}   # 8 ranks on 2 cores: waiting ranks yield

    def vc(self, *args, timeout=60, check=True):
        res = run([VCLUSTER, "--name", self.name, *args], timeout, self.env)
        if check:
            assert res.returncode == 0 and not res.timed_out, str(res)
        return res

    def up(self):
        return self.vc("up", self.nnodes)

    def down(self):
        return self.vc("down", check=False)

    def kill(self, node):
        """Lose ``node`` for real: its processes SIGKILLed, its tmpfs (/dev/shm, the cache) gone."""
        return self.vc("kill", node)

    def lose(self, node):
        """Lose ``node``'s ranks and files, not the MPI launcher's daemon (jobs/vcluster lose: Open
        MPI 5.0.11's runtime ends the whole job when it loses a daemon, even under ULFM)."""
        return self.vc("lose", node)

    def boot(self, node):
        """A fresh, empty node under the same name."""
        return self.vc("boot", node)

    def exec(self, node, *cmd, timeout=30):
        return self.vc("exec", node, *cmd, timeout=timeout, check=False)

    def mpirun_cmd(self, nprocs, app, *args, rpn=None, nodes=None, ft=False):
        cmd = [VCLUSTER, "--name", self.name, "mpirun", "-n", nprocs]
        if rpn:
            cmd += ["--ranks-per-node", rpn]
        if nodes:
            cmd += ["--nodes", ",".join(nodes)]
        if ft:
            cmd += ["--ft"]
        return cmd + ["--", sys.executable, os.path.join(APPS, app), *args]

    def mpirun(self, nprocs, app, *args, rpn=None, nodes=None, timeout=120, ft=False, during=None):
        """``jobs/vcluster mpirun`` of tests/vcluster/apps/<app> on ``nprocs`` ranks, ``rpn`` per node
        (``ft``: a fault-tolerant ULFM job, ``mpirun --ft``). ``during(deadline)``, if given, is
        called while the job runs (e.g. to lose a node); the job is killed if it raises."""
        cmd = self.mpirun_cmd(nprocs, app, *args, rpn=rpn, nodes=nodes, ft=ft)
        # the nodes' /dev/shm go with their tmpfs; /tmp is the host's: what a killed job leaves
        # there (MPICH's hydra_hwloc_xmlfile_*, Open MPI's session dirs) is removed after the job
        with self.mpi.cleanup():
            try:
                res = run(cmd, timeout, self.env, during=during)
            except BaseException:
                self.vc("killprocs", check=False)
                raise
            if res.timed_out:
                self.vc("killprocs", check=False)
        if res.timed_out:
            raise AssertionError(f"MPI job timed out after {timeout} s (process group and node processes killed):\n{res}")
        return res


def stale_clusters():
    """Names of clusters of earlier pytest runs whose process is gone."""
    base = "/run/hpcckpt-vcluster"
    out = []
    for name in os.listdir(base) if os.path.isdir(base) else ():
        m = re.fullmatch(r"pytest-(\d+)", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            out.append(name)
    return out
