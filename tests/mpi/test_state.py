"""State dicts under real mpiexec: an application that swaps buffers, migrates particles, keeps a
rank-0-only history, Python scalars and a NumPy Generator (tests/mpi/apps/sim_app.py) crashes and
restarts at the local, partner (node lost), xor (node lost) and pfs (other rank counts) levels,
and ends bitwise equal to a failure-free run. Mismatches name the values."""
import glob
import json
import os
import shutil

import numpy as np
import pytest

from harness import restart_step, run_mpi
from hpcckpt import state as st

pytestmark = pytest.mark.mpi
STEPS, EVERY, CRASH = 20, 5, 13        # checkpoints 4 and 9 are on disk when rank 1 dies at 13
TABLE_KIB = 2048


def sim(nprocs, root, *args, level="local", config=None, expect_rc=0, name="sim"):
    cfg = {"ranks_per_node": 1, "group_size": 4}
    cfg.update(config or {})
    res = run_mpi(nprocs, "sim_app.py", "--cache", os.path.join(root, "node{node}"), "--pfs", os.path.join(root, "pfs"),
                  "--name", name, "--steps", STEPS, "--every", EVERY, "--level", level,
                  "--config-json", json.dumps(cfg), *args, timeout=120)
    if expect_rc is not None:
        assert res.returncode == expect_rc, str(res)
    return res


def load(out):
    ranks = []
    for path in sorted(glob.glob(os.path.join(out, "rank_*.npz")), key=lambda p: int(p.split("_")[-1][:-4])):
        with np.load(path) as z:
            ranks.append({k: z[k] for k in z.files})
    return ranks


