"""The pfs level through the Checkpointer: restart from pfs, other rank counts, async flush, scavenge."""
import glob
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from harness import npz_arrays, outputs, restart_step, run_mpi

pytestmark = pytest.mark.mpi


def app(nprocs, cache, *args, expect_ok=True, config=None, env=None):
    cfg = {"ranks_per_node": 2}
    cfg.update(config or {})
    res = run_mpi(nprocs, "app.py", "--cache", os.path.join(cache, "node{node}"), "--steps", 20, "--every", 5,
                  "--uneven", "--config-json", json.dumps(cfg), *args, env=env)
    assert (res.returncode == 0) == expect_ok, str(res)
    return res


def lose_every_cache(root):
    for d in glob.glob(os.path.join(root, "node*")):
        shutil.rmtree(d)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    app(4, str(d / "c"), "--out", str(d / "out"), "--no-restart")
    return outputs(str(d / "out"))


@pytest.mark.parametrize("async_flush", [False, True])
def test_restart_from_pfs_after_every_cache_is_lost(async_flush, shm_dir, tmp_path, reference):
    cfg = {"async_flush": async_flush}
    app(4, shm_dir, "--level", "pfs", "--crash-at", 12, config=cfg, expect_ok=False)
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "pfs", "--out", tmp_path / "out", config=cfg,
              env={"HPCCKPT_LOG_LEVEL": "INFO"})
    # synchronous: step 9 is on pfs; async: 9 may still have been flushing at the crash (then 4)
    assert restart_step(res) in ({9} if not async_flush else {4, 9})
    assert "from pfs" in res.stderr
    assert outputs(tmp_path / "out") == reference


def test_restart_prefers_the_cache(shm_dir, tmp_path, reference):
    app(4, shm_dir, "--level", "pfs", "--crash-at", 12, expect_ok=False)
    res = app(4, shm_dir, "--level", "pfs", "--out", tmp_path / "out", env={"HPCCKPT_LOG_LEVEL": "INFO"})
    assert restart_step(res) == 9 and "from pfs" not in res.stderr
    assert outputs(tmp_path / "out") == reference


def test_crash_during_background_flush_keeps_previous_pfs_checkpoint(shm_dir, tmp_path, reference):
    cfg = {"async_flush": True}
    app(4, shm_dir, "--level", "pfs", config=cfg, expect_ok=False, env={"_HPCCKPT_FAULT": "pfs-write:1:9"})
    steps = sorted(os.path.basename(p) for p in glob.glob(os.path.join(shm_dir, "pfs", "app", "step_*")))
    assert "step_0000000004" in steps and "step_0000000009" not in steps
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "pfs", "--out", tmp_path / "out", config=cfg)
    assert restart_step(res) == 4
    assert outputs(tmp_path / "out") == reference


def test_background_flush_error_is_raised_on_every_rank(shm_dir):
    res = app(4, shm_dir, "--level", "pfs", "--tolerate-write-errors", "--steps", 12,
              config={"async_flush": True}, env={"_HPCCKPT_FAULT": "pfs-write:2:4:error"})
    fails = res.lines("CKPTFAIL")   # surfaced by the next checkpoint (step 9), on all ranks
    assert len(fails) == 4 and all("background pfs flush of step 4" in f and "failed on rank 2:" in f
                                   and "rank 0" not in f for f in fails), str(res)


def test_scavenge_copies_the_newest_cache_checkpoint(shm_dir, tmp_path, reference):
    res = app(4, shm_dir, "--level", "local", "--scavenge")
    assert res.lines("SCAVENGED") == ["19"]
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "local", "--scavenge", "--out", tmp_path / "out")
    assert restart_step(res) == 19 and res.lines("SCAVENGED") == ["None"]
    assert outputs(tmp_path / "out") == reference


