"""Hostile and bad input: crafted manifests, HDF5 files and links; bad arguments and config.

Each gets a specific HpcCkptError (or a CLI exit status with a one-line message): no traceback
from deep inside, no file touched outside the configured directories, nothing unpickled. Most
cases run in this process on MPI.COMM_SELF (a restart of one rank reads exactly what a rank of a
real job reads); the CLI runs as a subprocess.
"""
import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hpcckpt
from hpcckpt import errors, manifest as mf
from harness import snapshot
from reliability import expected_state, record

pytestmark = pytest.mark.mpi
HERE = os.path.dirname(os.path.abspath(__file__))


def make(root, **kw):
    from mpi4py import MPI
    args = dict(name="app", cache_dir=os.path.join(root, "node{node}"), pfs_dir=os.path.join(root, "pfs"),
                ranks_per_node=1, log_level="ERROR")
    args.update(kw)
    return hpcckpt.Checkpointer(MPI.COMM_SELF, **args)


def arrays():
    return (np.arange(1000, dtype=np.float64), np.full((3, 5), 0, np.int32), np.zeros((), np.int64))


def write_steps(root, steps=(1,), level="local", **kw):
    with make(root, **kw) as ck:
        u, grid, it = arrays()
        for name, a in zip(("u", "grid", "it"), (u, grid, it)):
            ck.protect(name, a)
        for step in range(max(steps) + 1):
            u *= 1.0001
            u += np.sin(u[:1]) + step
            grid += step % 7
            it[...] = step
            if step in steps:
                ck.checkpoint(step, level=level)


def restart(root, **kw):
    u, grid, it = arrays()
    with make(root, **kw) as ck:
        for name, a in zip(("u", "grid", "it"), (u, grid, it)):
            ck.protect(name, a)
        step = ck.restart()
    if step is not None:
        for g, w in zip((u, grid, it), expected_state(0, step)):
            assert g.tobytes() == np.asarray(w).tobytes(), "WRONG DATA"
    return step


@pytest.fixture
def env(tmp_path):
    root = str(tmp_path / "c")
    outside = str(tmp_path / "outside")
    os.makedirs(outside)
    with open(os.path.join(outside, "precious.txt"), "w") as f:
        f.write("not yours")
    write_steps(root, (1,))
    before = snapshot(outside)
    yield root, outside
    after = snapshot(outside)
    assert all(after.get(k) == v for k, v in before.items()), "a file outside the configured directories was touched"


def step_dir(root, step):
    return os.path.join(root, "node0", "app", f"step_{step:010d}")


def good_manifest(root):
    with open(os.path.join(step_dir(root, 1), "rank_000000.json")) as f:
        return json.load(f)


def plant(root, step, doc=None, raw=None, data=True):
    d = step_dir(root, step)
    os.makedirs(d, exist_ok=True)
    if data:
        shutil.copy(os.path.join(step_dir(root, 1), "rank_000000.dat"), os.path.join(d, "rank_000000.dat"))
    with open(os.path.join(d, "rank_000000.json"), "wb") as f:
        f.write(raw if raw is not None else json.dumps(doc).encode())


def crafted(root, change):
    doc = good_manifest(root)
    doc["step"] = 5
    change(doc)
    return mf.sign(doc)   # an attacker can recompute the self-checksum: what follows must still hold


MANIFEST_ATTACKS = {
    "data_file with ../": lambda d: d.update(data_file="../../../outside/precious.txt"),
    "absolute data_file": lambda d: d.update(data_file="/etc/passwd"),
    "array name with ../": lambda d: d["arrays"][0].update(name="../../x"),
    "absurd shape": lambda d: d["arrays"][0].update(shape=[1 << 40, 1 << 40]),
    "negative offset": lambda d: d["arrays"][0].update(offset=-64),
    "offset past the file": lambda d: d["arrays"][0].update(offset=1 << 45),
    "huge data_size": lambda d: d.update(data_size=1 << 60),
    "nbytes not shape x itemsize": lambda d: d["arrays"][0].update(nbytes=8),
    "object dtype": lambda d: d["arrays"][0].update(dtype="|O"),
    "structured dtype": lambda d: d["arrays"][0].update(dtype="[('a', '<f8')]"),
    "step as a string": lambda d: d.update(step="5"),
    "arrays as a dict": lambda d: d.update(arrays={"u": 1}),
    "bool as an int": lambda d: d.update(world_size=True),
    "NaN creation time": lambda d: d.update(created=float("nan")),
    "overlapping arrays": lambda d: d["arrays"][1].update(offset=0),
    "unknown checksum algorithm": lambda d: d.update(checksum_algorithm="md5"),
    "checksum not hex": lambda d: d["arrays"][0].update(checksum="../../etc"),
}


