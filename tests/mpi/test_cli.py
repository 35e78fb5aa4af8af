"""The hpcckpt command on checkpoints written by a real MPI job: list, verify, inspect, exit codes,
on the cache, on the pfs level, and on a directory above both. (Fabricated cases without MPI:
tests/unit/test_catalog.py.)"""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from harness import run_mpi

pytestmark = pytest.mark.mpi


def cli(*args):
    res = subprocess.run([sys.executable, "-m", "hpcckpt", *map(str, args)], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert "Traceback" not in res.stderr and "(None)" not in res.stdout + res.stderr, res.stderr
    return res


def rows(res):
    """The table rows of `hpcckpt list`, split into columns (step level epoch in job ranks bytes ...)."""
    return [ln.split() for ln in res.stdout.splitlines()[1:] if ln.strip()[:1].isdigit()]


@pytest.fixture
def checkpoints(shm_dir):
    res = run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--steps", 13, "--every", 5,
                  "--crash-at", 12, "--crash-rank", 0, "--config-json", '{"ranks_per_node": 2}')
    assert res.returncode != 0
    return shm_dir


def test_help_and_usage():
    res = cli("--help")
    assert res.returncode == 0 and "verify" in res.stdout and "demo" in res.stdout
    assert cli().returncode == 2
    assert cli("frobnicate").returncode == 2


def test_list_shows_committed_steps(checkpoints):
    res = cli("list", checkpoints)
    assert res.returncode == 0, res.stderr
    lines = rows(res)
    assert [ln[0] for ln in lines] == ["4", "9"]
    assert all(ln[1:6] == ["local", "1", "cache", "app", "4/4"] and "committed" in ln for ln in lines)
    one_node = cli("list", os.path.join(checkpoints, "node1"))
    assert "committed on 2 of 4 ranks here" in one_node.stdout


def test_verify_says_when_a_job_is_running_in_the_directory(checkpoints):
    """A job holding the cache (its lock taken) may be writing or retiring steps: verify says so
    (a missing file would otherwise read as damage); the lock is only read, never taken."""
    from hpcckpt.lock import DirLock
    lock_file = os.path.join(checkpoints, "node0", "app", ".lock.rank_000000")
    assert os.path.exists(lock_file)
    res = cli("verify", checkpoints)
    assert res.returncode == 0 and "a job is running" not in res.stdout, res.stdout
    held = DirLock(lock_file, "test")            # as a running job holds it
    try:
        res = cli("verify", checkpoints)
        assert res.returncode == 0 and f"note: a job is running here ({lock_file}, held by" in res.stdout, res.stdout
    finally:
        held.release()
    res = cli("verify", checkpoints)
    assert "a job is running" not in res.stdout, res.stdout


def test_list_shows_uncommitted_data(checkpoints):
    victim = glob.glob(os.path.join(checkpoints, "node0", "app", "step_0000000009", "rank_000001.json"))[0]
    os.unlink(victim)
    res = cli("list", checkpoints)
    assert "committed on 3 of 4 ranks here; uncommitted data of rank(s) [1]" in res.stdout


