"""hpcckpt.mpi_launch without starting MPI: flavour detection from real `mpiexec --version`
texts, commands, the launcher's environment, exit statuses, leftovers and the job's processes."""
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcckpt import mpi_launch as ml

# verbatim `mpiexec --version` outputs (PyPI wheels on these machines; Intel MPI from its docs)
HYDRA = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    CC:                              cc
    Configure options:                       --with-device=ch4:ucx,ofi --with-pm=hydra:gforker
    Process Manager:                         pmi
"""
OPEN_MPI = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OPEN_MPI_4 = "mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
INTEL = "Intel(R) MPI Library for Linux* OS, Version 2021.13 Build 20240701 (id: 8b9a0b5)\nCopyright 2003-2024, Intel Corporation.\n"


@pytest.mark.parametrize("text,want", [(HYDRA, ("mpich", "5.0.2")), (OPEN_MPI, ("openmpi", "5.0.11")),
                                       (OPEN_MPI_4, ("openmpi", "4.1.6")), (INTEL, ("intelmpi", "2021.13")),
                                       ("", ("unknown", "")), ("mpiexec: unrecognized option", ("unknown", ""))])
def test_parse_version(text, want):
    assert ml.parse_version(text) == want


def mpi(name, version="1.0", path="/opt/mpi/bin/mpiexec"):
    return ml.MPI(ml.FLAVOURS[name], version, path)


def test_command_is_mpiexec_n_argv():
    for name in ml.FLAVOURS:
        assert mpi(name).command(4, ["python", "app.py", 3]) == ["/opt/mpi/bin/mpiexec", "-n", "4", "python", "app.py", "3"]
    assert mpi("openmpi").launch_prefix(2) == "/opt/mpi/bin/mpiexec -n 2"
    assert mpi("mpich", path="/a b/mpiexec").launch_prefix(2) == "'/a b/mpiexec' -n 2"


def test_fault_tolerant_command_only_where_ulfm_works():
    """Online recovery (hpcckpt.online) needs ULFM: Open MPI gets its options (TCP, never the
    shared-memory BTL, which never reports a failure); every other MPI is refused up front."""
    assert mpi("openmpi").supports_ulfm
    assert mpi("openmpi").command(5, ["python", "app.py"], fault_tolerant=True) == [
        "/opt/mpi/bin/mpiexec", "--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
        "-n", "5", "python", "app.py"]
    for name in ("mpich", "intelmpi", "unknown"):
        m = mpi(name)
        assert not m.supports_ulfm
        with pytest.raises(ml.ULFMUnsupportedError, match="online recovery needs an MPI with ULFM") as e:
            m.command(5, ["python", "app.py"], fault_tolerant=True)
        assert isinstance(e.value, ml.HpcCkptError)
        assert m.command(5, ["x"]) == ["/opt/mpi/bin/mpiexec", "-n", "5", "x"]


ROOT_VARS = {"OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"}
OVERSUB = "PRTE_MCA_rmaps_default_mapping_policy"


@pytest.mark.parametrize("euid", [0, 1000])
def test_open_mpi_env_root_only_as_root_oversubscribe_beyond_the_cores(monkeypatch, euid):
    monkeypatch.setattr(ml, "_euid", lambda: euid)
    monkeypatch.setattr(ml, "_cores", lambda: 2)
    m = mpi("openmpi")
    base = {"PATH": "/bin"}
    for nprocs, oversub in ((1, False), (2, False), (3, True), (8, True), (None, True)):
        env = m.env(base, nprocs=nprocs)
        assert env["PATH"] == "/bin" and base == {"PATH": "/bin"}          # a copy; base untouched
        assert (ROOT_VARS <= env.keys()) == (euid == 0), env
        assert (env.get(OVERSUB) == ":oversubscribe") == oversub, (nprocs, env)
    # what the user set is kept: their mapping policy, or their own oversubscription setting
    assert m.env({OVERSUB: "ppr:1:core"}, nprocs=8)[OVERSUB] == "ppr:1:core"
    assert OVERSUB not in m.env({"OMPI_MCA_rmaps_base_oversubscribe": "0"}, nprocs=8)
    assert m.env({"OMPI_ALLOW_RUN_AS_ROOT": "0"}, nprocs=1)["OMPI_ALLOW_RUN_AS_ROOT"] == "0"


def test_mpich_env_adds_nothing(monkeypatch):
    monkeypatch.setattr(ml, "_euid", lambda: 0)
    monkeypatch.setattr(ml, "_cores", lambda: 1)
    assert mpi("mpich").env({"A": "1"}, nprocs=64) == {"A": "1"}
    assert mpi("mpich").env(None) == dict(os.environ)


def test_killed_statuses():
    assert mpi("mpich").killed_status() == 9 and mpi("openmpi").killed_status() == 137
    assert mpi("openmpi").killed_status(signal.SIGTERM) == 143
    assert mpi("intelmpi").killed_status() == mpi("intelmpi").killed_status(signal.SIGTERM) == 255
    assert mpi("intelmpi").rank_killed(255) and not mpi("intelmpi").rank_killed(9)
    assert mpi("mpich").rank_killed(9) and not mpi("mpich").rank_killed(137)
    assert mpi("openmpi").rank_killed(137) and not mpi("openmpi").rank_killed(9)
    assert mpi("openmpi").rank_killed(137, signal.SIGKILL) and not mpi("openmpi").rank_killed(143, signal.SIGKILL)
    for name in ml.FLAVOURS:
        assert not mpi(name).rank_killed(0) and not mpi(name).rank_killed(1) and not mpi(name).rank_killed(3)
    assert mpi("unknown").rank_killed(9) and mpi("unknown").rank_killed(137)


def test_find_mpiexec_prefers_MPIEXEC_then_beside_python_then_path(tmp_path):
    exe = tmp_path / "bin" / "mpiexec"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 9.9.9'\n")
    exe.chmod(0o755)
    assert ml.find_mpiexec({"MPIEXEC": str(exe), "PATH": ""}) == str(exe)
    assert ml.find_mpiexec({"MPIEXEC": "mpiexec", "PATH": str(exe.parent)}) == str(exe)
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(beside):
        assert ml.find_mpiexec({"PATH": str(exe.parent)}) == beside
    else:
        assert ml.find_mpiexec({"PATH": str(exe.parent)}) == str(exe)
    m = ml.detect(str(exe))
    assert (m.name, m.version, m.mpiexec) == ("openmpi", "9.9.9", str(exe))


def test_detect_falls_back_on_the_info_tool_beside_mpiexec(tmp_path):
    exe = tmp_path / "mpiexec"
    exe.write_text("#!/bin/sh\nexit 1\n")
    exe.chmod(0o755)
    assert ml.detect(str(exe)).name == "unknown"
    other = tmp_path / "other"
    other.mkdir()
    (other / "mpiexec").write_text("#!/bin/sh\nexit 1\n")
    (other / "mpiexec").chmod(0o755)
    (other / "mpichversion").write_text("")
    assert ml.detect(str(other / "mpiexec")).name == "mpich"


def test_no_mpiexec_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MPIEXEC", str(tmp_path / "nothing"))
    with pytest.raises(ml.MPINotFoundError, match=r"no mpiexec found.*hpcckpt\[mpich\].*hpcckpt\[openmpi\]"):
        ml.detect()


def test_detect_this_python_matches_the_tools_beside_its_launcher():
    try:
        m = ml.detect()
    except ml.MPINotFoundError:
        pytest.skip("no MPI in this environment")
    here = os.path.dirname(os.path.realpath(m.mpiexec))
    if os.path.exists(os.path.join(here, "ompi_info")):
        assert m.name == "openmpi" and m.killed_status() == 137
    if os.path.exists(os.path.join(here, "mpichversion")):
        assert m.name == "mpich" and m.killed_status() == 9
    assert m.version


def make(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_leftovers_only_new_and_unused_are_removed(tmp_path):
    shm, tmp = str(tmp_path / "shm"), str(tmp_path / "tmp")
    bases = {"shm": [shm], "tmp": [tmp]}
    rules = ml.FLAVOURS["mpich"].leftovers + ml.FLAVOURS["openmpi"].leftovers
    make(f"{shm}/mpich_shm_old_0")                        # before the job: never touched
    make(f"{tmp}/ompi.vm.0/jf.0/111/keep")
    snap = ml.Leftovers(rules, bases)
    make(f"{shm}/mpich_shm_new_0")
    make(f"{shm}/sm_segment.vm.0.ab.0")
    make(f"{shm}/not_mpi")
    make(f"{tmp}/hydra_hwloc_xmlfile_XYZ")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    make(f"{tmp}/ompi.{dead.pid}/1/pmix-gds")             # a session dir whose launcher is gone
    make(f"{tmp}/ompi.{os.getpid()}/hwloc.sm")            # ... whose launcher lives: kept
    os.makedirs(f"{tmp}/ompi.vm.0/jf.0/222")              # a singleton's empty directory
    os.makedirs(f"{tmp}/ompi.vm.0/jf.0/333/0")            # a running singleton's: not empty, kept
    held = open(f"{shm}/sm_segment.vm.0.ab.1", "w")       # open by a live process (us): kept
    try:
        removed = snap.remove()
    finally:
        held.close()
    assert sorted(removed) == sorted([f"{shm}/mpich_shm_new_0", f"{shm}/sm_segment.vm.0.ab.0",
                                      f"{tmp}/hydra_hwloc_xmlfile_XYZ", f"{tmp}/ompi.{dead.pid}",
                                      f"{tmp}/ompi.vm.0/jf.0/222"])
    left = {os.path.relpath(os.path.join(r, n), str(tmp_path)) for r, ds, fs in os.walk(str(tmp_path)) for n in fs + ds}
    assert {"shm/mpich_shm_old_0", "shm/not_mpi", "shm/sm_segment.vm.0.ab.1", f"tmp/ompi.{os.getpid()}/hwloc.sm",
            "tmp/ompi.vm.0/jf.0/111/keep", "tmp/ompi.vm.0/jf.0/333/0"} <= left
    assert ml.Leftovers(rules, bases).remove() == []      # nothing new since


def test_leftovers_in_use_by_cwd_or_mapping_are_kept(tmp_path):
    import mmap
    shm = str(tmp_path / "shm")
    os.makedirs(shm)
    snap = ml.Leftovers((("shm", "sm_segment.*", "file"), ("shm", "ompi.[0-9]*", "session")), {"shm": [shm]})
    make(f"{shm}/sm_segment.x.0", "x" * 4096)
    with open(f"{shm}/sm_segment.x.0", "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 4096)            # mapped, file closed: still in use
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.makedirs(f"{shm}/ompi.{dead.pid}/1")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=f"{shm}/ompi.{dead.pid}/1")
    try:
        assert snap.remove() == []
    finally:
        child.kill()
        child.wait()
        mapped.close()
    assert sorted(snap.remove()) == [f"{shm}/ompi.{dead.pid}", f"{shm}/sm_segment.x.0"]


def test_kill_job_kills_processes_outside_the_launchers_process_group():
    # what Open MPI does: the launcher's children run in process groups of their own
    code = ("import os, subprocess, sys, time\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], process_group=0)\n"
            "        for _ in range(2)]\n"
            "print(' '.join(str(k.pid) for k in kids), flush=True)\ntime.sleep(60)\n")
    if sys.version_info < (3, 11):
        pytest.skip("Popen(process_group=) needs Python 3.11")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        kids = [int(p) for p in proc.stdout.readline().split()]
        assert len(kids) == 2 and all(os.getpgid(k) == k for k in kids)
        assert set(kids) | {proc.pid} <= ml.job_processes(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)                 # the launcher's group only: the kids live on
        proc.wait()
        assert set(kids) <= ml.job_processes(proc.pid)      # found again by their session
    finally:
        ml.kill_job(proc)
    for k in kids:
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{k}") and not _zombie(k):
            assert time.monotonic() < deadline, f"process {k} survived kill_job"
            time.sleep(0.05)


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