def test_scavenge_with_the_wrong_name_or_rank_count_is_an_error_not_nothing_to_copy(shm_dir):
    """`hpcckpt scavenge` run with settings that do not match the application's finds the cache's
    checkpoints unusable: exit 2 naming why (the job template then keeps the cache), never
    "nothing to copy" with exit 0. An empty cache is nothing to copy; the right settings copy."""
    def scavenge(n, *args):
        return run_mpi(n, "cli_app.py", "scavenge", "--cache-dir", os.path.join(shm_dir, "node{node}"),
                       "--pfs-dir", os.path.join(shm_dir, "pfs"), "--ranks-per-node", "2", *args)
    res = scavenge(4, "--name", "app")
    assert res.returncode == 0 and "nothing to copy" in res.stdout, str(res)          # nothing there yet
    app(4, shm_dir, "--level", "local", "--crash-at", 12, expect_ok=False)          # local steps 4, 9
    res = scavenge(4, "--name", "other")
    assert res.returncode == 2 and "other job names: app" in res.stderr and "copied" not in res.stdout, str(res)
    res = scavenge(2, "--name", "app")
    assert res.returncode == 2 and "not usable (incompatible" in res.stderr and "4 ranks" in res.stderr, str(res)
    res = scavenge(4, "--name", "app")
    assert res.returncode == 0 and "copied step 9" in res.stdout, str(res)


def test_other_world_size_without_global_layout_is_refused(shm_dir):
    app(4, shm_dir, "--level", "pfs", "--crash-at", 12, expect_ok=False)
    res = run_mpi(2, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--uneven", "--expect-error",
                  "--config-json", '{"ranks_per_node": 1}')
    errors = res.lines("ERROR")
    assert res.returncode == 3 and len(errors) == 2, str(res)
    assert all(e.startswith("IncompatibleCheckpointError") for e in errors)


def elastic(nprocs, cache, *args):
    res = run_mpi(nprocs, "elastic_app.py", "--cache", os.path.join(cache, "node{node}"), *args)
    return res


@pytest.fixture(scope="module")
def elastic_reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("eref")
    res = elastic(4, str(d / "c"), "--out", str(d / "ref.npy"))
    assert res.returncode == 0, str(res)
    return np.load(d / "ref.npy")


@pytest.mark.parametrize("before,after", [(4, 2), (4, 3), (4, 6), (6, 4)])
def test_restart_on_another_rank_count(before, after, shm_dir, tmp_path, elastic_reference):
    res = elastic(before, shm_dir, "--crash-at", 9)
    assert res.returncode != 0
    res = elastic(after, shm_dir, "--out", tmp_path / "f.npy")   # same cache dirs: the old ones are ignored
    assert res.returncode == 0, str(res)
    assert res.lines("RESTART") == ["7"]
    assert np.load(tmp_path / "f.npy").tobytes() == elastic_reference.tobytes()


@pytest.mark.parametrize("after", [2, 6])
def test_a_relaunch_on_another_rank_count_takes_the_pfs_step_when_the_caches_hold_newer_ones(after, shm_dir, tmp_path,
                                                                                            elastic_reference):
    """Local checkpoints between the pfs ones: the node caches hold step 8 of 4 ranks, newer than
    the pfs step 7. A relaunch on another rank count restarts from step 7 (a warning names step
    8), replaces the old step 8 when it checkpoints step 8 itself, and ends bitwise equal."""
    res = elastic(4, shm_dir, "--crash-at", 9, "--local-between")
    assert res.returncode != 0
    res = elastic(after, shm_dir, "--local-between", "--out", tmp_path / "f.npy")
    assert res.returncode == 0, str(res)
    assert res.lines("RESTART") == ["7"] and "restarted from step 7" in res.stderr, str(res)
    assert "step_0000000008/rank_000000.json: step 8 was written by 4 ranks" in res.stderr, str(res)
    assert np.load(tmp_path / "f.npy").tobytes() == elastic_reference.tobytes()


def test_stop_signal_takes_a_final_pfs_checkpoint_then_exits(shm_dir, tmp_path, reference):
    """What SLURM's --signal=B:USR1@T does, without SLURM: rank 1 gets SIGUSR1 after step 7; every rank
    takes a pfs checkpoint at the same step and stops; the next run restarts from it."""
    cfg = {"stop_signals": ["USR1"], "policy": "fixed", "schedule": {"local": 5}}
    res = app(4, shm_dir, "--policy-loop", "--signal-at", 7, config=cfg)
    stopped = res.lines("STOPPED")
    assert len(stopped) == 1 and int(stopped[0]) in (7, 8), str(res)
    assert f"CKPT {stopped[0]} pfs" in res.stdout
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--policy-loop", "--out", tmp_path / "out", config=cfg)
    assert restart_step(res) == int(stopped[0])
    assert outputs(tmp_path / "out") == reference