def test_verify_ok_then_damaged(checkpoints):
    res = cli("verify", checkpoints)
    assert res.returncode == 0 and "8 of 8 files intact" in res.stdout
    victim = glob.glob(os.path.join(checkpoints, "node1", "app", "step_0000000009", "rank_000003.dat"))[0]
    with open(victim, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    res = cli("verify", checkpoints)
    assert res.returncode == 1
    assert "DAMAGED step 9 rank 3" in res.stdout and victim in res.stdout
    assert cli("verify", checkpoints, "--step", 4).returncode == 0
    assert cli("verify", checkpoints, "--step", 77).returncode == 2


def test_verify_names_the_ranks_of_a_lost_node(checkpoints):
    shutil.rmtree(os.path.join(checkpoints, "node1"))          # ranks 2 and 3 (2 ranks per node)
    res = cli("verify", checkpoints)
    assert res.returncode == 1, res.stdout
    for step in (4, 9):
        for rank in (2, 3):
            assert f"MISSING step {step} rank {rank}: no manifest under {checkpoints}" in res.stdout
    assert "cache: 4 of 4 files intact; 4 rank part(s) MISSING" in res.stdout
    assert "committed on 2 of 4 ranks here" in cli("list", checkpoints).stdout
    res = cli("verify", os.path.join(checkpoints, "node0"), "--partial")
    assert res.returncode == 0 and "rank(s) 2, 3 of 4 are not under" in res.stdout


def test_verify_truncated_and_garbage_manifest(checkpoints):
    step4 = os.path.join(checkpoints, "node0", "app", "step_0000000004")
    os.truncate(os.path.join(step4, "rank_000000.dat"), 10)
    with open(os.path.join(step4, "rank_000001.json"), "w") as f:
        f.write("{not json")
    res = cli("verify", checkpoints, "--step", 4)
    assert res.returncode == 1
    assert "DAMAGED step 4 rank 0" in res.stdout and "truncated" in res.stdout
    assert "DAMAGED step 4 rank 1" in res.stdout and "not valid JSON" in res.stdout


def test_inspect(checkpoints):
    res = cli("inspect", checkpoints, 9)
    assert res.returncode == 0, res.stderr
    assert "step 9" in res.stdout and "written by 4 ranks" in res.stdout
    rows = [ln.split() for ln in res.stdout.splitlines() if ln.strip().startswith(("0 ", "1 ", "2 ", "3 "))]
    assert {(r[0], r[2]) for r in rows} == {(str(k), n) for k in range(4) for n in ("u", "grid", "it")}
    assert cli("inspect", checkpoints, 5).returncode == 2


def test_missing_directory_is_a_clear_error(tmp_path):
    res = cli("list", tmp_path / "nope")
    assert res.returncode == 2 and "no such directory" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_verify_checks_partner_copies_and_parity(level, shm_dir):
    run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--steps", 10, "--every", 5, "--level", level,
            "--config-json", '{"ranks_per_node": 1}')
    res = cli("verify", shm_dir, "--step", 9)
    assert res.returncode == 0 and "8 of 8 files intact" in res.stdout, res.stdout   # 4 ranks + 4 copies/parities
    # a lost node: its rank is named, with the redundancy that can rebuild it; still exit 1
    shutil.rmtree(os.path.join(shm_dir, "node3"))
    res = cli("verify", shm_dir, "--step", 9)
    assert res.returncode == 1 and "MISSING step 9 rank 3" in res.stdout, res.stdout
    rebuild = ("rebuildable from its partner copy held by rank 0" if level == "partner" else
               "rebuildable from the xor parity of group [0, 1, 2, 3]: 1 of 4 members lost, 1 parity")
    assert rebuild in res.stdout
    # then damage what node0 holds for the others: the damage is named, and rank 3 is now lost for good
    held = "partner_000003" if level == "partner" else "parity"
    victim = os.path.join(shm_dir, "node0", "app", "step_0000000009", "held_000000", held + ".dat")
    with open(victim, "r+b") as f:
        f.write(b"\x99\x98")
    res = cli("verify", shm_dir, "--step", 9)
    assert res.returncode == 1
    assert ("DAMAGED step 9 rank 3 (partner copy held by rank 0)" if level == "partner" else
            "DAMAGED step 9 rank 0 (parity)") in res.stdout, res.stdout
    assert ("no intact partner redundancy for it" if level == "partner" else
            "not rebuildable: group [0, 1, 2, 3] lost 2 of 4 members, its xor parity covers 1") in res.stdout


@pytest.fixture
def pfs_checkpoints(shm_dir):
    """Steps 4 and 9 at the pfs level (4 ranks, 2 per node): cache node0/ node1/ and pfs/ under shm_dir."""
    res = run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--steps", 10, "--every", 5,
                  "--level", "pfs", "--config-json", '{"ranks_per_node": 2}')
    assert res.returncode == 0, res
    return shm_dir


def _flip_block_byte(node_file, dataset):
    """Flip one byte of a dataset's raw bytes (not of HDF5 metadata)."""
    import h5py
    with h5py.File(node_file, "r") as f:
        offset = f[dataset].id.get_offset()
    with open(node_file, "r+b") as f:
        f.seek(offset + 5)
        b = f.read(1)
        f.seek(offset + 5)
        f.write(bytes([b[0] ^ 0xFF]))


def test_list_verify_inspect_on_a_pfs_dir(pfs_checkpoints):
    pfs = os.path.join(pfs_checkpoints, "pfs")
    res = cli("list", pfs)
    assert res.returncode == 0, res.stderr
    lines = rows(res)
    assert [ln[:6] for ln in lines] == [[s, "pfs", "1", "pfs", "app", "4/4"] for s in ("4", "9")], res.stdout
    step9 = os.path.join(pfs, "app", "step_0000000009")
    nbytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(step9, "node_*.h5")))
    from hpcckpt.cli import _size
    assert " ".join(lines[1][6:8]) == _size(nbytes) and "committed" in lines[1]

    res = cli("verify", pfs)
    assert res.returncode == 0 and "pfs: 2 of 2 steps intact" in res.stdout, res.stdout

    res = cli("inspect", pfs, 9)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "job 'app', step 9, epoch 1, level pfs" in res.stdout and "written by 4 ranks on 2 node(s)" in res.stdout
    table = {ln.split()[0]: ln.split()[1:] for ln in res.stdout.splitlines()
             if ln.split() and ln.split()[0] in ("u", "grid", "it")}
    assert table["u"] == ["<f8", "rank", "(1000,)", "on", "ranks", "0-3"]
    assert table["grid"] == ["<i4", "rank", "(3,", "5)", "on", "ranks", "0-3"]
    assert table["it"] == ["<i8", "rank", "()", "on", "ranks", "0-3"]
    assert cli("inspect", pfs, 5).returncode == 2

    _flip_block_byte(os.path.join(step9, "node_000001.h5"), "rank_000002/u")
    res = cli("verify", pfs)
    assert res.returncode == 1
    node_file = os.path.join(step9, "node_000001.h5")
    assert f"DAMAGED step 9 (pfs): {node_file}: array 'u' of rank 2 fails its checksum" in res.stdout, res.stdout
    assert "pfs: 1 of 2 steps intact; 1 DAMAGED" in res.stdout
    assert cli("verify", pfs, "--step", 4).returncode == 0


