"""One conformance test for every level of the registry (hpcckpt/levels/registry.py).

What a level promises follows from its spec alone, so a new level is tested here by being added
there: every level restarts bitwise after a process crash and keeps at most ``keep`` committed
steps; after a node is lost or one rank's newest data is damaged, a *redundant* level rebuilds the
same step from the other nodes, a *flushing* level restores it from the parallel file system,
and a level that is neither falls back (to the older step it still has everywhere, or to none).
4 ranks on 4 virtual nodes; app.py checkpoints at steps 4 and 9 and rank 3 is killed at step 12.
"""
import glob
import json
import os
import shutil

import pytest

from harness import outputs, restart_step, run_mpi
from hpcckpt.levels.registry import LEVELS, level_class

pytestmark = pytest.mark.mpi
NPROCS, STEPS, EVERY, CRASH = 4, 20, 5, 12        # committed: 4 and 9 (keep = 2)


def app(root, level, *args, expect_ok=True):
    cfg = {"ranks_per_node": 1, "group_size": 4, "rs_parity": 2, "keep": 2}
    res = run_mpi(NPROCS, "app.py", "--cache", os.path.join(root, "cache", "node{node}"), "--steps", STEPS,
                  "--every", EVERY, "--uneven", "--level", level, "--config-json", json.dumps(cfg), *args)
    assert (res.returncode == 0) == expect_ok, str(res)
    return res


def committed_cache_steps(root):
    """Steps with a committed manifest of some rank in some node's cache."""
    found = glob.glob(os.path.join(root, "cache", "node*", "app", "step_*", "rank_*.json"))
    return sorted({int(os.path.basename(os.path.dirname(p))[5:]) for p in found})


def committed_pfs_steps(root):
    return sorted(int(os.path.basename(os.path.dirname(p))[5:])
                  for p in glob.glob(os.path.join(root, "cache", "pfs", "app", "step_*", "COMMITTED.json")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    app(str(d), "local", "--out", str(d / "out"), "--no-restart")
    return outputs(str(d / "out"))


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """{level: a directory where a run of that level crashed at step 12} (made once, copied per case)."""
    made = {}

    def get(level):
        if level not in made:
            d = tmp_path_factory.mktemp(f"crashed-{level}")
            app(str(d), level, "--crash-at", CRASH, "--crash-rank", NPROCS - 1, expect_ok=False)
            made[level] = str(d)
        return made[level]
    return get


def lose_node(root, node):
    shutil.rmtree(os.path.join(root, "cache", f"node{node}"))


def damage_newest(root, rank):
    (path,) = glob.glob(os.path.join(root, "cache", "node*", "app", "step_0000000009", f"rank_{rank:06d}.dat"))
    with open(path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))


def expected_after_loss(level, older_everywhere):
    spec = level_class(level)
    if spec.redundant or spec.restores:
        return 9
    return 4 if older_everywhere else None


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("fault", ["crash", "node-lost", "damaged"])
def test_level_contract(level, fault, reference, crashed, tmp_path):
    root = str(tmp_path / "run")
    shutil.copytree(crashed(level), root)
    assert committed_cache_steps(root) == [4, 9]                       # keep = 2: the older ones retired
    if level_class(level).restores:
        assert committed_pfs_steps(root) == [4, 9]
    if fault == "crash":
        expected = 9
    elif fault == "node-lost":
        lose_node(root, NPROCS - 1)
        expected = expected_after_loss(level, older_everywhere=False)
    else:
        damage_newest(root, 1)
        expected = expected_after_loss(level, older_everywhere=True)
    res = app(root, level, "--out", os.path.join(root, "out"))
    assert restart_step(res) == expected, str(res)
    assert outputs(os.path.join(root, "out")) == reference           # bitwise, whatever the path
    # keep = 2 of this run (a run that restored nothing rewrote steps 4 and 9 under its own epoch)
    assert committed_cache_steps(root) == [14, 19]
