"""The node-local level under real mpiexec: crash, restart, faults at each phase, bad input."""
import glob
import json
import os

import pytest

from harness import outputs, restart_step, run_mpi

pytestmark = pytest.mark.mpi
STEPS, EVERY = 20, 5          # checkpoints at steps 4, 9, 14, 19


def app(nprocs, cache, *args, rpn=None, env=None, expect_rc=0, **kw):
    cfg = {"ranks_per_node": rpn} if rpn else {}
    cfg.update(kw.pop("config", {}))
    res = run_mpi(nprocs, "app.py", "--cache", os.path.join(cache, "node{node}"), "--steps", STEPS,
                  "--every", EVERY, "--uneven", "--config-json", json.dumps(cfg), *args, env=env, **kw)
    if expect_rc is not None:
        assert (res.returncode == 0) == (expect_rc == 0) and (expect_rc in (0, "nonzero") or res.returncode == expect_rc), str(res)
    return res


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Failure-free final arrays for 1, 2 and 4 ranks."""
    refs = {}
    for n in (1, 2, 4, 3):
        d = tmp_path_factory.mktemp(f"ref{n}")
        app(n, str(d / "cache"), "--out", str(d / "out"), "--no-restart")
        refs[n] = outputs(str(d / "out"))
        assert len(refs[n]) == 3 * n
    return refs


def data_files(cache, step):
    return sorted(glob.glob(os.path.join(cache, "node*", "app", f"step_{step:010d}", "rank_*.dat")))


@pytest.mark.parametrize("nprocs,rpn", [(1, None), (2, 1), (4, 2), (4, 1), (3, 2)])
def test_crash_then_bitwise_restart(nprocs, rpn, shm_dir, tmp_path, references):
    app(nprocs, shm_dir, "--crash-at", 12, "--crash-rank", nprocs - 1, rpn=rpn, expect_rc="nonzero")
    res = app(nprocs, shm_dir, "--out", tmp_path / "out", rpn=rpn)
    assert restart_step(res) == 9
    assert outputs(tmp_path / "out") == references[nprocs]


def test_write_methods_write_the_same_files_and_restart_each_other(shm_dir, tmp_path, references):
    """write_method mmap (one-pass copy and checksum into the mapped file) and pwrite write the
    same bytes and checksums; a checkpoint of either restarts bitwise under the other."""
    caches = {m: os.path.join(shm_dir, m) for m in ("mmap", "pwrite")}
    for method, cache in caches.items():
        app(4, cache, "--crash-at", 12, rpn=2, env={"HPCCKPT_WRITE_METHOD": method}, expect_rc="nonzero")
    files = {m: data_files(c, 9) for m, c in caches.items()}
    assert len(files["mmap"]) == 4
    assert [open(f, "rb").read() for f in files["mmap"]] == [open(f, "rb").read() for f in files["pwrite"]]

    def checksums(cache):
        return [[a["checksum"] for a in json.load(open(m))["arrays"]]
                for m in sorted(glob.glob(os.path.join(cache, "node*", "app", "step_0000000009", "rank_*.json")))]
    assert checksums(caches["mmap"]) == checksums(caches["pwrite"]) != []
    for method, other in (("mmap", "pwrite"), ("pwrite", "mmap")):
        res = app(4, caches[method], "--out", tmp_path / method, rpn=2, env={"HPCCKPT_WRITE_METHOD": other})
        assert restart_step(res) == 9
        assert outputs(tmp_path / method) == references[4]


def test_no_checkpoint_returns_none_and_leaves_arrays(shm_dir):
    res = app(2, shm_dir, "--steps", 3)   # the app asserts the arrays are untouched after None
    assert restart_step(res) is None


def test_retention_keeps_newest_two_and_a_spare_until_close(shm_dir):
    """keep = 2 and, while the job runs, one retired data file per rank to overwrite (reuse_files);
    close() removes the spares (a finished job keeps no checkpoint's worth of node memory)."""
    # steps 4, 9, 14; the crash once every rank has retired step 4 (it moves the data files to spare/)
    app(4, shm_dir, "--crash-at", 17, "--crash-rank", 0, "--crash-sync", rpn=2, expect_rc="nonzero")
    steps = sorted(os.path.basename(p) for p in glob.glob(os.path.join(shm_dir, "node0", "app", "step_*")))
    assert steps == ["step_0000000009", "step_0000000014"]
    assert len(glob.glob(os.path.join(shm_dir, "node*", "app", "spare", "rank_*.dat"))) == 4
    app(4, shm_dir, rpn=2)
    steps = sorted(os.path.basename(p) for p in glob.glob(os.path.join(shm_dir, "node0", "app", "step_*")))
    assert steps == ["step_0000000014", "step_0000000019"]
    assert glob.glob(os.path.join(shm_dir, "node*", "app", "spare", "*")) == []


def test_keep_from_environment(shm_dir):
    app(2, shm_dir, rpn=1, env={"HPCCKPT_KEEP": "1"})
    assert [os.path.basename(p) for p in glob.glob(os.path.join(shm_dir, "node1", "app", "step_*"))] == ["step_0000000019"]


@pytest.mark.parametrize("phase,expected", [
    ("write", {4}), ("written", {4}), ("commit", {4}), ("committed", {4, 9}), ("retire", {14}),
])
def test_kill_at_each_phase_keeps_a_restorable_checkpoint(phase, expected, shm_dir, tmp_path, references):
    step = 4 if phase == "retire" else 9   # retire: while removing step 4, after committing 14
    app(4, shm_dir, rpn=2, env={"_HPCCKPT_FAULT": f"{phase}:2:{step}"}, expect_rc="nonzero")
    res = app(4, shm_dir, "--out", tmp_path / "out", rpn=2)
    assert restart_step(res) in expected
    assert outputs(tmp_path / "out") == references[4]


def test_kill_while_restoring_then_restart_again(shm_dir, tmp_path, references):
    app(4, shm_dir, "--crash-at", 12, rpn=2, expect_rc="nonzero")
    app(4, shm_dir, rpn=2, env={"_HPCCKPT_FAULT": "restore:1:9"}, expect_rc="nonzero")
    res = app(4, shm_dir, "--out", tmp_path / "out", rpn=2)
    assert restart_step(res) == 9
    assert outputs(tmp_path / "out") == references[4]


def _crash_after_two(shm_dir):
    app(4, shm_dir, "--crash-at", 12, rpn=2, expect_rc="nonzero")
    return data_files(shm_dir, 9)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest-garbage", "manifest-delete",
                                    "manifest-symlink"])
