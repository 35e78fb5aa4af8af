"""What an independent review broke, one test per class (docs/RELIABILITY.md, "Red team"):
earlier runs and other jobs in the same directories, failed background flushes, rebuilds that
cannot write, damaged indexes that still parse, settings that differ between ranks, crafted huge
indexes, commits that fail half-way. Real mpiexec jobs of tests/mpi/apps/matrix_app.py (state
recomputable in this process, so every restore is checked bitwise)."""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from hpcckpt import mpi_launch
from harness import mpi, popen_mpi, readline, run_mpi
from reliability import check_restored

pytestmark = pytest.mark.mpi
TIMEOUT = 120


def job(root, nprocs=4, *args, config=None, name="app", pfs=None):
    cfg = {"ranks_per_node": 1}
    cfg.update(config or {})
    return run_mpi(nprocs, "matrix_app.py", "--cache", os.path.join(root, "node{node}"), "--name", name,
                   "--pfs", pfs or os.path.join(root, "pfs"), "--config-json", json.dumps(cfg), *args, timeout=TIMEOUT)


def restart_of(res):
    (value,) = res.lines("RESTART")
    return None if value == "None" else int(value)


def steps_in(path):
    return sorted(int(os.path.basename(p)[5:]) for p in glob.glob(os.path.join(path, "step_??????????")))


def restored_ok(root, tmp, nprocs=4, **kw):
    res = job(root, nprocs, "--steps", 0, "--restored", tmp, **kw)
    assert res.returncode == 0, str(res)
    step = restart_of(res)
    assert check_restored(tmp, nprocs, step) is None, "WRONG DATA"
    return step


# ---------------------------------------------------------------------- earlier runs, other jobs
def test_a_fresh_run_keeps_its_pfs_checkpoints_and_restarts_from_them(shm_dir, tmp_path):
    """Red team 1: a run started afresh where an earlier run reached step 34 must not lose its
    own pfs checkpoints to retention, nor restart into the earlier run's step 34."""
    assert job(shm_dir, 4, "--steps", 35, "--level", "pfs").returncode == 0        # pfs 29, 34 (epoch 1)
    res = job(shm_dir, 4, "--steps", 15, "--level", "pfs", "--no-restart")          # epoch 2: 4, 9, 14
    assert res.returncode == 0, str(res)
    assert steps_in(os.path.join(shm_dir, "pfs", "app")) == [9, 14, 29, 34]         # keep = 2 of each run
    for d in glob.glob(os.path.join(shm_dir, "node*")):
        shutil.rmtree(d)                                                             # only pfs is left
    assert restored_ok(shm_dir, tmp_path / "r") == 14


def test_a_relaunch_that_cannot_use_the_checkpoints_deletes_nothing(shm_dir, tmp_path):
    """Red team 2: another world size or ranks_per_node stops the restart, and a run that goes on
    anyway never deletes (or writes over) the good job's checkpoints."""
    assert job(shm_dir, 4, "--steps", 20).returncode == 0                            # steps 14, 19
    before = sorted(glob.glob(os.path.join(shm_dir, "node*", "app", "step_*", "rank_*")))
    res = job(shm_dir, 2, "--steps", 20)                                            # another world size
    assert res.returncode == 3 and all("IncompatibleCheckpointError" in e and "4 ranks" in e
                                       for e in res.lines("ERROR")), str(res)
    res = job(shm_dir, 4, "--steps", 20, config={"ranks_per_node": 2})              # another placement
    assert res.returncode == 3 and all("IncompatibleCheckpointError" in e and "node" in e
                                       for e in res.lines("ERROR")), str(res)
    res = job(shm_dir, 2, "--steps", 20, "--no-restart")                            # goes on regardless
    fails = res.lines("CKPTFAIL")
    assert res.returncode == 0 and any(f.startswith("14 CheckpointWriteError") and "cannot use" in f
                                       for f in fails), str(res)
    after = sorted(glob.glob(os.path.join(shm_dir, "node*", "app", "step_*", "rank_*")))
    assert set(before) <= set(after), "a checkpoint of the good job was deleted"
    for p in set(after) - set(before):       # the good job restarts once the other run's files are gone
        os.unlink(p)
    assert restored_ok(shm_dir, tmp_path / "r") == 19


