"""``background = true``: checkpoint() returns once the local level is committed; partner copies,
parity and the pfs flush are written by a background thread, and the level's marker (the manifest
at its level) is committed only when they are complete. Under real mpiexec, 4 ranks on 4 virtual
nodes, keep = 1 (so only the deferral of retirement keeps the previous redundant step):
- a node lost after the background work completed: the newest step is rebuilt, bitwise;
- a rank killed while the background work is in flight: the step is restorable at the local
  level; with that node lost too, the previous redundant step (still there) is rebuilt;
- a failure of the background work is raised at the next checkpoint on every rank, after that
  checkpoint was taken; with a node lost before then, the previous redundant step is rebuilt.
"""
import json
import os
import shutil

import pytest

from harness import npz_arrays, outputs, restart_step, run_mpi

pytestmark = pytest.mark.mpi
NPROCS = 4
REDUNDANT = ["partner", "xor", "rs"]


def app(root, level, *args, expect_ok=True, env=None, config=None):
    cfg = {"ranks_per_node": 1, "group_size": 4, "rs_parity": 2, "keep": 1, "background": True}
    cfg.update(config or {})
    res = run_mpi(NPROCS, "app.py", "--cache", os.path.join(root, "node{node}"), "--steps", 20, "--every", 5,
                  "--uneven", "--level", level, "--config-json", json.dumps(cfg), *args, env=env)
    assert (res.returncode == 0) == expect_ok, str(res)
    return res


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    app(str(d / "cache"), "local", "--out", str(d / "out"), "--no-restart", config={"background": False})
    return outputs(str(d / "out"))


@pytest.mark.parametrize("level", REDUNDANT + ["pfs"])
def test_node_lost_after_background_work_completed(level, reference, tmp_path):
    cache = str(tmp_path / "cache")
    app(cache, level, "--crash-at", 12, "--crash-rank", 3, "--wait-after", expect_ok=False)
    shutil.rmtree(os.path.join(cache, "node3"))
    res = app(cache, level, "--out", str(tmp_path / "out"))
    assert restart_step(res) == 9, str(res)
    assert outputs(str(tmp_path / "out")) == reference


@pytest.mark.parametrize("level", REDUNDANT)
@pytest.mark.parametrize("node_lost", [False, True])
def test_killed_while_background_work_in_flight(level, node_lost, reference, tmp_path):
    cache = str(tmp_path / "cache")
    app(cache, level, env={"_HPCCKPT_FAULT": "background:1:9:kill"}, expect_ok=False)
    if node_lost:
        shutil.rmtree(os.path.join(cache, "node1"))
    res = app(cache, level, "--out", str(tmp_path / "out"))
    # step 9 was committed at the local level only: restorable as such; without rank 1's node,
    # the previous redundant step (4, not retired although keep = 1) is rebuilt
    assert restart_step(res) == (4 if node_lost else 9), str(res)
    assert outputs(str(tmp_path / "out")) == reference



@pytest.mark.parametrize("level", ["partner", "rs"])
def test_a_relaunch_keeps_the_redundant_step_until_one_of_its_own_is_complete(level, reference, tmp_path):
    """Run 1 is killed while step 14's background work runs (14: local only; 9: the newest
    redundant step). Run 2 restarts from 14 and is killed while step 19's background work runs.
    Its restart and checkpoints must not retire step 9 (keep = 1): with a node lost now, run 3
    rebuilds step 9, bitwise (before: restart() retired it, and run 3 started from scratch)."""
    cache = str(tmp_path / "cache")
    app(cache, level, "--no-restart", env={"_HPCCKPT_FAULT": "background:3:14:kill"}, expect_ok=False)
    res = app(cache, level, env={"_HPCCKPT_FAULT": "background:2:19:kill"}, expect_ok=False)
    assert restart_step(res) == 14, str(res)
    shutil.rmtree(os.path.join(cache, "node2"))
    res = app(cache, level, "--out", str(tmp_path / "out"))
    assert restart_step(res) == 9 and "rebuilt rank(s) [2]" in res.stderr, str(res)
    assert outputs(str(tmp_path / "out")) == reference


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_background_failure_is_raised_at_the_next_checkpoint_on_every_rank(level, reference, tmp_path):
    cache = str(tmp_path / "cache")
    res = app(cache, level, "--tolerate-write-errors", "--out", str(tmp_path / "out"),
              env={"_HPCCKPT_FAULT": "background:2:9:error"})
    fails = res.lines("CKPTFAIL")
    assert len(fails) == NPROCS, str(res)
    assert all(f.startswith("14 CheckpointWriteError") and "background" in f and "step 14 was checkpointed" in f
               and "failed on rank 2:" in f and "rank 0" not in f for f in fails), fails     # names the rank that failed
    assert outputs(str(tmp_path / "out")) == reference
    # the failed step never got its level's marker; step 14 (taken all the same) and 19 did
    res = app(cache, level, "--no-restart", "--steps", 0)
    manifests = [os.path.join(cache, "node0", "app", f"step_{s:010d}", "rank_000000.json") for s in (9, 14, 19)]
    levels = [json.load(open(m))["level"] if os.path.exists(m) else None for m in manifests]
    assert levels == [None, None, level], levels      # keep = 1: only 19 remains, at its level


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_failed_background_work_leaves_the_previous_redundant_step_usable(level, reference, tmp_path):
    cache = str(tmp_path / "cache")
    # step 9's redundancy fails on rank 2; rank 1 is killed at step 12, before anyone is told
    app(cache, level, "--crash-at", 12, "--crash-rank", 1, env={"_HPCCKPT_FAULT": "background:2:9:error"},
        expect_ok=False)
    shutil.rmtree(os.path.join(cache, "node1"))
    res = app(cache, level, "--out", str(tmp_path / "out"))
    assert restart_step(res) == 4, str(res)          # step 9 never got its level's marker
    assert outputs(str(tmp_path / "out")) == reference