def test_damaged_newest_checkpoint_falls_back(damage, shm_dir, tmp_path, references):
    files = _crash_after_two(shm_dir)
    victim = files[1]
    manifest = victim[:-4] + ".json"
    if damage == "flip":
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x40]))
    elif damage == "truncate":
        os.truncate(victim, os.path.getsize(victim) - 8)
    elif damage == "delete":
        os.unlink(victim)
    elif damage == "manifest-garbage":
        with open(manifest, "r+b") as f:
            f.seek(10)
            f.write(b"\x00garbage")
    elif damage == "manifest-delete":
        os.unlink(manifest)
    elif damage == "manifest-symlink":
        os.unlink(manifest)
        os.symlink(files[0][:-4] + ".json", manifest)
    res = app(4, shm_dir, "--out", tmp_path / "out", rpn=2)
    assert restart_step(res) == 4
    assert outputs(tmp_path / "out") == references[4]
    if damage in ("flip", "truncate"):
        assert "falling back" in res.stderr


def test_every_checkpoint_damaged_gives_none_and_untouched_arrays(shm_dir):
    _crash_after_two(shm_dir)
    for step in (4, 9):
        with open(data_files(shm_dir, step)[0], "r+b") as f:
            f.write(b"\xff" * 16)
    res = app(4, shm_dir, "--steps", 3, rpn=2)
    assert restart_step(res) is None