def node_file_contents(pfs_step):
    """{(file, rank group, array): (bytes, checksum attribute)} of a pfs step's node files, and
    the checksums of its index."""
    import h5py
    out = {}
    for path in sorted(glob.glob(os.path.join(pfs_step, "node_*.h5"))):
        with h5py.File(path, "r") as f:
            for group in f.values():
                for name, ds in group.items():
                    out[(os.path.basename(path), group.name, name)] = (ds[()].tobytes(), ds.attrs["checksum"])
    with open(os.path.join(pfs_step, "COMMITTED.json")) as f:
        index = json.load(f)
    return out, json.dumps(index["index"]["arrays"] if "index" in index else index["arrays"], sort_keys=True)


@pytest.mark.parametrize("direct_io", [True, False])
def test_sync_pfs_large_uneven_arrays_restore_bitwise(direct_io, shm_dir, tmp_path):
    """Arrays of 1.6 MB and odd sizes (a 4 KiB-aligned part with direct I/O, laid out before the
    cache write and filled while it copies, then a tail): restart from pfs alone is bitwise, and
    the pfs files hold the same bytes and checksums as without direct I/O."""
    args = ("--n", 200000, "--level", "pfs")
    app(4, str(tmp_path / "ref"), *args, "--steps", 10, "--no-restart", config={"pfs_direct_io": not direct_io})
    app(4, str(tmp_path / "ref2"), *args, "--out", tmp_path / "ref_out", "--no-restart")
    app(4, shm_dir, *args, "--crash-at", 12, config={"pfs_direct_io": direct_io}, expect_ok=False)
    step9 = os.path.join(shm_dir, "pfs", "app", "step_0000000009")
    other9 = os.path.join(tmp_path, "ref", "pfs", "app", "step_0000000009")
    ours, theirs = node_file_contents(step9), node_file_contents(other9)
    assert ours[0].keys() == theirs[0].keys() and len(ours[0]) >= 12
    assert ours[0] == theirs[0] and ours[1] == theirs[1]
    assert all(checksum for _, checksum in ours[0].values())
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, *args, "--out", tmp_path / "out", config={"pfs_direct_io": direct_io},
              env={"HPCCKPT_LOG_LEVEL": "INFO"})
    assert restart_step(res) == 9 and "from pfs" in res.stderr
    assert outputs(tmp_path / "out") == outputs(tmp_path / "ref_out")


def test_retired_node_files_are_overwritten_and_removed_at_close(shm_dir, tmp_path, reference):
    """reuse_files: a retired pfs step's node file becomes its node's spare and the next pfs
    step overwrites it (same layout); a crash leaves the spares, which never count as a
    checkpoint; the restart is bitwise; close() removes them. A spare the relaunch did not write
    (left by the crash; here also of another layout: larger arrays) is not reused: a new file
    is made."""
    res = app(4, shm_dir, "--level", "pfs", "--steps", 30, "--crash-at", 27, "--crash-sync", expect_ok=False,
              env={"HPCCKPT_LOG_LEVEL": "DEBUG"})
    overwritten = [ln for ln in res.stderr.splitlines() if "overwriting the retired node file" in ln]
    assert len(overwritten) >= 2 * 2, str(res)        # both aggregators, from the 4th pfs step on
    spares = os.path.join(shm_dir, "pfs", "app", ".spare")
    assert sorted(os.listdir(spares)) == ["node_000000.h5", "node_000001.h5"]
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "pfs", "--out", tmp_path / "out", env={"HPCCKPT_LOG_LEVEL": "DEBUG"})
    assert restart_step(res) == 24 and outputs(tmp_path / "out") != {}
    assert not os.path.exists(spares)
    res = app(4, shm_dir, "--level", "pfs", "--steps", 45, "--crash-at", 42, expect_ok=False)
    assert os.listdir(spares)
    res = app(4, shm_dir, "--level", "pfs", "--steps", 20, "--n", 1200, "--crash-at", 17,
              env={"HPCCKPT_LOG_LEVEL": "DEBUG"}, expect_ok=False, config={"start": "fresh"})
    assert "is not a node file this process wrote, intact: not reusing" in res.stderr, str(res)
    assert "CKPT 14 pfs" in res.stdout, str(res)
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "pfs", "--steps", 20, "--n", 1200, "--out", tmp_path / "out2")
    assert restart_step(res) == 14