def per_rank_identical(a, b):
    assert len(a) == len(b)
    for r, (x, y) in enumerate(zip(a, b)):
        assert sorted(x) == sorted(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape and x[k].tobytes() == y[k].tobytes(), \
                f"rank {r}: {k!r} differs: WRONG DATA"


def global_view(ranks):
    """What does not depend on the decomposition: the assembled field, the particle set sorted by
    id, rank 0's history, and the replicated values."""
    u = np.concatenate([r["u"] for r in sorted(ranks, key=lambda r: int(r["lo"]))])
    ids = np.concatenate([r["ids"] for r in ranks])
    order = np.argsort(ids)
    pos = np.concatenate([r["pos"] for r in ranks])[order]
    vel = np.concatenate([r["vel"] for r in ranks])[order]
    view = {"u": u, "ids": ids[order], "pos": pos, "vel": vel, "history": ranks[0]["history"]}
    for k in ("t", "step", "scale", "rng"):
        values = {r[k].tobytes() for r in ranks}
        assert len(values) == 1, f"replicated {k!r} differs between ranks"
        view[k] = ranks[0][k]
    return view


def globally_identical(a, b):
    ga, gb = global_view(a), global_view(b)
    for k in ga:
        assert ga[k].dtype == gb[k].dtype and ga[k].shape == gb[k].shape and ga[k].tobytes() == gb[k].tobytes(), \
            f"{k!r} differs from the failure-free run: WRONG DATA"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Failure-free runs: 4 ranks (with and without a per-rank Generator, with a table), 3 ranks."""
    out = {}
    for key, n, extra in (("4", 4, ()), ("4-rng", 4, ("--per-rank-rng",)), ("3", 3, ()),
                          ("4-table", 4, ("--per-rank-rng", "--table-kib", TABLE_KIB))):
        root = str(tmp_path_factory.mktemp(f"ref{key}"))
        sim(n, root, "--no-restart", "--out", os.path.join(root, "out"), *extra)
        out[key] = load(os.path.join(root, "out"))
    return out


@pytest.fixture
def root(tmp_path):
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    path = os.path.join(base, f"hpcckpt-state-{os.getpid()}-{os.urandom(4).hex()}")
    os.makedirs(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_decomposition_does_not_change_the_result(reference):
    """The app's premise: 3 and 4 ranks compute the same global state, bit for bit."""
    globally_identical(reference["4"], reference["3"])


@pytest.mark.parametrize("level,lose_node", [("local", None), ("partner", 1), ("xor", 2)])
def test_crash_and_restart_bitwise(level, lose_node, root, reference):
    crashed = sim(4, root, "--crash-at", CRASH, "--per-rank-rng", level=level, expect_rc=None)
    assert crashed.returncode != 0 and "CKPT 9" in crashed.stdout, str(crashed)
    if lose_node is not None:
        shutil.rmtree(os.path.join(root, f"node{lose_node}"))
    res = sim(4, root, "--out", os.path.join(root, "out"), "--per-rank-rng", level=level)
    assert restart_step(res) == 9
    per_rank_identical(load(os.path.join(root, "out")), reference["4-rng"])


@pytest.mark.parametrize("level,lose_node", [("partner", 1), ("xor", 2)])
def test_incremental_steps_while_particles_and_the_history_change_length(level, lose_node, root, reference):
    """With a 2 MiB per-rank table first in the state dict (a sixteenth rewritten per step) and
    incremental = true (64 KiB blocks): step 9 is incremental against step 4 on every rank
    although the ranks' particle arrays and rank 0's history changed length (before: full),
    and after a crash and a lost node the run ends bitwise equal to a failure-free one."""
    cfg = {"incremental": True, "incremental_block": 65536}
    args = ("--per-rank-rng", "--table-kib", TABLE_KIB)
    crashed = sim(4, root, "--crash-at", CRASH, *args, level=level, config=cfg, expect_rc=None)
    assert crashed.returncode != 0 and "CKPT 9" in crashed.stdout, str(crashed)
    resized = []
    for node in range(4):
        (path,) = glob.glob(os.path.join(root, f"node{node}", "sim", "step_0000000009", "rank_*.json"))
        doc = json.load(open(path))
        assert doc.get("base", {}).get("step") == 4, doc.get("base")
        (path,) = glob.glob(os.path.join(root, f"node{node}", "sim", "step_0000000004", "rank_*.json"))
        resized.append(json.load(open(path))["data_size"] != doc["data_size"])
    assert resized[0], resized    # rank 0's history grew 5 rows since the base (other ranks: as migration had it)
    shutil.rmtree(os.path.join(root, f"node{lose_node}"))
    res = sim(4, root, "--out", os.path.join(root, "out"), *args, level=level, config=cfg)
    assert restart_step(res) == 9
    per_rank_identical(load(os.path.join(root, "out")), reference["4-table"])


@pytest.mark.parametrize("nprocs", [2, 3])
def test_pfs_restart_on_another_rank_count(nprocs, root, reference):
    crashed = sim(4, root, "--crash-at", CRASH, level="pfs", expect_rc=None)
    assert crashed.returncode != 0 and "CKPT 9" in crashed.stdout, str(crashed)
    for d in glob.glob(os.path.join(root, "node*")):
        shutil.rmtree(d)
    res = sim(nprocs, root, "--out", os.path.join(root, "out"), level="pfs")
    assert restart_step(res) == 9
    globally_identical(load(os.path.join(root, "out")), reference["4"])


def test_per_rank_value_on_another_rank_count_is_named(root):
    sim(4, root, "--per-rank-rng", "--steps", 10, level="pfs")
    for d in glob.glob(os.path.join(root, "node*")):
        shutil.rmtree(d)
    res = sim(3, root, "--per-rank-rng", level="pfs", expect_rc=3)
    errors = res.lines("ERROR")
    assert len(errors) == 3 and all(e.startswith("IncompatibleCheckpointError") and "'local_rng'" in e
                                    and "per rank" in e for e in errors), str(res)


def test_a_key_the_checkpoint_lacks_is_named_on_every_rank(root):
    sim(4, root, "--steps", 10)
    res = sim(4, root, "--extra-key", expect_rc=3)
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all(e.startswith("MismatchError") and "'extra'" in e for e in errors), str(res)


def test_replicated_values_that_differ_are_refused(root):
    res = sim(4, root, "--bad-replicated", "--no-restart", expect_rc=3)
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all(e.startswith("ProtectError") and "['params']" in e for e in errors), str(res)
    assert not glob.glob(os.path.join(root, "node*", "sim", "step_*", "rank_*.json")), "nothing committed"


def edge(root, case, *args, level="local"):
    res = run_mpi(4, "state_edge_app.py", "--cache", os.path.join(root, "node{node}"), "--pfs",
                  os.path.join(root, "pfs"), "--case", case, "--level", level, *args, timeout=120)
    assert res.returncode == 0, str(res)
    return res


@pytest.mark.parametrize("level", ["partner", "pfs"])
def test_numpy_strings_huge_ints_and_key_order_come_back_exactly(root, level):
    """np.str_/np.bytes_ with trailing NULs, a 19,000-bit int, unsorted dict keys: the node of
    rank 1 lost (partner) or every cache lost (pfs), and each value is back with its type."""
    assert edge(root, "values", level=level).lines("OK") == ["1"] * 4
    doomed = glob.glob(os.path.join(root, "node1" if level == "partner" else "node*"))
    assert doomed
    for d in doomed:
        shutil.rmtree(d)
    res = edge(root, "values", "--restore")
    assert res.lines("RESTART") == ["1"] * 4 and res.lines("MATCH") == [""] * 4, str(res)


@pytest.mark.skipif(not st.has_padding(np.dtype(np.longdouble)), reason="long double has no padding here (not x87)")
def test_replicated_long_doubles_compare_by_value_not_padding(root):
    """x87 long doubles keep 6 bytes of whatever was in memory beside their 80 bits: equal values
    declared REPLICATED are accepted though those bytes differ per rank; a value that differs on
    one rank is still refused on every rank; the pfs step restores the values."""
    res = edge(root, "replicated-padding", level="pfs")
    assert res.lines("OK") == ["1"] * 4, str(res)
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all(e.startswith("ProtectError") and "['x']" in e for e in errors), str(res)
    for d in glob.glob(os.path.join(root, "node*")):
        shutil.rmtree(d)
    res = edge(root, "replicated-padding", "--restore")
    assert res.lines("RESTART") == ["1"] * 4 and res.lines("MATCH") == [""] * 4, str(res)


def test_a_masked_array_on_one_rank_is_refused_on_every_rank(root):
    res = edge(root, "one-rank-masked")
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all(e.startswith("ProtectError") and "mask" in e for e in errors), str(res)
    assert res.lines("OK") == ["2"] * 4, "the application goes on and checkpoints again"


def test_restart_refuses_a_name_both_protected_and_in_the_state_dict(root):
    edge(root, "overlap")
    res = edge(root, "overlap", "--restore")
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all(e.startswith("ProtectError") and "['a']" in e for e in errors), str(res)
    assert not res.lines("TOUCHED")


@pytest.mark.parametrize("how", ["state", "protect"])
def test_a_rank_declaring_another_block_gets_that_block_or_an_error(tmp_path, how):
    """Blocks handed out in another order at a relaunch (same rank count): the pfs level restores
    each rank the block it declares now, also when the node caches are intact; a step that only
    the cache holds raises LayoutChangedError on every rank instead of giving each rank the block
    it wrote (wrong data); the blocks of the checkpoint still come back from the cache."""
    extra = ["--protect"] if how == "protect" else []

    def reblock(root, *args):
        res = run_mpi(3, "reblock_app.py", str(root), *args, *extra, timeout=120)
        assert res.returncode == 0, str(res)
        return [ln for ln in res.stdout.splitlines() if ln.strip()]

    pfs = tmp_path / "with-pfs"
    reblock(pfs, "save", "pfs")
    assert sorted(reblock(pfs, "load")) == [f"rank={r} step=3 match=1" for r in range(3)]
    cache_only = tmp_path / "cache-only"
    reblock(cache_only, "save", "local")
    lines = reblock(cache_only, "load")
    assert len(lines) == 3 and all(line.startswith("ERROR LayoutChangedError restart from step 3 failed on rank 0: step 3, array 'u'") for line in lines), lines
    assert sorted(reblock(cache_only, "load", "--same")) == [f"rank={r} step=3 match=1" for r in range(3)]