@pytest.mark.parametrize("attack", sorted(MANIFEST_ATTACKS))
def test_crafted_manifest_is_refused_and_restart_falls_back(attack, env):
    root, _ = env
    plant(root, 5, crafted(root, MANIFEST_ATTACKS[attack]))
    from hpcckpt import manifest as mf, storage
    path = os.path.join(step_dir(root, 5), "rank_000000.json")
    with pytest.raises(errors.CorruptCheckpointError):
        mf.parse(storage.read_json(path), path)
    assert restart(root) == 1
    record("hostile", {"case": f"manifest: {attack}", "order": 0, "outcome": "CorruptCheckpointError; restart falls back to step 1"})


def test_huge_manifest_is_refused_before_parsing(env):
    root, _ = env
    plant(root, 5, raw=b"[" + b"0," * (9 << 20) + b"0]")
    assert restart(root) == 1
    record("hostile", {"case": "manifest: 18 MiB of JSON", "order": 1, "outcome": "refused unread past 16 MiB; falls back"})


@pytest.mark.parametrize("what", ["manifest", "data", "step directory"])
def test_symlinks_out_of_the_cache_are_not_followed(what, env):
    root, outside = env
    good = step_dir(root, 1)
    if what == "step directory":
        target = os.path.join(outside, "stepdir")
        shutil.copytree(good, target)
        doc = json.load(open(os.path.join(target, "rank_000000.json")))
        doc["step"] = 5
        json.dump(mf.sign(doc), open(os.path.join(target, "rank_000000.json"), "w"))
        os.symlink(target, step_dir(root, 5))
    else:
        plant(root, 5, crafted(root, lambda d: None))
        name = "rank_000000.json" if what == "manifest" else "rank_000000.dat"
        shutil.copy(os.path.join(step_dir(root, 5), name), os.path.join(outside, name))
        os.unlink(os.path.join(step_dir(root, 5), name))
        os.symlink(os.path.join(outside, name), os.path.join(step_dir(root, 5), name))
    before = snapshot(outside)
    assert restart(root) == 1        # never restored through the link
    write_steps(root, (1, 5, 9))      # checkpoints replace the link (new history), never write through it
    assert snapshot(outside) == before
    record("hostile", {"case": f"symlink: {what} pointing outside the cache", "order": 2,
                       "outcome": "not followed; falls back; the outside files are untouched"})


@pytest.mark.parametrize("what,error", [("name", "IncompatibleCheckpointError"),
                                        ("version", "IncompatibleCheckpointError")])
def test_checkpoint_of_another_job_or_world_size_is_refused(what, error, env):
    root, _ = env
    change = {"name": lambda d: d.update(name="otherjob"), "world_size": lambda d: d.update(world_size=4),
              "version": lambda d: d.update(version=99)}[what]
    plant(root, 5, crafted(root, change))
    with pytest.raises(getattr(errors, error)) as e:
        restart(root)
    assert "Traceback" not in str(e.value)
    record("hostile", {"case": f"newest checkpoint of another {what}", "order": 3, "outcome": f"{error}: {e.value}"[:200]})


@pytest.mark.parametrize("what", ["world_size", "placement"])
def test_a_newer_checkpoint_of_another_layout_gives_way_to_one_this_job_restores(what, env, caplog):
    """This job's newest step written on another rank count or placement (a relaunch on fewer
    nodes): the restart takes the newest step it can restore, with a warning naming the other."""
    root, _ = env
    change = {"world_size": lambda d: d.update(world_size=4),
              "placement": lambda d: d.update(placement=mf.placement_digest([0, 0]))}[what]
    plant(root, 5, crafted(root, change))
    with caplog.at_level(logging.WARNING, logger="hpcckpt"):
        assert restart(root, log_level="WARNING") == 1
    assert "restarted from step 1" in caplog.text and "step_0000000005" in caplog.text, caplog.text
    record("hostile", {"case": f"newest checkpoint of another {what}", "order": 3,
                       "outcome": "the restart takes step 1 (the newest this job restores), with a warning"})


