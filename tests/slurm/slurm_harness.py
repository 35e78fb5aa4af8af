"""Helpers and fixtures for the SLURM tests: a running cluster (else skip, or fail when CI=true), sbatch
submission with the project's venv, waits with timeouts, and scancel of every job left running."""
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from hpcckpt import mpi_launch
from hpcckpt.slurm import parse_scontrol

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
JOBS = os.path.join(REPO, "jobs")
APP = os.path.join(HERE, "app.py")
MIN_NODES = 3
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}


def _unavailable(reason):
    """Skip, or fail in CI (CI=true) where these tests must run."""
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"SLURM tests must run in CI, but: {reason}")
    pytest.skip(reason)


def _cluster_problem():
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        how = "sudo jobs/local-slurm-setup.sh" if os.geteuid() != 0 else "jobs/local-slurm-setup.sh (as root)"
        return f"no SLURM here (sinfo/sbatch not found); start a local cluster with {how}"
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=15,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s (is slurmctld running? jobs/local-slurm-setup.sh starts it)"
    if proc.returncode != 0:
        return f"sinfo failed: {proc.stderr.strip()[:200]} (jobs/local-slurm-setup.sh starts a local cluster)"
    nodes = {ln.split()[0] for ln in proc.stdout.splitlines()
             if len(ln.split()) == 2 and not ln.split()[1].endswith("*")
             and ln.split()[1].rstrip("~#") in ("idle", "mix", "alloc", "comp")}
    if len(nodes) < MIN_NODES:
        return f"the SLURM cluster has {len(nodes)} usable node(s), these tests need {MIN_NODES}: {proc.stdout.strip()}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running SLURM cluster with at least MIN_NODES usable nodes."""
    problem = _cluster_problem()
    if problem:
        _unavailable(problem)
    return True


def mpi():
    """The MPI of this Python (hpcckpt.mpi_launch): its mpiexec runs inside the allocation too
    (MPICH's hydra and Open MPI's prterun both start their daemons there with srun)."""
    return mpi_launch.detect()


def launch(nprocs):
    """LAUNCH= for jobs/*.sbatch: this Python's ``mpiexec -n N``."""
    return mpi().launch_prefix(nprocs)


class Job:
    def __init__(self, job_id, output):
        self.id = job_id
        self.output = output

    def text(self):
        try:
            with open(self.output, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def lines(self, prefix):
        """Output lines starting with ``prefix`` (prefix stripped), in order."""
        return [ln[len(prefix):].strip() for ln in self.text().splitlines() if ln.startswith(prefix)]

    def info(self):
        """``scontrol show job`` fields, or {} when SLURM no longer knows the job."""
        proc = subprocess.run(["scontrol", "show", "job", "-o", self.id], capture_output=True, text=True,
                              timeout=15, stdin=subprocess.DEVNULL)
        return parse_scontrol(proc.stdout) if proc.returncode == 0 else {}

    def state(self):
        return self.info().get("JobState", "UNKNOWN")

    def wait_done(self, timeout, restarts=0):
        """Wait (at most ``timeout`` s) for a final state after ``restarts`` requeues; return the info."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            if info.get("JobState") in TERMINAL and int(info.get("Restarts", "0")) >= restarts:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"job {self.id} not finished after {timeout} s: {info.get('JobState')} "
                                     f"(restarts {info.get('Restarts')})\n{self}")
            time.sleep(0.5)

    def wait_for_file(self, path, timeout):
        """Wait for ``path`` to exist while the job runs; fail early if the job ends first."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            state = self.state()
            if state in TERMINAL:
                raise AssertionError(f"job {self.id} ended ({state}) before {path} appeared\n{self}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} did not appear within {timeout} s (job {self.id}: {state})\n{self}")
            time.sleep(0.2)

    def __repr__(self):
        return f"--- output of job {self.id} ({self.output}):\n{self.text()[-6000:]}"


@pytest.fixture
def slurm_jobs(slurm_cluster, tmp_path):
    """submit(template, sbatch_args, **env) -> Job; every job still running at the end is cancelled,
    and the node-local caches and the MPI's leftovers made meanwhile (that nobody uses) are removed."""
    submitted, caches = [], []
    leftovers = mpi().snapshot()

    def submit(template, sbatch_args=(), **env_vars):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCCKPT_", "SLURM_", "CKPT_"))}
        env = mpi().env(env)        # the launcher's own variables (Open MPI as root, ...) reach the job
        cache_base = os.path.join("/dev/shm", f"hpcckpt-slurmtest-{uuid.uuid4().hex[:10]}")
        caches.append(cache_base)
        env.update(PYTHON=sys.executable, CACHE_BASE=cache_base, PYTHONUNBUFFERED="1",
                   NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", os.path.join(REPO, ".numba-cache")),
                   PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                   HPCCKPT_PFS_DIR=str(tmp_path / "pfs"), HPCCKPT_RANKS_PER_NODE="2", HPCCKPT_NAME="slurmtest")
        env.update({k: str(v) for k, v in env_vars.items()})
        output = str(tmp_path / f"{os.path.splitext(template)[0]}-%j.out")
        cmd = ["sbatch", "--parsable", f"--output={output}", f"--chdir={tmp_path}", "--time=30",
               *sbatch_args, os.path.join(JOBS, template)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        job_id = proc.stdout.strip().split(";")[0]
        submitted.append(job_id)
        return Job(job_id, output.replace("%j", job_id))

    yield submit
    for job_id in submitted:
        info = Job(job_id, "").info()
        if info and info.get("JobState") not in TERMINAL:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
            for _ in range(60):
                if Job(job_id, "").info().get("JobState", "COMPLETED") in TERMINAL:
                    break
                time.sleep(0.5)
    for path in caches:
        shutil.rmtree(path, ignore_errors=True)
    leftovers.remove()