def test_mismatched_arrays_raise_on_every_rank(shm_dir):
    _crash_after_two(shm_dir)
    res = app(4, shm_dir, "--n", 999, "--expect-error", rpn=2, expect_rc=3)
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all(e.startswith("MismatchError") for e in errors), str(res)
    assert "array 'u'" in errors[0]


def test_other_world_size_is_refused_clearly(shm_dir):
    app(4, shm_dir, "--crash-at", 12, rpn=1, expect_rc="nonzero")
    res = app(2, shm_dir, "--expect-error", rpn=1, expect_rc=3)
    errors = res.lines("ERROR")
    assert len(errors) == 2 and all(e.startswith("IncompatibleCheckpointError") for e in errors), str(res)
    assert "written by 4 ranks" in errors[0]


def test_write_error_on_one_rank_raises_everywhere_and_previous_survives(shm_dir, tmp_path, references):
    res = app(4, shm_dir, "--tolerate-write-errors", "--steps", 12, rpn=2,
              env={"_HPCCKPT_FAULT": "write:3:9:error"})
    fails = res.lines("CKPTFAIL")
    assert len(fails) == 4 and all(f.startswith("9 CheckpointWriteError") for f in fails), str(res)
    assert "No space left" in fails[0]
    assert data_files(shm_dir, 9) == []          # no rank kept a piece of the failed step
    res = app(4, shm_dir, "--out", tmp_path / "out", rpn=2)   # the app goes on: 4 is still there
    assert restart_step(res) == 4
    assert outputs(tmp_path / "out") == references[4]


def test_commit_error_on_one_rank_leaves_no_partial_step(shm_dir):
    res = app(4, shm_dir, "--tolerate-write-errors", "--steps", 16, rpn=2,
              env={"_HPCCKPT_FAULT": "commit:0:9:error"})
    assert len(res.lines("CKPTFAIL")) == 4
    assert data_files(shm_dir, 9) == [] and len(data_files(shm_dir, 14)) == 4


def test_config_error_on_one_rank_raises_on_all(shm_dir):
    res = app(4, shm_dir, "--rank-config-json", '2:{"kepp": 3}', expect_rc=3)
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all(e.startswith("ConfigError") for e in errors), str(res)
    assert "kepp" in errors[0] and "rank 2" in errors[0]


def test_different_protected_names_raise_on_all(shm_dir):
    res = app(4, shm_dir, "--extra-array-on-rank", 1, expect_rc=3)
    errors = res.lines("ERROR")
    assert len(errors) == 4 and all("disagree on the protected array names" in e for e in errors), str(res)


def test_abandoned_run_is_not_mixed_in(shm_dir, tmp_path, references):
    """A run that never calls restart() starts a new history (a new epoch): the earlier run's
    higher steps are kept, not deleted, and restart() restores the new run's checkpoint."""
    app(4, shm_dir, rpn=2)                                    # steps 14, 19 on disk
    app(4, shm_dir, "--steps", 7, "--no-restart", rpn=2)      # new run: checkpoint 4 only
    steps = sorted(os.path.basename(p) for p in glob.glob(os.path.join(shm_dir, "node1", "app", "step_*")))
    assert steps == ["step_0000000004", "step_0000000014", "step_0000000019"]
    res = app(4, shm_dir, "--out", tmp_path / "out", rpn=2)
    assert restart_step(res) == 4
    assert outputs(tmp_path / "out") == references[4]


def test_files_are_private(shm_dir):
    app(2, shm_dir, rpn=1)
    f = data_files(shm_dir, 19)[0]
    assert os.stat(f).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(f)).st_mode & 0o777 == 0o700
