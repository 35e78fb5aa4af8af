"""The hpcckpt command on checkpoints written by a real MPI job: list, verify, inspect, exit codes."""
import glob
import os
import subprocess
import sys

import pytest

from harness import run_mpi

pytestmark = pytest.mark.mpi


def cli(*args):
    return subprocess.run([sys.executable, "-m", "hpcckpt", *map(str, args)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


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
    lines = [ln.split() for ln in res.stdout.splitlines()[1:]]
    assert [ln[0] for ln in lines] == ["4", "9"]
    assert all(ln[1] == "local" and ln[3] == "4/4" and "committed" in ln for ln in lines)
    one_node = cli("list", os.path.join(checkpoints, "node1"))
    assert "committed on 2 of 4 ranks here" in one_node.stdout


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
    assert res.returncode == 2 and "not a directory" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("level,held", [("partner", "partner_000002"), ("xor", "parity")])
def test_verify_checks_partner_copies_and_parity(level, held, shm_dir):
    run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--steps", 10, "--every", 5, "--level", level,
            "--config-json", '{"ranks_per_node": 1}')
    res = cli("verify", shm_dir, "--step", 9)
    assert res.returncode == 0 and "8 of 8 files intact" in res.stdout, res.stdout   # 4 ranks + 4 copies/parities
    victim = glob.glob(os.path.join(shm_dir, "node*", "app", "step_0000000009", "held_*", held + ".dat"))[0]
    with open(victim, "r+b") as f:
        f.write(b"\x99\x98")
    res = cli("verify", shm_dir, "--step", 9)
    assert res.returncode == 1 and ("partner copy" if level == "partner" else "(parity)") in res.stdout