def test_stop_signals_that_cannot_be_installed_outside_the_main_thread_are_named(tmp_path):
    """Red team 4: a Checkpointer created in a worker thread silently left stop_signals
    unhandled (no final checkpoint at the signal). Now a warning says so."""
    import threading
    out = []

    def build():
        with make(str(tmp_path), stop_signals=["USR1"], log_level="WARNING"):
            out.append(True)
    captured = _Captured()
    logging.getLogger("hpcckpt").addHandler(captured)
    try:
        t = threading.Thread(target=build)
        t.start()
        t.join()
    finally:
        logging.getLogger("hpcckpt").removeHandler(captured)
    assert out == [True]
    assert any("stop_signals ['SIGUSR1'] are not handled" in line and "main thread" in line
               for line in captured.lines), captured.lines


# ---------------------------------------------------------------------- pfs
@pytest.fixture
def pfs_env(tmp_path):
    root = str(tmp_path / "c")
    outside = str(tmp_path / "outside")
    os.makedirs(outside)
    write_steps(root, (1, 5), level="pfs")
    shutil.rmtree(os.path.join(root, "node0"))       # restart must come from pfs
    before = snapshot(outside)
    yield root, os.path.join(root, "pfs", "app", "step_0000000005"), outside
    assert all(snapshot(outside).get(k) == v for k, v in before.items())


def _index_attack(change):
    def run(step):
        p = os.path.join(step, "COMMITTED.json")
        doc = json.load(open(p))
        change(doc)
        json.dump(doc, open(p, "w"))
    return run


def _master_abs_link(step):
    import h5py
    with h5py.File(os.path.join(step, "checkpoint.h5"), "r+") as f:
        del f["rank_000000"]
        f["rank_000000"] = h5py.ExternalLink("/etc/passwd", "/x")


def _node_symlink(step, outside):
    p = os.path.join(step, "node_000000.h5")
    shutil.copy(p, os.path.join(outside, "node.h5"))
    os.unlink(p)
    os.symlink(os.path.join(outside, "node.h5"), p)


def _dataset_shape(step):
    import h5py
    p = os.path.join(step, "node_000000.h5")
    size = os.path.getsize(p)
    with h5py.File(p, "r+") as f:
        del f["rank_000000/u"]
        f.create_dataset("rank_000000/u", data=np.zeros(7))
    os.truncate(p, size) if os.path.getsize(p) > size else None


PFS_ATTACKS = {
    "COMMITTED.json files naming ../": _index_attack(lambda d: d["files"].update({"../../x.h5": 1})),
    "COMMITTED.json absurd global shape": _index_attack(lambda d: d["arrays"][0].update(global_shape=[1 << 60])),
    "COMMITTED.json block shape wrong type": _index_attack(lambda d: d["arrays"][0]["blocks"][0].update(shape="1000")),
    "COMMITTED.json array name ../": _index_attack(lambda d: d["arrays"][0].update(name="../u")),
    "COMMITTED.json wrong node size": _index_attack(lambda d: d["files"].update({"node_000000.h5": 12})),
    "node file is a symlink out": "symlink",
    "node dataset replaced (other shape)": _dataset_shape,
    "node file is not HDF5": lambda s: open(os.path.join(s, "node_000000.h5"), "r+b").write(b"garbage!" * 64),
}


@pytest.mark.parametrize("attack", sorted(PFS_ATTACKS))
def test_crafted_pfs_step_is_refused_and_restart_falls_back(attack, pfs_env):
    root, step, outside = pfs_env
    fn = PFS_ATTACKS[attack]
    if fn == "symlink":
        _node_symlink(step, outside)
    else:
        fn(step)
    assert restart(root) == 1
    record("hostile", {"case": f"pfs: {attack}", "order": 4, "outcome": "CorruptCheckpointError; falls back to pfs step 1"})


