"""``incremental = true`` under real mpiexec: 4 ranks on 4 virtual nodes, keep = 1, 20 blocks of
4 KiB per rank plus a short last block (tests/mpi/apps/incr_app.py).

- chains with 0 %, 10 % and 100 % of the blocks changed between checkpoints (1, 2, 3): step 1 is
  full, steps 2 and 3 incremental against it (deltas hold only the changed blocks; 100 % is over
  incremental_max_changed, so every step is full); the base stays beyond keep; a node lost
  after step 3 is rebuilt bitwise from the incremental step (background on and off); `hpcckpt
  verify` checks the incremental copies and parity (base + delta) as intact;
- retention: with keep = 2 and incremental_full_every = 2 the kept steps and their base stay; a
  local checkpoint between two partner ones does not retire the base (keep = 1); after a restart
  the first checkpoint is full (a new base) and the old base goes;
- a base that vanished on one node before a checkpoint: that checkpoint is full, not an error;
- a damaged base (bytes flipped in the base's copy or parity) or a missing base (its step
  directory removed on the node that holds the redundancy), with a node lost: the incremental
  step cannot be rebuilt, and the restart falls back to the older pfs step 2, bitwise.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from harness import run_mpi

pytestmark = pytest.mark.mpi
NPROCS, BLOCK, BLOCKS = 4, 4096, 20


def app(cache, level, *args, config=None, expect_ok=True):
    cfg = {"ranks_per_node": 1, "group_size": 4, "rs_parity": 2, "keep": 1}
    cfg.update(config or {})
    res = run_mpi(NPROCS, "incr_app.py", "--cache", os.path.join(cache, "node{node}"), "--level", level,
                  "--block", BLOCK, "--blocks", BLOCKS, "--config-json", json.dumps(cfg), *args, timeout=120)
    assert (res.returncode == 0) == expect_ok, str(res)
    return res


def restarted(res):
    (step,) = res.lines("RESTART")
    (check,) = res.lines("CHECK")
    return (None if step == "None" else int(step)), check


def manifest(cache, node, step):
    (path,) = glob.glob(os.path.join(cache, f"node{node}", "app", f"step_{step:010d}", "rank_*.json"))
    return json.load(open(path))


def step_dirs(cache, node):
    return sorted(int(os.path.basename(p)[5:]) for p in glob.glob(os.path.join(cache, f"node{node}", "app", "step_*")))


def held(cache, node, step, name):
    return os.path.join(cache, f"node{node}", "app", f"step_{step:010d}", f"held_{node:06d}", name)


CASES = [("partner", 0.0, False, True), ("partner", 0.1, False, True), ("partner", 1.0, False, True),
         ("partner", 0.1, True, True), ("xor", 0.1, False, True), ("xor", 0.1, True, True), ("rs", 0.1, False, True),
         ("xor", 0.1, False, False)]


@pytest.mark.parametrize("level,frac,background,reuse", CASES)
def test_chain_then_node_lost(level, frac, background, reuse, tmp_path):
    """``reuse``: reuse_files; the xor/rs delta reads the changed blocks from the data files'
    kept mappings (with it) or with pread (without); step 3's delta overwrites step 2's (with it)."""
    cache = str(tmp_path / "cache")
    app(cache, level, "--ckpts", "1,2,3", "--frac", frac, config={"background": background, "reuse_files": reuse})
    incremental = frac <= 0.5
    for node in range(NPROCS):
        base = manifest(cache, node, 3).get("base")
        assert (base is not None and base["step"] == 1) == incremental
        # keep = 1: step 2 retired; step 1 stays as the base of step 3 only while step 3 is incremental
        assert step_dirs(cache, node) == ([1, 3] if incremental else [3])
    size = BLOCKS * BLOCK + 100                     # rank 0's data; node 1 holds rank 0's partner copy
    if level == "partner":
        delta = held(cache, 1, 3, "partner_000000.delta")
        if incremental:
            assert not os.path.exists(held(cache, 1, 3, "partner_000000.dat"))
            nbytes = os.path.getsize(delta)
            assert nbytes == 0 if frac == 0 else 0 < nbytes <= 2 * round(frac * 21) * BLOCK   # steps 2 and 3
        else:
            assert os.path.getsize(held(cache, 1, 3, "partner_000000.dat")) == size
    else:
        if incremental:
            assert not os.path.exists(held(cache, 0, 3, "parity.dat"))
            full = os.path.getsize(held(cache, 0, 1, "parity.dat"))
            nbytes = os.path.getsize(held(cache, 0, 3, "parity.delta"))
            assert nbytes == 0 if frac == 0 else 0 < nbytes < full
    if not incremental:
        return           # full steps: rebuilt as without incremental (test_redundancy, test_level_conformance)
    # hpcckpt verify rebuilds each incremental copy / parity in memory from its base and delta
    res = subprocess.run([sys.executable, "-m", "hpcckpt", "verify", "-v", cache], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and "DAMAGED" not in res.stdout, res.stdout + res.stderr
    shown = [ln.rsplit(": ", 1)[1] for ln in res.stdout.splitlines() if ln.split()[:3] == ["ok", "step", "3"]]
    assert shown and all(os.path.isfile(p) for p in shown), shown      # the delta files, not absent .dat files
    shutil.rmtree(os.path.join(cache, "node2"))
    res = app(cache, level, "--ckpts", "1,2,3", "--frac", frac, "--restart", config={"reuse_files": reuse})
    assert restarted(res) == (3, "ok"), str(res)


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_a_generator_state_in_the_state_dict_keeps_the_steps_incremental(level, tmp_path):
    """A state dict holding a generator's state, whose JSON length changes from step to step: the
    state document is padded (state.STATE_PAD), so the data size stays and every step after the
    first is incremental (before: each one full, for a size that changed by a byte); restored bitwise."""
    cache = str(tmp_path / "cache")
    app(cache, level, "--ckpts", "1,2,3,4", "--frac", 0.1, "--rng", config={"keep": 4})
    for node in range(NPROCS):
        assert [(manifest(cache, node, s).get("base") or {}).get("step") for s in (1, 2, 3, 4)] == [None, 1, 1, 1]
    shutil.rmtree(os.path.join(cache, "node2"))
    res = app(cache, level, "--ckpts", "1,2,3,4", "--frac", 0.1, "--rng", "--restart")
    assert restarted(res) == (4, "ok"), str(res)


@pytest.mark.parametrize("level,fault", [("partner", "damaged"), ("xor", "missing"), ("xor", "damaged")])
def test_bad_base_falls_back(level, fault, tmp_path):
    """Step 1 partner/xor (the base), step 2 pfs, step 3 incremental against step 1; node 2 lost
    and the base of the redundancy that would rebuild it damaged or missing: step 3 cannot be
    rebuilt, the restart falls back to the pfs step 2 (never to wrong data)."""
    cache = str(tmp_path / "cache")
    app(cache, level, "--ckpts", "1,2,3", "--pfs-at", 2)
    assert manifest(cache, 3, 3)["base"]["step"] == 1
    holder = 3 if level == "partner" else 0          # node 3 holds rank 2's copy; node 0 a parity with rank 2's data
    name = "partner_000002.dat" if level == "partner" else "parity.dat"
    if fault == "damaged":     # a byte in every block: some are not overwritten by the delta
        path = held(cache, holder, 1, name)
        raw = bytearray(open(path, "rb").read())
        for off in range(100, len(raw), BLOCK):
            raw[off] ^= 0x10
        open(path, "r+b").write(bytes(raw))
    else:
        shutil.rmtree(os.path.join(cache, f"node{holder}", "app", "step_0000000001"))
    res = subprocess.run([sys.executable, "-m", "hpcckpt", "verify", cache], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode != 0 and ".delta: incremental" in res.stdout, res.stdout + res.stderr
    shutil.rmtree(os.path.join(cache, "node2"))
    res = app(cache, level, "--ckpts", "1,2,3", "--pfs-at", 2, "--restart")
    assert restarted(res) == (2, "ok"), str(res)


def test_retention_full_every_and_keep(tmp_path):
    cache = str(tmp_path / "cache")
    app(cache, "partner", "--ckpts", "1,2,3,4,5,6", config={"keep": 2, "incremental_full_every": 2})
    # 1 full, 2 and 3 against 1, 4 full (after 2 incremental ones), 5 and 6 against 4
    assert [manifest(cache, 0, s).get("base", {}).get("step") for s in (4, 5, 6)] == [None, 4, 4]
    assert step_dirs(cache, 0) == [4, 5, 6]                # keep = 2: 5 and 6, and their base 4
    shutil.rmtree(os.path.join(cache, "node1"))
    res = app(cache, "partner", "--ckpts", "1,2,3,4,5,6", "--restart")
    assert restarted(res) == (6, "ok"), str(res)


def test_local_between_and_restart_then_full(tmp_path):
    cache = str(tmp_path / "cache")
    app(cache, "xor", "--ckpts", "1,2,3", "--local-at", 2)
    assert manifest(cache, 0, 3)["base"]["step"] == 1       # the base outlived the local step 2 (keep = 1)
    assert step_dirs(cache, 0) == [1, 3]
    res = app(cache, "xor", "--ckpts", "1,2,3,4,5", "--restart", "--more", "4,5")
    assert restarted(res) == (3, "ok"), str(res)
    assert "base" not in manifest(cache, 0, 4) and manifest(cache, 0, 5)["base"]["step"] == 4
    assert step_dirs(cache, 0) == [4, 5]                    # the old base 1 retired with step 3
    shutil.rmtree(os.path.join(cache, "node3"))
    res = app(cache, "xor", "--ckpts", "1,2,3,4,5", "--restart")
    assert restarted(res) == (5, "ok"), str(res)


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_base_gone_before_a_checkpoint_makes_it_full(level, tmp_path):
    cache = str(tmp_path / "cache")
    app(cache, level, "--ckpts", "1,2,3", "--drop-base-before", 3)
    assert "base" not in manifest(cache, 0, 3)               # full: rank 1 lacked the base's files
    assert step_dirs(cache, 0) == [3]                         # the new base; step 1 retired
    shutil.rmtree(os.path.join(cache, "node2"))
    res = app(cache, level, "--ckpts", "1,2,3", "--restart")
    assert restarted(res) == (3, "ok"), str(res)


@pytest.mark.parametrize("level,grow,reuse", [("partner", 100, True), ("partner", 2 * BLOCK + 7, True),
                                              ("partner", -BLOCK - 50, True), ("xor", 100, True),
                                              ("xor", 300, False), ("rs", -BLOCK - 50, True)])
def test_a_history_that_changes_size_on_one_rank_keeps_the_steps_incremental(level, grow, reuse, tmp_path):
    """Rank 0's state dict holds a history that grows (or shrinks) at every checkpoint; the other
    ranks' data keep their size. Steps 2 and 3 are incremental against step 1 on every rank (before:
    all full, for one rank's size change), rank 0's delta holds its changed blocks and the blocks
    after the shorter of the two sizes, not its whole data; `hpcckpt verify` rebuilds it; node 0
    lost: rank 0 is rebuilt from base + delta, bitwise. xor with +300 bytes: rank 0 becomes the
    group's largest, within the same pieces (and its delta is read with pread: reuse_files off)."""
    cache = str(tmp_path / "cache")
    app(cache, level, "--ckpts", "1,2,3", "--frac", 0.1, "--grow", grow, config={"reuse_files": reuse})
    for node in range(NPROCS):
        assert [(manifest(cache, node, s).get("base") or {}).get("step") for s in (1, 3)] == [None, 1]
    sizes = [manifest(cache, 0, s)["data_size"] for s in (1, 3)]
    assert (sizes[1] > sizes[0]) == (grow > 0) and sizes[0] != sizes[1]
    if level == "partner":
        nbytes = os.path.getsize(held(cache, 1, 3, "partner_000000.delta"))
        assert 0 < nbytes < sizes[1] // 2
        assert not os.path.exists(held(cache, 1, 3, "partner_000000.dat"))
    else:
        assert os.path.getsize(held(cache, 0, 3, "parity.delta")) < os.path.getsize(held(cache, 0, 1, "parity.dat"))
    res = subprocess.run([sys.executable, "-m", "hpcckpt", "verify", cache], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and "DAMAGED" not in res.stdout, res.stdout + res.stderr
    shutil.rmtree(os.path.join(cache, "node0"))
    res = app(cache, level, "--ckpts", "1,2,3", "--grow", grow, "--restart")
    assert restarted(res) == (3, "ok"), str(res)
