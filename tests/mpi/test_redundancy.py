"""Partner, XOR and Reed-Solomon levels under real mpiexec: lose nodes for real, restart bitwise.

Virtual nodes: ranks_per_node makes one host stand for several nodes, each with its own cache
directory (cache_dir = .../node{node}); losing a node = deleting its directory after a crash.
"""
import glob
import json
import os
import shutil

import pytest

from harness import outputs, restart_step, run_mpi

pytestmark = pytest.mark.mpi
STEPS, EVERY = 20, 5          # checkpoints at steps 4, 9, 14, 19; crash at 12 -> restart from 9


def app(nprocs, cache, level, *args, rpn=1, expect_ok=True, config=None, env=None):
    cfg = {"ranks_per_node": rpn, "group_size": 4, "rs_parity": 2}
    cfg.update(config or {})
    res = run_mpi(nprocs, "app.py", "--cache", os.path.join(cache, "node{node}"), "--steps", STEPS, "--every",
                  EVERY, "--uneven", "--level", level, "--config-json", json.dumps(cfg), *args, env=env)
    assert (res.returncode == 0) == expect_ok, str(res)
    return res


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    refs = {}
    for n in (4, 6, 8):
        d = tmp_path_factory.mktemp(f"ref{n}")
        app(n, str(d / "cache"), "local", "--out", str(d / "out"), "--no-restart")
        refs[n] = outputs(str(d / "out"))
    return refs


def lose_nodes(cache, *nodes):
    for n in nodes:
        shutil.rmtree(os.path.join(cache, f"node{n}"))


def crash_lose_restart(nprocs, rpn, level, cache, out, nodes, *args, **kw):
    app(nprocs, cache, level, "--crash-at", 12, "--crash-rank", nprocs - 1, *args, rpn=rpn, expect_ok=False, **kw)
    lose_nodes(cache, *nodes)
    return app(nprocs, cache, level, "--out", out, *args, rpn=rpn, **kw)


@pytest.mark.parametrize("level", ["partner", "xor", "rs"])
@pytest.mark.parametrize("nprocs,rpn", [(4, 1), (4, 2), pytest.param(6, 1, marks=pytest.mark.slow),
                                         pytest.param(6, 2, marks=pytest.mark.slow),
                                         pytest.param(8, 1, marks=pytest.mark.slow), (8, 2)])
def test_one_node_lost_is_rebuilt_bitwise(level, nprocs, rpn, shm_dir, tmp_path, references):
    res = crash_lose_restart(nprocs, rpn, level, shm_dir, tmp_path / "out", [1])
    assert restart_step(res) == 9, str(res)
    assert "rebuilt rank(s)" in res.stderr
    assert outputs(tmp_path / "out") == references[nprocs]


@pytest.mark.parametrize("level", ["xor", "rs"])
def test_a_job_with_small_arrays_never_loads_numba(level, shm_dir, tmp_path, references):
    # every array under codecs.xxh3.FUSED_MIN_BYTES and every parity buffer under
    # codecs.rs.KERNEL_MIN_BYTES: checksums, parity and the rebuild all run without Numba
    res = crash_lose_restart(4, 1, level, shm_dir, tmp_path / "out", [1, 2] if level == "rs" else [1],
                             "--report-numba")
    assert restart_step(res) == 9 and "rebuilt rank(s)" in res.stderr, str(res)
    assert outputs(tmp_path / "out") == references[4]
    assert sorted(res.lines("NUMBA")) == [f"rank={r} loaded=False" for r in range(4)], str(res)


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_retired_copies_and_parity_are_overwritten_and_still_restore_bitwise(level, shm_dir, tmp_path):
    # checkpoints at steps 4, 9, ..., 24 before the crash (keep 2): from step 19 on, each rank's
    # partner copy / parity overwrites the file retired with an older step (spare/held_*.dat).
    # Rank 3 is killed inside checkpoint 29, once every rank has entered it, so every rank has
    # retired step 14 by then (a crash between checkpoints raced with a slower rank's retire)
    app(4, str(tmp_path / "refcache"), "local", "--steps", 30, "--out", str(tmp_path / "ref"), "--no-restart")
    app(4, shm_dir, level, "--steps", 30, expect_ok=False, env={"_HPCCKPT_FAULT": "written:3:29"})
    spares = glob.glob(os.path.join(shm_dir, "node*", "app", "spare", "held_*.dat"))
    assert len(spares) == 4, spares
    lose_nodes(shm_dir, 1)
    res = app(4, shm_dir, level, "--steps", 30, "--out", tmp_path / "out")
    assert restart_step(res) == 24 and "rebuilt rank(s)" in res.stderr, str(res)
    assert outputs(tmp_path / "out") == outputs(tmp_path / "ref")


def test_xor_two_nodes_in_different_groups(shm_dir, tmp_path, references):
    # 8 ranks, one per node, groups of 4: {0..3} and {4..7}
    res = crash_lose_restart(8, 1, "xor", shm_dir, tmp_path / "out", [1, 6])
    assert restart_step(res) == 9 and outputs(tmp_path / "out") == references[8]


def test_xor_two_nodes_in_one_group_is_not_restored_wrongly(shm_dir, tmp_path, references):
    res = crash_lose_restart(8, 1, "xor", shm_dir, tmp_path / "out", [1, 2])
    assert restart_step(res) is None        # every step lost two symbols of a stripe: start over
    assert "cannot rebuild" in res.stderr
    assert outputs(tmp_path / "out") == references[8]