def test_list_verify_inspect_above_cache_and_pfs(pfs_checkpoints):
    root = pfs_checkpoints
    res = cli("list", root)
    assert res.returncode == 0, res.stderr
    assert [ln[:6] for ln in rows(res)] == [[s, "pfs", "1", where, "app", "4/4"]
                                           for s in ("4", "9") for where in ("cache", "pfs")], res.stdout
    res = cli("verify", root)
    assert res.returncode == 0 and "cache: 8 of 8 files intact; pfs: 2 of 2 steps intact" in res.stdout, res.stdout
    res = cli("inspect", root, 9)
    assert res.returncode == 0
    assert "level pfs (cache)" in res.stdout and "level pfs (" + os.path.join(root, "pfs") in res.stdout
    # the cache copy of one node lost: named, and the pfs copy of the same checkpoint is pointed at
    shutil.rmtree(os.path.join(root, "node0"))
    res = cli("verify", root, "--step", 9)
    assert res.returncode == 1
    assert "MISSING step 9 rank 0: no manifest under " + root + " (the pfs copy of this checkpoint holds it: " \
        + os.path.join(root, "pfs", "app", "step_0000000009") + ")" in res.stdout, res.stdout
    # a flipped byte in a node file is damage whichever directory verify is given
    _flip_block_byte(os.path.join(root, "pfs", "app", "step_0000000009", "node_000000.h5"), "rank_000001/grid")
    res = cli("verify", root, "--step", 9)
    assert res.returncode == 1 and "array 'grid' of rank 1 fails its checksum" in res.stdout


def test_list_ends_the_rows_of_two_runs_in_one_directory_with_their_trees(shm_dir):
    """Two runs of one job in separate trees under one directory: the rows of the same step and
    place (cache, pfs) end in the tree each is in (they differed only in their time, to the second)."""
    for run in ("run1", "run2"):
        res = run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, run, "node{node}"), "--steps", 10, "--every", 5,
                      "--level", "pfs", "--config-json", '{"ranks_per_node": 2}')
        assert res.returncode == 0, res
    res = cli("list", shm_dir)
    assert res.returncode == 0, res.stderr
    tails = [ln.rsplit("; in ", 1)[1] for ln in res.stdout.splitlines()[1:] if ln.strip()[:1].isdigit()]
    assert sorted(tails) == sorted(["run1", "run2", os.path.join("run1", "pfs"), os.path.join("run2", "pfs")] * 2), \
        res.stdout
    res = cli("list", os.path.join(shm_dir, "run1"))          # one tree: nothing to tell apart
    assert "; in " not in res.stdout and len(rows(res)) == 4, res.stdout


def test_inspect_shows_the_state_keys_of_a_state_dict_checkpoint(shm_dir):
    res = run_mpi(4, "sim_app.py", "--cache", os.path.join(shm_dir, "node{node}"),
                  "--pfs", os.path.join(shm_dir, "pfs"), "--no-restart", "--level", "pfs", "--steps", 10,
                  "--config-json", '{"ranks_per_node": 1}')
    assert res.returncode == 0, res
    res = cli("inspect", shm_dir, 9)
    assert res.returncode == 0, res.stdout + res.stderr
    cache_part, pfs_part = res.stdout.split("\n\n")
    # the state dict's document (FORMAT.md's __state__ entry) is not an array the user made: its keys
    # are listed instead (issue 41)
    assert "__state__" not in res.stdout and "state dict keys" in cache_part and "state dict keys" in pfs_part
    table = cache_part.split("state dict keys")[1].splitlines()[2:]
    keys = {ln.split()[0]: ln.split()[1:] for ln in table}
    assert set(keys) == {"u", "ids", "pos", "vel", "t", "step", "params", "rng", "scale", "history"}
    assert keys["u"] == ["block", "array", "u", "all"] and keys["t"] == ["replicated", "float", "all"]
    assert keys["history"] == ["root", "array", "history", "0"] and keys["params"][:2] == ["replicated", "dict"]
    index = json.load(open(os.path.join(shm_dir, "pfs", "sim", "step_0000000009", "COMMITTED.json")))
    line = next(ln for ln in pfs_part.splitlines() if ln.startswith("state dict keys: "))
    assert line == "state dict keys: " + ", ".join(f"{k} ({v})" for k, v in index["state_keys"].items())
    assert "u (block)" in line and "history (root)" in line
    assert "u                    <f8    block       (203,) global, in 4 block(s)" in pfs_part