def test_two_jobs_of_the_same_name_are_refused(shm_dir):
    """Red team 2: a second job with the same name in the same directories is refused clearly."""
    script = os.path.join(shm_dir, "hold.py")
    with open(script, "w") as f:
        f.write("import sys, time\nfrom mpi4py import MPI\nimport hpcckpt\n"
                f"c = hpcckpt.Checkpointer(MPI.COMM_WORLD, name='app', cache_dir={os.path.join(shm_dir, 'node{node}')!r}, "
                "ranks_per_node=1)\nMPI.COMM_WORLD.Barrier()\nif MPI.COMM_WORLD.rank == 0: print('HOLDING', flush=True)\n"
                "time.sleep(60)\n")
    with mpi().cleanup():
        holder = popen_mpi(2, [sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert readline(holder, TIMEOUT).strip() == "HOLDING"
            res = job(shm_dir, 2, "--steps", 5)
            errors = res.lines("ERROR")
            assert res.returncode == 3 and len(errors) == 2 and all(
                e.startswith("ConcurrentJobError") and "another job is using" in e for e in errors), str(res)
        finally:
            mpi_launch.kill_job(holder)


def test_a_job_refused_the_pfs_directory_stays_refused(shm_dir, tmp_path):
    """Red team 3: a second job of the same name with its own caches but the same pfs directory
    gets ConcurrentJobError at every pfs checkpoint while the first job holds it (not only at
    the first), and never writes a step there (the first job would restart from it)."""
    pfs = os.path.join(shm_dir, "pfs")
    script = os.path.join(shm_dir, "hold_pfs.py")
    with open(script, "w") as f:
        f.write("import time\nimport numpy as np\nfrom mpi4py import MPI\nimport hpcckpt\n"
                f"c = hpcckpt.Checkpointer(MPI.COMM_WORLD, name='app', cache_dir={os.path.join(shm_dir, 'a{node}')!r}, "
                f"pfs_dir={pfs!r}, ranks_per_node=1)\nc.checkpoint(1, {{'x': np.zeros(3)}}, level='pfs')\n"
                "if MPI.COMM_WORLD.rank == 0: print('HOLDING', flush=True)\ntime.sleep(60)\n")
    with mpi().cleanup():
        holder = popen_mpi(2, [sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert readline(holder, TIMEOUT).strip() == "HOLDING"
            res = job(str(tmp_path), 2, "--steps", 15, "--level", "pfs", "--no-restart", pfs=pfs)
            fails = res.lines("CKPTFAIL")
            assert res.returncode == 0 and sorted({f.split()[0] for f in fails}) == ["14", "4", "9"] and all(
                f.split()[1] == "ConcurrentJobError" for f in fails), str(res)
            assert steps_in(os.path.join(pfs, "app")) == [1], "the refused job wrote into the pfs directory"
        finally:
            mpi_launch.kill_job(holder)


def test_start_fresh_removes_the_earlier_runs_checkpoints_after_its_first(shm_dir, tmp_path):
    assert job(shm_dir, 4, "--steps", 20, "--level", "pfs").returncode == 0       # 14, 19 in cache and pfs
    res = job(shm_dir, 4, "--steps", 7, config={"start": "fresh"})              # local 4 only
    assert res.returncode == 0 and restart_of(res) is None, str(res)
    assert steps_in(os.path.join(shm_dir, "node0", "app")) == [4]
    assert steps_in(os.path.join(shm_dir, "pfs", "app")) == []
    assert restored_ok(shm_dir, tmp_path / "r") == 4


# ---------------------------------------------------------------------- background flush
def test_a_failed_background_flush_does_not_swallow_the_next_checkpoint(shm_dir, tmp_path):
    """Red team 3: step 4's async pfs flush fails on rank 1; step 9 is still checkpointed, then
    the flush error is raised (documented); a restart finds step 9."""
    res = run_mpi(4, "matrix_app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--levels", "pfs,local",
                  "--steps", 13, "--crash-at", 12, "--config-json",
                  json.dumps({"ranks_per_node": 1, "async_flush": True}),
                  env={"_HPCCKPT_FAULT": "pfs-write:1:4:error"}, timeout=TIMEOUT)
    fails = res.lines("CKPTFAIL")
    assert len(fails) == 4 and all(f.startswith("9 CheckpointWriteError") and "background pfs flush of step 4" in f
                                   and "step 9 was checkpointed" in f for f in fails), str(res)
    assert restored_ok(shm_dir, tmp_path / "r") == 9


# ---------------------------------------------------------------------- rebuilds, indexes
def test_a_rebuild_that_cannot_write_falls_back(shm_dir, tmp_path):
    """Red team 4: ENOSPC on the lost node while rebuilding step 9 falls back to step 4."""
    res = job(shm_dir, 4, "--steps", 13, "--crash-at", 12, "--level", "partner")
    assert res.returncode != 0 and "CKPT 9" in res.stdout, str(res)
    shutil.rmtree(os.path.join(shm_dir, "node1"))
    res = run_mpi(4, "matrix_app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--steps", 0,
                  "--restored", tmp_path / "r", "--config-json", json.dumps({"ranks_per_node": 1}),
                  env={"_HPCCKPT_FAULT": "rebuild:1:9:error"}, timeout=TIMEOUT)
    assert res.returncode == 0 and restart_of(res) == 4, str(res)
    assert check_restored(tmp_path / "r", 4, 4) is None
    assert "rebuild failed" in res.stderr


def test_xor_rebuild_makes_private_directories(shm_dir, tmp_path):
    res = job(shm_dir, 4, "--steps", 13, "--crash-at", 12, "--level", "xor")
    assert res.returncode != 0 and "CKPT 9" in res.stdout, str(res)
    shutil.rmtree(os.path.join(shm_dir, "node2"))
    assert restored_ok(shm_dir, tmp_path / "r") == 9
    for d in (os.path.join(shm_dir, "node2", "app"), os.path.join(shm_dir, "node2", "app", "step_0000000009")):
        assert os.stat(d).st_mode & 0o777 == 0o700, d


def test_a_damaged_index_that_still_parses_falls_back(shm_dir, tmp_path):
    """Red team 5: a one-character edit of COMMITTED.json (a shape digit) is damage, not a
    MismatchError: the restart falls back to the previous pfs step."""
    assert job(shm_dir, 4, "--steps", 10, "--level", "pfs").returncode == 0       # pfs 4, 9
    for d in glob.glob(os.path.join(shm_dir, "node*")):
        shutil.rmtree(d)
    path = os.path.join(shm_dir, "pfs", "app", "step_0000000009", "COMMITTED.json")
    text = open(path).read()
    i = text.index('"shape": [') + len('"shape": [')
    with open(path, "w") as f:
        f.write(text[:i] + ("2" if text[i] != "2" else "3") + text[i + 1:])
    assert restored_ok(shm_dir, tmp_path / "r") == 4


def test_a_huge_crafted_index_is_refused_quickly(shm_dir, tmp_path):
    """Red team 11: an index far larger than this job can have written is not parsed."""
    assert job(shm_dir, 4, "--steps", 10, "--level", "pfs").returncode == 0
    for d in glob.glob(os.path.join(shm_dir, "node*")):
        shutil.rmtree(d)
    path = os.path.join(shm_dir, "pfs", "app", "step_0000000009", "COMMITTED.json")
    doc = json.load(open(path))
    doc["padding"] = "x" * (40 << 20)
    json.dump(doc, open(path, "w"))
    t0 = time.monotonic()
    assert restored_ok(shm_dir, tmp_path / "r") == 4
    assert time.monotonic() - t0 < 60


# ---------------------------------------------------------------------- settings, pfs_dir
def test_a_setting_that_differs_between_ranks_is_named(shm_dir):
    """Red team 9: io_chunk on one rank only would hang the partner exchange: refused up front."""
    res = run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--level", "partner",
                  "--config-json", json.dumps({"ranks_per_node": 1}), "--rank-config-json", '2:{"io_chunk": 65536}',
                  timeout=TIMEOUT)
    errors = res.lines("ERROR")
    assert res.returncode == 3 and len(errors) == 4 and all(e.startswith("ConfigError") and "io_chunk" in e
                                                             and "differs between ranks" in e for e in errors), str(res)


@pytest.mark.parametrize("given,named", [({"rs": {"parity": 3}}, "rs_parity=3"),
                                         ({"plugin": {"dir": "/elsewhere"}}, "'/elsewhere'")])
def test_a_level_setting_that_differs_between_ranks_is_named(given, named, shm_dir):
    """A level's own settings are compared between ranks too: a built-in level's given as its
    table (its flat key is named), a plug-in level's (Config.level_settings)."""
    res = run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--level", "partner",
                  "--config-json", json.dumps({"ranks_per_node": 1}), "--rank-config-json", f"2:{json.dumps(given)}",
                  env={"HPCCKPT_LEVEL_MODULES": "plugin_level"}, timeout=TIMEOUT)
    errors = res.lines("ERROR")
    assert res.returncode == 3 and len(errors) == 4 and all(e.startswith("ConfigError") and named in e
                                                             and "differs between ranks" in e for e in errors), str(res)


def test_a_pfs_directory_removed_while_the_job_runs_is_created_again(shm_dir, tmp_path):
    """Third review: a purge of the scratch file system removed pfs_dir while the job ran, and
    every later pfs checkpoint failed. Now the next one creates the directory again (locked
    again, a warning says the earlier pfs steps are gone), and the newest step restarts from pfs."""
    pfs = os.path.join(shm_dir, "pfs")
    res = job(shm_dir, 4, "--steps", 20, "--level", "pfs", "--remove-at", f"10:{pfs}")
    assert res.returncode == 0 and not res.lines("CKPTFAIL"), str(res)
    assert "was removed while the job ran" in res.stderr, str(res)
    assert steps_in(os.path.join(pfs, "app")) == [14, 19]
    assert os.path.isfile(os.path.join(pfs, "app", ".lock"))
    for d in glob.glob(os.path.join(shm_dir, "node*")):
        shutil.rmtree(d)
    assert restored_ok(shm_dir, str(tmp_path / "restored")) == 19


def test_pfs_dir_that_is_a_file_gives_a_write_error(shm_dir):
    """Red team 14: a pfs_dir that is not a directory is a CheckpointWriteError, not a
    CollectiveError, and the cache checkpoints go on."""
    bad = os.path.join(shm_dir, "not-a-dir")
    open(bad, "w").close()
    res = job(shm_dir, 4, "--steps", 10, "--levels", "local,pfs", pfs=bad)
    fails = res.lines("CKPTFAIL")
    assert res.returncode == 0 and len(fails) == 4 and all(f.startswith("9 CheckpointWriteError") for f in fails), str(res)


def test_an_intercommunicator_or_comm_null_is_refused_on_every_rank(shm_dir):
    """Red team 4: Checkpointer(intercomm) failed with a TypeError on one rank and hung the
    other; COMM_NULL gave MPI's own error. Now a ConfigError on every rank, no hang."""
    script = os.path.join(shm_dir, "inter.py")
    with open(script, "w") as f:
        f.write("import os\nfrom mpi4py import MPI\nimport hpcckpt\nw = MPI.COMM_WORLD\n"
                "local = w.Split(w.rank % 2, w.rank)\n"
                "inter = local.Create_intercomm(0, w, 1 - w.rank % 2, tag=5)\n"
                "for comm in (inter, MPI.COMM_NULL):\n"
                "    try:\n"
                f"        hpcckpt.Checkpointer(comm, name='ic', cache_dir={os.path.join(shm_dir, 'node{node}')!r})\n"
                "    except hpcckpt.ConfigError as e:\n"
                "        os.write(1, f'REFUSED {w.rank} {e}\\n'.encode())\n")      # one write: lines never interleave
    res = run_mpi(2, script, timeout=TIMEOUT)
    refused = res.lines("REFUSED")
    assert res.returncode == 0 and len(refused) == 4, str(res)
    assert all("needs an intracommunicator" in r for r in refused), str(res)