@pytest.mark.parametrize("nprocs,rpn,lost,expected", [
    (4, 1, [0, 2], 9),          # group of 4 with m = 2: two nodes lost -> rebuilt
    (4, 1, [0, 1, 3], None),    # m + 1 nodes lost -> not restorable, never wrong data
    (6, 1, [3, 5], 9),          # groups {0..3} (m=2) and {4,5} (m=1), one loss each plus one more in the first
    (8, 2, [1, 3], 9),          # two ranks per node: each group loses two ranks
])
def test_rs_m_and_more_nodes(nprocs, rpn, lost, expected, shm_dir, tmp_path, references):
    res = crash_lose_restart(nprocs, rpn, "rs", shm_dir, tmp_path / "out", lost)
    assert restart_step(res) == expected, str(res)
    assert outputs(tmp_path / "out") == references[nprocs]


def test_partner_node_and_its_partner_falls_back_not_wrongly(shm_dir, tmp_path, references):
    # 4 nodes, one rank each: rank 1's copy is held by rank 2; losing nodes 1 and 2 loses both
    res = crash_lose_restart(4, 1, "partner", shm_dir, tmp_path / "out", [1, 2])
    assert restart_step(res) is None and "cannot rebuild" in res.stderr
    assert outputs(tmp_path / "out") == references[4]


@pytest.mark.parametrize("level", ["partner", "xor", "rs"])
def test_damaged_data_file_is_rebuilt_from_redundancy(level, shm_dir, tmp_path, references):
    app(4, shm_dir, level, "--crash-at", 12, expect_ok=False, rpn=2)
    victim = glob.glob(os.path.join(shm_dir, "node1", "app", "step_0000000009", "rank_000003.dat"))[0]
    with open(victim, "r+b") as f:
        f.seek(200)
        f.write(b"\x55" * 4)
    res = app(4, shm_dir, level, "--out", tmp_path / "out", rpn=2)
    assert restart_step(res) == 9 and "rebuilt rank(s) [3]" in res.stderr
    assert outputs(tmp_path / "out") == references[4]


@pytest.mark.parametrize("level", ["xor", "rs"])
def test_damaged_parity_alone_does_not_block_restart(level, shm_dir, tmp_path, references):
    app(4, shm_dir, level, "--crash-at", 12, expect_ok=False, rpn=1)
    parity = os.path.join(shm_dir, "node2", "app", "step_0000000009", "held_000002", "parity.dat")
    with open(parity, "r+b") as f:
        f.write(b"\x01\x02")
    res = app(4, shm_dir, level, "--out", tmp_path / "out", rpn=1)
    assert restart_step(res) == 9 and outputs(tmp_path / "out") == references[4]


@pytest.mark.parametrize("level", ["partner", "xor", "rs"])
def test_redundancy_is_recreated_after_a_rebuild(level, shm_dir, tmp_path, references):
    """Lose node 1, rebuild, crash again before a new checkpoint, lose node 2: still restorable."""
    app(4, shm_dir, level, "--crash-at", 12, expect_ok=False, rpn=1)
    lose_nodes(shm_dir, 1)
    res = app(4, shm_dir, level, "--crash-at", 11, expect_ok=False, rpn=1)
    lose_nodes(shm_dir, 2)
    res = app(4, shm_dir, level, "--out", tmp_path / "out", rpn=1)
    assert restart_step(res) == 9, str(res)
    assert outputs(tmp_path / "out") == references[4]


def test_one_node_warns_at_startup(shm_dir):
    res = app(2, shm_dir, "xor", "--steps", 6, rpn=2, config={"schedule": {"xor": 5}})
    assert "cannot survive the loss of that node" in res.stderr
    assert res.stderr.count("cannot survive") == 1


def test_uneven_nodes_and_odd_rank_counts(shm_dir, tmp_path, references):
    """6 ranks, 4 per node: nodes of 4 and 2 ranks; losing the small node is rebuilt."""
    res = crash_lose_restart(6, 4, "xor", shm_dir, tmp_path / "out", [1])
    assert restart_step(res) == 9 and outputs(tmp_path / "out") == references[6]


@pytest.mark.parametrize("level,background", [("partner", False), ("rs", True)])
def test_local_steps_between_redundant_ones_do_not_push_out_the_one_a_node_loss_needs(level, background, shm_dir,
                                                                                       tmp_path, references):
    """A multilevel schedule, local every 2 steps, `level` every 7 (steps 6, 13), keep = 2: the
    newest redundant step (13) stays beside the two newest local ones (15, 17); a crash at 18
    and a lost node restart from it, rebuilt, bitwise (before: no step restorable, from scratch)."""
    config = {"policy": "fixed", "schedule": {"local": 2, level: 7}, "keep": 2, "background": background}
    app(4, shm_dir, "local", "--policy-loop", "--crash-at", 18, "--crash-rank", 3, config=config, expect_ok=False)
    steps = sorted(os.listdir(os.path.join(shm_dir, "node0", "app")))
    assert [s for s in steps if s.startswith("step_")] == ["step_0000000013", "step_0000000015", "step_0000000017"]
    lose_nodes(shm_dir, 1)
    res = app(4, shm_dir, "local", "--policy-loop", "--out", tmp_path / "out", config=config)
    assert restart_step(res) == 13, str(res)
    assert "rebuilt rank(s)" in res.stderr
    assert outputs(tmp_path / "out") == references[4]