class _Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("damage", ["index garbage", "master flipped", "master deleted"])
def test_a_damaged_pfs_index_or_master_is_named_at_restart(damage, pfs_env):
    """A step whose index cannot be read is skipped (restart falls back to step 1), one whose
    master file is damaged is restored from its node files (step 5): each with a warning naming it."""
    root, step, _ = pfs_env
    if damage == "index garbage":
        open(os.path.join(step, "COMMITTED.json"), "w").write("{not json")
    elif damage == "master flipped":
        with open(os.path.join(step, "checkpoint.h5"), "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
    else:
        os.unlink(os.path.join(step, "checkpoint.h5"))
    captured = _Captured()
    logging.getLogger("hpcckpt").addHandler(captured)
    try:
        got = restart(root, log_level="WARNING")
    finally:
        logging.getLogger("hpcckpt").removeHandler(captured)
    if damage == "index garbage":
        assert got == 1 and any(line.startswith("pfs step 5 cannot be used") for line in captured.lines), captured.lines
    else:
        assert got == 5 and any("pfs step 5 was restored from its node files, but its master file" in line
                                for line in captured.lines), captured.lines


def _node_metadata_offsets(path):
    """The offsets of a node file's bytes outside its datasets' data (found with h5py)."""
    import h5py
    data = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: data.append((obj.id.get_offset(), obj.id.get_storage_size()))
                     if isinstance(obj, h5py.Dataset) and obj.id.get_offset() is not None else None)
    inside = np.zeros(os.path.getsize(path), bool)
    for off, n in data:
        inside[off:off + n] = True
    return np.flatnonzero(~inside)