def test_a_spare_of_another_layout_is_laid_out_anew_and_overwritten(shm_dir, tmp_path):
    """Particles migrate every step and rank 0's history grows (sim_app): each pfs step's node
    files hold arrays of other lengths than the retired one. The spare is reused all the same
    (before: a new file each time, about twice as slow): HDF5's metadata of a new file written
    over it. Its node files are byte for byte those of a run that writes new files (nothing
    retired: no spare), but for the checkpoint id; `hpcckpt verify` finds them intact, and the restart is bitwise equal to a failure-free run."""
    common = ["--steps", 30, "--every", 5, "--level", "pfs"]
    cfg = {"ranks_per_node": 2}
    ref = run_mpi(4, "sim_app.py", "--cache", os.path.join(shm_dir, "ref", "node{node}"), "--pfs",
                  os.path.join(shm_dir, "ref", "pfs"), "--no-restart", "--out", tmp_path / "ref", *common,
                  "--config-json", json.dumps(dict(cfg, keep=8)))     # keep 8: nothing retires, new files
    assert ref.returncode == 0, str(ref)
    cache, pfs = os.path.join(shm_dir, "c", "node{node}"), os.path.join(shm_dir, "c", "pfs")
    res = run_mpi(4, "sim_app.py", "--cache", cache, "--pfs", pfs, "--crash-at", 27, *common,
                  "--config-json", json.dumps(dict(cfg, log_level="DEBUG")))
    assert res.returncode != 0 and "another layout: laid out anew and overwriting" in res.stderr, str(res)
    assert "not reusing" not in res.stderr, str(res)
    # node 0 (rank 0's history grows) laid its step 24 out over a retired file; the ref's is new
    assert "rank 0: pfs step 24: another layout: laid out anew and overwriting" in res.stderr, str(res)
    name = "step_0000000024/node_000000.h5"
    ours, theirs = (node_file_bytes_but_ckpt_id(os.path.join(root, "sim", name))
                    for root in (pfs, os.path.join(shm_dir, "ref", "pfs")))
    assert ours == theirs
    verify = subprocess.run([sys.executable, "-m", "hpcckpt", "verify", pfs], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    assert verify.returncode == 0 and "DAMAGED" not in verify.stdout, verify.stdout + verify.stderr
    lose_every_cache(os.path.join(shm_dir, "c"))
    res = run_mpi(4, "sim_app.py", "--cache", cache, "--pfs", pfs, "--out", tmp_path / "out", *common,
                  "--config-json", json.dumps(cfg))
    assert restart_step(res) == 24, str(res)
    assert npz_arrays(tmp_path / "ref") and npz_arrays(tmp_path / "out") == npz_arrays(tmp_path / "ref")


def node_file_bytes_but_ckpt_id(path):
    """The bytes of a node file with its checkpoint id (random, one per run) blanked out."""
    with h5py.File(path, "r") as f:
        ckpt_id = f.attrs["ckpt_id"]
    ckpt_id = ckpt_id.encode() if isinstance(ckpt_id, str) else bytes(ckpt_id)
    raw = open(path, "rb").read()
    assert raw.count(ckpt_id) >= 1
    return raw.replace(ckpt_id, b"#" * len(ckpt_id))


def test_pfs_restart_from_overwritten_files_is_bitwise(shm_dir, tmp_path, reference):
    res = app(4, shm_dir, "--level", "pfs", "--steps", 30, "--crash-at", 22, expect_ok=False,
              env={"HPCCKPT_LOG_LEVEL": "DEBUG"})
    assert "overwriting the retired node file" in res.stderr, str(res)
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "pfs", "--out", tmp_path / "out", env={"HPCCKPT_LOG_LEVEL": "INFO"})
    assert restart_step(res) == 19 and "from pfs" in res.stderr
    assert outputs(tmp_path / "out") == reference


