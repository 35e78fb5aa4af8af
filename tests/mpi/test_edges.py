"""Edges users hit, in real 4-rank jobs (tests/mpi/apps/edges_app.py): a protect()ed name the
application rebinds is refused on every rank (and an array held through a view is not); steps
of 10**10 and more are found, kept, retired and listed like the others; links planted at the
directories the library moves files into and out of are never followed."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from harness import run_mpi, snapshot

pytestmark = pytest.mark.mpi
RANKS = 4


def job(root, *args, config=None, expect_rc=0):
    res = run_mpi(RANKS, "edges_app.py", "--cache", os.path.join(root, "node{node}"), "--pfs",
                  os.path.join(root, "pfs"), "--config-json", json.dumps(config or {}), *args)
    if expect_rc is not None:
        assert res.returncode == expect_rc, str(res)
    assert res.stdout.count("DONE") == RANKS, str(res)
    return res


def lines(res, word):
    return [ln.split(" ", 3)[1:] for ln in res.stdout.splitlines() if ln.startswith(word + " ")]


def restarted(res):
    """The step every rank restarted from (the same on all), having found its array bitwise."""
    steps = {ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("RESTART ")}
    assert len(steps) == 1 and res.stdout.count("RESTART ") == RANKS, str(res)
    step = steps.pop()
    if step != "None":
        assert res.stdout.count("BITWISE") == RANKS and "WRONG" not in res.stdout, str(res)
    return None if step == "None" else int(step)


def cli(*args):
    res = subprocess.run([sys.executable, "-m", "hpcckpt", *map(str, args)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in res.stderr, res.stderr
    return res


# ---------------------------------------------------------------------- protect() and rebinding
MULTILEVEL = {"background": True, "incremental": True}


@pytest.mark.parametrize("mode", ["rebind", "rebind-on-2", "bcast"])
def test_a_protected_array_the_application_rebound_is_refused_on_every_rank(mode, shm_dir):
    """pos = pos + 1 (every rank, or rank 2 alone) or pos = comm.bcast(pos): the checkpoint at
    the step of the change raises a ProtectError naming the array on every rank, in a multilevel
    cycle with background and incremental redundancy; what was checkpointed before restarts bitwise."""
    res = job(shm_dir, "--mode", mode, "--until", 8, "--change-at", 5, config=MULTILEVEL)
    assert sorted(int(s) for s, _ in lines(res, "CKPT")) == sorted(list(range(5)) * RANKS), str(res)
    errs = lines(res, "ERR")
    assert len(errs) == RANKS and {step for step, _, _ in errs} == {"5"}, str(res)
    for _, cls, message in errs:
        assert cls == "ProtectError", message
        assert "'pos'" in message and "referenced by nothing but hpcckpt" in message and "state dict" in message
    if mode == "rebind-on-2":      # one rank's error, carried to all
        assert all("failed on rank 2:" in message and "more rank" not in message for _, _, message in errs), str(res)
    again = job(shm_dir, "--mode", mode, "--until", 8, "--change-at", 99, config=MULTILEVEL)
    assert restarted(again) == 4
    assert not lines(again, "ERR") and len(lines(again, "CKPT")) == 4 * RANKS


@pytest.mark.parametrize("mode", ["halo", "view"])
def test_an_array_held_through_a_view_is_not_refused(mode, shm_dir):
    """halo: protect(u), then the application keeps only u[1:-1] (which keeps u alive through
    .base); view: protect(u[1:-1]) while the application keeps u. No false alarm at any level of
    the cycle, and the restart is bitwise."""
    res = job(shm_dir, "--mode", mode, "--until", 8, "--change-at", 3, config=MULTILEVEL)
    assert not lines(res, "ERR") and len(lines(res, "CKPT")) == 9 * RANKS, str(res)
    again = job(shm_dir, "--mode", mode, "--until", 10, "--change-at", 99, config=MULTILEVEL)
    assert restarted(again) == 8
    assert not lines(again, "ERR") and len(lines(again, "CKPT")) == 2 * RANKS


# ---------------------------------------------------------------------- steps of 10**10 and more
def step_dirs(path):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "step_*")))


@pytest.mark.parametrize("level,steps", [
    ("local", [9999999998, 9999999999, 10000000000, 10000000001]),
    ("partner", [9999999999, 10000000000, 10000000001]),
    ("pfs", [9999999998, 9999999999, 10000000000, 10000000001]),
    ("local", [(1 << 40) - 3, (1 << 40) - 2, (1 << 40) - 1]),     # up to the largest step accepted
])
def test_steps_of_ten_digits_and_more_are_found_kept_and_retired(level, steps, shm_dir):
    res = job(shm_dir, "--mode", "steps", "--level", level, "--steps", ",".join(map(str, steps)))
    assert restarted(res) is None and len(lines(res, "CKPT")) == len(steps) * RANKS
    newest = [f"step_{s:010d}" for s in steps[-2:]]        # keep = 2
    for node in range(RANKS):
        assert step_dirs(os.path.join(shm_dir, f"node{node}", "edges")) == newest
    if level == "pfs":
        assert step_dirs(os.path.join(shm_dir, "pfs", "edges")) == newest
    again = job(shm_dir, "--mode", "steps", "--level", level, "--steps", str(steps[-1]))
    assert restarted(again) == steps[-1]

    listed = cli("list", shm_dir)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    shown = {ln.split()[0] for ln in listed.stdout.splitlines() if ln.strip()[:1].isdigit()}
    assert {str(s) for s in steps[-2:]} <= shown and not {str(s) for s in steps[:-2]} & shown, listed.stdout
    verified = cli("verify", shm_dir)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    inspected = cli("inspect", os.path.join(shm_dir, "pfs" if level == "pfs" else "node0"), steps[-1])
    assert inspected.returncode == 0 and f"step {steps[-1]}" in inspected.stdout, inspected.stdout + inspected.stderr


# ---------------------------------------------------------------------- links at the spare directories
LINKED = {   # the directory planted as a link, and the names of the files the library would move there
    "cache spare": (("node0", "edges", "spare"), ["rank_000000.dat", "held_000000_rank_000003.dat"]),
    "pfs spare": (("pfs", "edges", ".spare"), ["node_000000.h5", "node_000001.h5"]),
    "pfs trash": (("pfs", "edges", ".trash"), ["step_0000000004-0123456789ab"]),
}


@pytest.mark.parametrize("what", sorted(LINKED))
def test_links_planted_at_the_spare_and_trash_directories_are_not_followed(what, shm_dir):
    """A link to a directory outside the job, planted where retired files are kept for reuse or
    wait to be unlinked: the next run warns, replaces it with a directory of its own, never moves
    files out into it or in from it, and restarts bitwise."""
    outside = os.path.join(shm_dir, "outside")      # beside the job's directories, on the same file system
    os.makedirs(outside)
    where, names = LINKED[what]
    for name in names + ["precious.txt"]:
        with open(os.path.join(outside, name), "wb") as f:
            f.write(b"not yours" * 1000)
    level = "pfs" if where[0] == "pfs" else "partner"
    first = job(shm_dir, "--mode", "steps", "--level", level, "--steps", "1,2,3")
    assert restarted(first) is None
    link = os.path.join(shm_dir, *where)
    if os.path.isdir(link):
        shutil.rmtree(link)
    os.symlink(outside, link)
    before = snapshot(outside)
    res = job(shm_dir, "--mode", "steps", "--level", level, "--steps", "4,5,6,7")
    assert restarted(res) == 3
    assert snapshot(outside) == before, "a file outside the job's directories was touched"
    assert "symbolic link" in res.stderr and "not followed" in res.stderr, res.stderr
    assert not os.path.islink(link)
    again = job(shm_dir, "--mode", "steps", "--level", level, "--steps", "8")
    assert restarted(again) == 7
    assert snapshot(outside) == before