@pytest.mark.parametrize("level,how", [("partner", "no-close"), ("pfs", "no-close"), ("partner", "finalize-first")])
def test_an_application_that_never_closes_still_gets_its_last_step_made_redundant(level, how, tmp_path):
    """No close() (no with block), or MPI.Finalize() before close(): the last checkpoint (step
    19) returned with its background work in flight. The interpreter's exit, or MPI_Finalize,
    waits for that work, so step 19 is complete at its level: with node 1 lost (partner) or every
    cache lost (pfs) the relaunch restarts from 19, bitwise; rank 0 says what was wrong."""
    root = str(tmp_path / "cache")
    res = app(root, level, "--no-restart", f"--{how}", "--n", 400000)
    said = {"no-close": "was not closed: its background work was completed at exit",
            "finalize-first": "close() after MPI.Finalize(): any background work was completed"}[how]
    assert said in res.stderr, str(res)
    for d in [os.path.join(root, "node1")] if level == "partner" else [os.path.join(root, f"node{r}") for r in range(NPROCS)]:
        shutil.rmtree(d)
    res = app(root, level, "--out", str(tmp_path / "out"), "--n", 400000)
    assert restart_step(res) == 19, str(res)
    app(str(tmp_path / "ref-cache"), "local", "--out", str(tmp_path / "ref"), "--no-restart", "--n", 400000,
        config={"background": False})
    assert outputs(str(tmp_path / "out")) == outputs(str(tmp_path / "ref"))


CYCLE = ["--steps", 24, "--every", 2, "--level", "local,partner,local,xor", "--per-rank-rng", "--table-kib", 64]
CYCLE_CFG = {"ranks_per_node": 1, "group_size": 4, "keep": 2, "background": True, "incremental": True,
             "incremental_block": 4096}


def sim(root, *args, expect_ok=True, config=None):
    res = run_mpi(NPROCS, "sim_app.py", "--cache", os.path.join(root, "node{node}"), "--pfs", os.path.join(root, "pfs"),
                  *CYCLE, "--config-json", json.dumps({**CYCLE_CFG, **(config or {})}), *args)
    assert (res.returncode == 0) == expect_ok, str(res)
    return res


@pytest.fixture(scope="module")
def cycle_reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("cycle-ref")
    sim(str(d / "run"), "--no-restart", "--out", str(d / "out"), config={"background": False, "incremental": False})
    return npz_arrays(str(d / "out"))


@pytest.mark.parametrize("crash", [13, 15, 17, 19])
def test_a_node_lost_at_any_point_of_a_multilevel_cycle_restores_bitwise(crash, cycle_reference, tmp_path):
    """Levels cycled local, partner, local, xor every 2 steps, with background and incremental
    (4 KiB blocks) on, and the application's state changing where its particles go (sim_app:
    swapped buffers, migrating particles, rank 0's growing history, per-rank RNG): rank 1 killed
    at each point of the cycle (after a local, a partner, a local and an xor step), its node's
    cache lost; the relaunch rebuilds rank 1 from a partner or xor step (the newest whose
    background work completed), and the run ends bitwise equal to a failure-free one."""
    root = str(tmp_path / "run")
    sim(root, "--crash-at", crash, "--crash-rank", 1, expect_ok=False)
    shutil.rmtree(os.path.join(root, "node1"))
    res = sim(root, "--out", str(tmp_path / "out"), config={"log_level": "warning"})
    assert restart_step(res) is not None and "rebuilt rank(s) [1] from the" in res.stderr, str(res)
    assert cycle_reference and npz_arrays(str(tmp_path / "out")) == cycle_reference, str(res)