@pytest.mark.parametrize("action", ["error", "interrupt"])
def test_a_node_file_that_cannot_be_laid_out_fails_the_sync_step_on_every_rank_before_it_commits(
        action, shm_dir, tmp_path, reference):
    """Sync pfs steps with new files (the node files laid out before the cache write, which
    hands them the bytes): node 1's aggregator (rank 2) fails to lay out its node file at step
    4. Nothing waits for it in begin(); its error is raised in the cache write's agreement, so
    every rank raises there (the CheckpointWriteError of rank 2; a KeyboardInterrupt there is
    rank 2's, which aborts the job, and a CollectiveError on the others, which the abort may end
    before they print it), step 4 is committed nowhere (no manifest in any cache, no pfs step,
    no temporary directory left, or after the abort none once the job is launched again), and
    the pfs steps of the job restore bitwise once every cache is lost."""
    cfg = {"reuse_files": False}
    res = app(4, shm_dir, "--level", "pfs", "--tolerate-write-errors", config=cfg, expect_ok=action == "error",
              env={"_HPCCKPT_FAULT": f"pfs-layout:2:4:{action}"})
    if action == "error":
        fails = res.lines("CKPTFAIL")
        assert sorted(f.split()[2] for f in fails) == [f"rank={r}" for r in range(4)], str(res)
        assert all(f.startswith("4 CheckpointWriteError ") and "writing checkpoint 4 failed on rank 2: cannot create"
                   in f and "(injected fault)" in f for f in fails), str(res)
    else:   # rank 2's KeyboardInterrupt aborts the job; a rank that printed before the abort had a CollectiveError
        assert "KeyboardInterrupt: injected at pfs-layout" in res.stderr + res.stdout, str(res)   # its report or theirs
        fails = res.lines("CKPTFAIL")
        assert all(f.startswith("4 CollectiveError ") and "failed on rank 2" in f and "rank=2" not in f
                   for f in fails), str(res)
    manifests = glob.glob(os.path.join(shm_dir, "node*", "app", "step_0000000004", "*.json"))
    assert manifests == [], manifests
    pfs_root = os.path.join(shm_dir, "pfs", "app")
    if action == "error":
        assert not glob.glob(os.path.join(pfs_root, "step_0000000004*")), os.listdir(pfs_root)
    else:   # the abort may end rank 0 before it removes step_4's temporary directory; the relaunch sweeps it
        assert not os.path.exists(os.path.join(pfs_root, "step_0000000004")), os.listdir(pfs_root)
        res = app(4, shm_dir, "--level", "pfs", config=cfg)
        assert restart_step(res) is None, str(res)
        assert not glob.glob(os.path.join(pfs_root, "*.tmp-*")), os.listdir(pfs_root)
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "pfs", "--out", tmp_path / "out", config=cfg)
    assert restart_step(res) == 19
    assert outputs(tmp_path / "out") == reference


def test_a_node_file_that_cannot_be_laid_out_fails_the_background_flush_on_every_rank(shm_dir, tmp_path, reference):
    """The same fault in a pfs flush that runs in the background (``background = true``, new
    files): begin() does not agree on the layout, so the ranks of node 1 learn of rank 2's error
    only in finish(); every rank must still reach every collective call of finish() (rank 3 waits
    for its aggregator in the node's own) and raise the error at its next call, and no pfs step 4
    is committed. The local step 4 is, and the steps after it flush as usual."""
    cfg = {"reuse_files": False, "background": True}
    res = app(4, shm_dir, "--level", "pfs", "--tolerate-write-errors", config=cfg,
              env={"_HPCCKPT_FAULT": "pfs-layout:2:4:error"})
    fails = res.lines("CKPTFAIL")
    assert len(fails) == 4 and all(f.startswith("9 CheckpointWriteError ") and "rank 2" in f and "cannot create" in f
                                   for f in fails), str(res)
    pfs_root = os.path.join(shm_dir, "pfs", "app")
    assert not glob.glob(os.path.join(pfs_root, "step_0000000004*")), os.listdir(pfs_root)
    lose_every_cache(shm_dir)
    res = app(4, shm_dir, "--level", "pfs", "--out", tmp_path / "out", config=cfg)
    assert restart_step(res) == 19
    assert outputs(tmp_path / "out") == reference