def test_a_flipped_byte_in_a_node_files_hdf5_metadata_is_damage_never_intact(pfs_env):
    """Red team 4: one byte of a node file's HDF5 metadata flipped (superblock, object headers,
    attributes; every 37th byte of it, one at a time) was read as intact by verify, gave wrong
    attributes to h5py, or crashed libhdf5 (restart and verify: SIGSEGV). Now every flip is a
    damaged step before HDF5 opens the file, and the restart falls back to step 1."""
    from hpcckpt.levels import pfs_check
    root, step, _ = pfs_env
    path = os.path.join(step, "node_000000.h5")
    offsets = _node_metadata_offsets(path)
    assert 1000 < offsets.size < 64 << 10
    missed = []
    with open(path, "r+b") as f:
        for at in offsets[::37]:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x5A]))
            f.flush()
            problems = pfs_check.verify_step(step)[1]
            if len(problems) != 1:          # said once, not once per array of the node file
                missed.append((int(at), len(problems)))
            f.seek(at)
            f.write(byte)
            f.flush()
        assert not missed, f"flips verify called intact (0) or named more than once: {missed[:20]}"
        f.seek(int(offsets[offsets.size // 2]))
        f.write(b"\xff")
    assert restart(root) == 1
    record("hostile", {"case": "pfs: a byte of a node file's HDF5 metadata flipped", "order": 4,
                       "outcome": "damaged before HDF5 opens it (metadata checksum); verify says so; falls back to "
                                  "pfs step 1"})


def test_a_spare_node_file_with_damaged_metadata_is_replaced_not_reopened(tmp_path):
    """With reuse_files, a retired node file is kept as the spare that the next pfs checkpoint
    overwrites after rewriting its attributes through HDF5. A spare whose metadata was damaged
    meanwhile (one byte flipped, every 53rd byte of the metadata in turn) is removed and a new
    file made: every checkpoint succeeds and the last restores bitwise."""
    import time
    root = str(tmp_path / "c")
    spare = os.path.join(root, "pfs", "app", ".spare", "node_000000.h5")
    u, grid, it = arrays()
    with make(root, keep=1) as ck:
        for name, a in zip(("u", "grid", "it"), (u, grid, it)):
            ck.protect(name, a)
        offsets = None
        for step in range(60):
            u *= 1.0001
            u += np.sin(u[:1]) + step
            grid += step % 7
            it[...] = step
            if step >= 2:
                deadline = time.monotonic() + 10
                while not os.path.isfile(spare) and time.monotonic() < deadline:
                    time.sleep(0.01)          # the retired step's file becomes the spare in a thread
                assert os.path.isfile(spare)
                offsets = _node_metadata_offsets(spare) if offsets is None else offsets
                at = int(offsets[(step * 53) % offsets.size])
                with open(spare, "r+b") as f:
                    f.seek(at)
                    byte = f.read(1)
                    f.seek(at)
                    f.write(bytes([byte[0] ^ 0x5A]))
            ck.checkpoint(step, level="pfs")
    shutil.rmtree(os.path.join(root, "node0"))
    assert restart(root) == 59


def test_master_with_an_absolute_link_fails_verify(pfs_env):
    from mpi4py import MPI
    from hpcckpt.config import Config
    from hpcckpt.levels.pfs import PfsStore
    from hpcckpt.topology import Topology
    root, step, _ = pfs_env
    _master_abs_link(step)
    cfg = Config.load(name="app", cache_dir=os.path.join(root, "node{node}"), pfs_dir=os.path.join(root, "pfs"))
    store = PfsStore(cfg, MPI.COMM_SELF, Topology(0, 1, (0,)))
    try:
        with pytest.raises(errors.CorruptCheckpointError, match="passwd|absolute|outside|link"):
            store.verify(5)
    finally:
        store.close()
    assert restart(root) == 5      # restore reads node files only: the data itself is intact
    record("hostile", {"case": "pfs: master links to /etc/passwd", "order": 4,
                       "outcome": "verify() refuses it (CorruptCheckpointError); restore never opens the master"})


def test_planted_pfs_step_symlink_is_not_followed_or_deleted_through(pfs_env):
    root, step, outside = pfs_env
    target = os.path.join(outside, "pstep")
    shutil.copytree(step, target)
    os.symlink(target, os.path.join(os.path.dirname(step), "step_0000000009"))
    before = snapshot(outside)
    assert restart(root) == 5
    write_steps(root, (1, 5, 7, 8, 9, 10), level="pfs")   # retires and replaces step 9
    assert snapshot(outside) == before
    record("hostile", {"case": "pfs: step directory symlinked outside", "order": 4,
                       "outcome": "ignored by restart; retire/commit remove the link only"})


# ---------------------------------------------------------------------- bad arguments, config
@pytest.mark.parametrize("what", ["non-contiguous", "object", "read-only", "structured", "list", "bad name", "masked",
                                  "subclass", "33 dimensions", "long dtype name"])
def test_protect_refuses(what, tmp_path):
    a = {"non-contiguous": np.zeros((4, 4))[:, 1], "object": np.array([None, 1], dtype=object),
         "read-only": np.zeros(3), "structured": np.zeros(2, dtype=[("a", "<f8")]), "list": [1, 2],
         "bad name": np.zeros(3), "masked": np.ma.zeros(3), "subclass": np.zeros(3).view(_Tagged),
         "33 dimensions": np.zeros((1,) * 33), "long dtype name": np.zeros(2, "M8[2147483647as]")}[what]
    if what == "read-only":
        a.flags.writeable = False
    with make(str(tmp_path)) as ck:
        with pytest.raises(errors.ProtectError) as e:
            ck.protect("../x" if what == "bad name" else "a", a)
    record("hostile", {"case": f"protect(): {what} array", "order": 5, "outcome": f"ProtectError: {e.value}"[:200]})


@pytest.mark.parametrize("kw", [{"keep": 0}, {"group_size": 1}, {"rs_parity": 0}, {"io_chunk": 1},
                                {"file_mode": 0o1777}, {"file_mode": 0o400}, {"stop_signals": "SEGV"},
                                {"name": "../x"}, {"ranks_per_node": 0},
                                {"level": "l9"}, {"cache_dir": "/x/{nodes}"}, {"kepp": 2}, {"pfs_dir": ""},
                                {"keep": "2"}, {"exit_safety": 1e9}])
def test_config_out_of_range(kw, tmp_path):
    with pytest.raises(errors.ConfigError) as e:
        make(str(tmp_path), **kw)
    assert "Traceback" not in str(e.value)
    record("hostile", {"case": f"config {kw}", "order": 6, "outcome": f"ConfigError: {e.value}"[:200]})


class _Tagged(np.ndarray):
    pass


@pytest.mark.parametrize("layout", ["block", "rows"])
def test_a_global_layout_on_a_value_that_is_not_an_array_is_refused(layout, tmp_path):
    """Block/ROWS place an array's pieces; a plain value under them could not be placed on
    another rank count, so it is refused at the checkpoint, not found unusable at a restart."""
    with make(str(tmp_path)) as ck:
        ck.layout("u", hpcckpt.Block((4,), (0,)) if layout == "block" else hpcckpt.ROWS)
        for value in (3.0, np.float64(3.0), [1, 2]):
            with pytest.raises(errors.ProtectError, match=f"a {layout} layout needs an array"):
                ck.checkpoint(1, {"u": value}, level="pfs")


def test_numpy_integer_steps_are_steps(tmp_path):
    """for step in np.arange(...): NumPy integers are taken as the steps they are."""
    with make(str(tmp_path)) as ck:
        a = np.arange(3.0)
        ck.protect("a", a)
        for step in (np.int64(3), np.int32(4), np.uint64(5)):
            ck.need_checkpoint(step)
            assert ck.checkpoint(step, level="local").step == int(step)
    with make(str(tmp_path)) as ck:
        a = np.zeros(3)
        ck.protect("a", a)
        step = ck.restart()
        assert type(step) is int and step == 5


def test_bad_calls_name_themselves(tmp_path):
    with make(str(tmp_path)) as ck:
        ck.protect("a", np.zeros(3))
        for bad in ("x", -1, 2.5, True):
            with pytest.raises(errors.HpcCkptError, match="step must be an integer"):
                ck.need_checkpoint(bad)
    for call in (lambda: ck.unprotect("a"), lambda: ck.protect("b", np.zeros(2)), lambda: ck.need_checkpoint(1)):
        with pytest.raises(errors.HpcCkptError, match="closed"):
            call()


@pytest.mark.parametrize("level", ["l9", "", None])
def test_unknown_level_and_bad_step(level, tmp_path):
    with make(str(tmp_path)) as ck:
        ck.protect("a", np.zeros(3))
        with pytest.raises(errors.HpcCkptError) as e:
            ck.checkpoint(1, level=level or "nonsense")
        with pytest.raises(errors.HpcCkptError):
            ck.checkpoint(-1)
    record("hostile", {"case": f"checkpoint(level={level or 'nonsense'!r})", "order": 7, "outcome": f"HpcCkptError: {e.value}"[:200]})


def test_no_pickle_and_no_allow_pickle_in_the_library():
    src = os.path.join(os.path.dirname(hpcckpt.__file__))
    for dirpath, _, files in os.walk(src):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f)).read()
                assert "import pickle" not in text and "allow_pickle=True" not in text and "pickle.load" not in text, f


# ---------------------------------------------------------------------- CLI
def cli(*args):
    return subprocess.run([sys.executable, "-m", "hpcckpt", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def test_cli_on_hostile_directories(env, tmp_path):
    root, _ = env
    plant(root, 5, crafted(root, MANIFEST_ATTACKS["data_file with ../"]))
    plant(root, 6, raw=b"\xff\xfe not json")
    r = cli("verify", root)
    assert r.returncode == 1 and "DAMAGED step 5" in r.stdout and "DAMAGED step 6" in r.stdout, r
    assert "Traceback" not in r.stderr + r.stdout
    r = cli("list", root)
    assert r.returncode == 0 and "unreadable" in r.stdout and "Traceback" not in r.stderr, r
    r = cli("inspect", root, 6)
    assert r.returncode == 1 and "unreadable manifest" in r.stdout and "Traceback" not in r.stderr, r
    r = cli("verify", tmp_path / "nope")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r
    record("hostile", {"case": "CLI verify/list/inspect over crafted manifests", "order": 8,
                       "outcome": "verify exit 1 naming each damaged step; list/inspect report 'unreadable'; "
                                  "missing dir exit 2, one line"})


# ---------------------------------------------------------------------- permissions
@pytest.mark.parametrize("modes", [None, (0o640, 0o750)])
def test_files_private_by_default_and_configurable(modes, tmp_path):
    root = str(tmp_path / "c")
    kw = {} if modes is None else {"file_mode": modes[0], "dir_mode": modes[1]}
    old = os.umask(0o022)
    try:
        write_steps(root, (1, 2), level="pfs", **kw)
    finally:
        os.umask(old)
    fmode, dmode = modes or (0o600, 0o700)
    seen = 0
    for base in (os.path.join(root, "node0", "app"), os.path.join(root, "pfs", "app")):
        assert os.stat(base).st_mode & 0o777 == dmode, base
        for dirpath, dirnames, files in os.walk(base):
            for d in dirnames:
                assert os.stat(os.path.join(dirpath, d)).st_mode & 0o777 == dmode, os.path.join(dirpath, d)
            for f in files:
                seen += 1
                assert os.stat(os.path.join(dirpath, f)).st_mode & 0o777 == fmode, os.path.join(dirpath, f)
    assert seen >= 5
    record("hostile", {"case": f"file/dir modes {'default' if modes is None else oct(modes[0]) + '/' + oct(modes[1])}",
                       "order": 9, "outcome": f"every cache and pfs file {oct(fmode)}, directory {oct(dmode)}"})
