"""Manifests and storage, in one process: round trips, strict validation, damage detection."""
import json
import os

import numpy as np
import pytest

from hpcckpt import CorruptCheckpointError, IncompatibleCheckpointError, ProtectError
from hpcckpt import data_file, manifest as mf, storage
from hpcckpt.config import WRITE_METHODS


def make_manifest(**changes):
    doc = {"format": "hpcckpt-rank", "version": 1, "name": "job", "world_size": 4, "rank": 1, "node": 0,
           "step": 9, "level": "local", "ckpt_id": "ab" * 16, "created": 1.5e9, "checksum_algorithm": "xxh3_64",
           "data_file": "rank_000001.dat", "data_size": 1064,
           "arrays": [{"name": "u", "dtype": "<f8", "shape": [100], "offset": 0, "nbytes": 800,
                       "checksum": "0123456789abcdef"},
                      {"name": "it", "dtype": "<i8", "shape": [], "offset": 832, "nbytes": 8,
                       "checksum": "00000000000000ff", "global_shape": [], "global_offset": []}]}
    doc.update(changes)
    return mf.sign(doc)   # crafted documents carry a valid self-checksum, so what follows is tested


def test_valid_manifest_round_trips():
    m = mf.parse(make_manifest(), "m")
    assert m.step == 9 and m.array("u").shape == (100,) and m.array("it").global_shape == ()
    assert mf.parse(json.loads(json.dumps(m.to_json())), "again") == m


@pytest.mark.parametrize("damage", [
    lambda d: d["arrays"][0].update(dtype="<f4"),          # still parses: only the checksum tells
    lambda d: d["arrays"][0].update(shape=[50, 2]),
    lambda d: d.update(step=8),
    lambda d: d.pop("manifest_checksum"),
])
def test_a_damaged_manifest_fails_its_self_checksum(damage):
    doc = make_manifest()
    damage(doc)
    with pytest.raises(CorruptCheckpointError, match="manifest_checksum"):
        mf.parse(doc, "m")


@pytest.mark.parametrize("changes,needle", [
    ({"format": "pickle"}, "format"),
    ({"version": "1"}, "version"),
    ({"world_size": 0}, "world size"),
    ({"rank": 7}, "does not fit"),
    ({"step": -1}, "step"),
    ({"step": True}, "step"),
    ({"data_file": "../../etc/passwd"}, "data_file"),
    ({"data_size": 10}, "past the data size"),
    ({"checksum_algorithm": "md5"}, "checksum algorithm"),
    ({"arrays": "many"}, "arrays must be a list"),
    ({"arrays": [{"name": "../x", "dtype": "<f8", "shape": [1], "offset": 0, "nbytes": 8, "checksum": "aa"}]}, "array name"),
    ({"arrays": [{"name": "x", "dtype": "|O", "shape": [1], "offset": 0, "nbytes": 8, "checksum": "aa"}]}, "dtype"),
    ({"arrays": [{"name": "x", "dtype": "<f8", "shape": [2**40, 2**40], "offset": 0, "nbytes": 8, "checksum": "aa"}]}, "absurdly"),
    ({"arrays": [{"name": "x", "dtype": "<f8", "shape": [3], "offset": 0, "nbytes": 8, "checksum": "aa"}]}, "nbytes"),
    ({"arrays": [{"name": "x", "dtype": "<f8", "shape": [1], "offset": 0, "nbytes": 8, "checksum": "zz"}]}, "checksum"),
    ({"arrays": [{"name": "x", "dtype": "<f8", "shape": [1], "offset": 0, "nbytes": 8, "checksum": "aa"},
                 {"name": "x", "dtype": "<f8", "shape": [1], "offset": 64, "nbytes": 8, "checksum": "aa"}]}, "twice"),
    ({"arrays": [{"name": "x", "dtype": "<f8", "shape": [2], "offset": 0, "nbytes": 16, "checksum": "aa",
                  "global_shape": [1], "global_offset": [0]}]}, "does not fit"),
])
def test_hostile_manifests_are_refused(changes, needle):
    with pytest.raises(CorruptCheckpointError, match=needle):
        mf.parse(make_manifest(**changes), "m")


def test_newer_format_is_incompatible():
    with pytest.raises(IncompatibleCheckpointError, match="newer"):
        mf.parse(make_manifest(version=99), "m")


def test_read_json_refuses_huge_symlinked_and_garbage(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 200)
    with pytest.raises(CorruptCheckpointError, match="larger than"):
        storage.read_json(str(big), max_bytes=100)
    garbage = tmp_path / "g.json"
    garbage.write_bytes(b"\xff\xfe{")
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        storage.read_json(str(garbage))
    link = tmp_path / "link.json"
    os.symlink("/etc/hostname", link)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        storage.read_json(str(link))


@pytest.mark.parametrize("step", [0, 12, 9999999999, 10**10, 10**10 + 1, 10**12, mf.MAX_STEP])
def test_every_step_has_one_directory_name_that_parses_back(step):
    name = mf.step_dir_name(step)
    assert mf.parse_step_dir_name(name) == step
    assert len(name) == 5 + max(10, len(str(step)))


@pytest.mark.parametrize("name", ["step_000000001", "step_00000000012", "step_01000000000", "step_0000000012x",
                                  "step_-000000001", "step_" + "\u0661" * 10, "step_1099511627776",
                                  "step_99999999999999", "stp_0000000001", "step_0000000001.tmp-ab"])
def test_other_names_are_not_step_directories(name):
    """Only step_dir_name's own spelling: no second name for a step (leading zeros past ten
    digits), nothing past MAX_STEP, ASCII digits only."""
    assert mf.parse_step_dir_name(name.encode().decode("unicode_escape")) is None


def test_own_dir_replaces_a_planted_link_and_never_follows_it(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("not yours")
    spare = tmp_path / "job" / "spare"
    spare.parent.mkdir()
    os.symlink(outside, spare)
    assert not storage.is_own_dir(spare) and os.path.isdir(spare)
    with caplog.at_level("WARNING", logger="hpcckpt"):
        assert storage.own_dir(str(spare)) == str(spare)
    assert storage.is_own_dir(spare) and not os.listdir(spare)
    assert (outside / "precious").read_text() == "not yours"
    assert "symbolic link" in caplog.text and "not followed" in caplog.text
    storage.remove_tree(str(spare))
    os.symlink(outside, spare)
    storage.remove_tree(str(spare))            # the link goes, what it points to stays
    assert not os.path.lexists(spare) and (outside / "precious").exists()


def test_safe_join_refuses_escapes(tmp_path):
    assert storage.safe_join(str(tmp_path), "a", "b").endswith("a/b")
    for bad in ("..", "/etc", "a/../..", "", "x\0y"):
        with pytest.raises(CorruptCheckpointError):
            storage.safe_join(str(tmp_path), bad)


def test_array_name_and_dtype_checks():
    mf.check_array_name("u_1.v-2")
    for bad in ("", "1abc", "a/b", "../x", "x" * 1100, 3):
        with pytest.raises(ProtectError):
            mf.check_array_name(bad)
    with pytest.raises(ProtectError):
        mf.check_dtype(np.dtype(object))
    with pytest.raises(ProtectError):
        mf.check_dtype(np.dtype([("a", "<f8")]))


@pytest.mark.parametrize("method", WRITE_METHODS)
@pytest.mark.parametrize("chunk", [4096, 1 << 20])
def test_write_verify_read_round_trip(tmp_path, chunk, method):
    rng = np.random.default_rng(1)
    arrays = [("a", rng.random(12345)), ("b", np.arange(7, dtype=np.int16).reshape(7, 1)),
              ("c", np.zeros((), np.complex128) + 1j), ("d", np.zeros(0, np.uint8))]
    path = str(tmp_path / "f.dat")
    entries, size = data_file.write_arrays(path, arrays, chunk, method=method)
    assert os.path.getsize(path) == size
    assert all(off % 64 == 0 for _, off, _, _ in entries)
    buf = np.empty(4096, np.uint8)
    storage.verify_file(path, size, entries, buf)
    out = [np.empty_like(a) for _, a in arrays]
    data_file.read_into(path, size, [(o, e[1]) for o, e in zip(out, entries)], chunk)
    for (_, a), o in zip(arrays, out):
        assert a.tobytes() == o.tobytes()


@pytest.mark.parametrize("existing", [False, True])
@pytest.mark.parametrize("method", WRITE_METHODS)
@pytest.mark.parametrize("chunk", [4096, 200 << 10, 1 << 20])
def test_checksum_written_in_pieces_is_the_whole_array_digest(tmp_path, chunk, method, existing):
    """Writing in chunks (pwrite, and mmap into a new file: each in HASH_PIECE calls hashed after
    the write; mmap over an existing file: copied and hashed in one pass) gives the digest of the
    whole array (sizes that are not multiples of the piece, the block or the chunk included),
    and the arrays' bytes."""
    from hpcckpt.codecs.checksum import digest
    rng = np.random.default_rng(2)
    arrays = [("a", rng.integers(0, 255, data_file.HASH_PIECE * 3 + 17, dtype=np.uint8)),
              ("b", rng.random(100003)), ("c", np.arange(5, dtype=np.int8))]
    if existing:
        (tmp_path / "f.dat").write_bytes(b"x" * 5000)
    entries, size = data_file.write_arrays(str(tmp_path / "f.dat"), arrays, chunk, method=method)
    data = (tmp_path / "f.dat").read_bytes()
    assert len(data) == size
    for (_, a), (_, offset, nbytes, checksum) in zip(arrays, entries):
        assert checksum == digest(storage.byte_view(a))
        assert data[offset:offset + nbytes] == a.tobytes()


@pytest.mark.parametrize("method", WRITE_METHODS)
@pytest.mark.parametrize("spare_elements", [100000, 1000, 10])
def test_reused_file_is_resized_and_identical(tmp_path, method, spare_elements):
    """A spare larger, as large as, or smaller than the new data is overwritten in place."""
    spare = str(tmp_path / "spare.dat")
    data_file.write_arrays(spare, [("x", np.ones(spare_elements))], 4096, method=method)
    inode = os.stat(spare).st_ino
    path = str(tmp_path / "new.dat")
    data = np.arange(1000, dtype=np.float64)
    entries, size = data_file.write_arrays(path, [("x", data)], 4096, reuse=spare, method=method)
    assert not os.path.exists(spare) and os.path.getsize(path) == size == data.nbytes
    assert os.stat(path).st_ino == inode
    storage.verify_file(path, size, entries, np.empty(4096, np.uint8))
    assert open(path, "rb").read() == data.tobytes()


@pytest.mark.parametrize("method", WRITE_METHODS)
def test_a_fault_mid_write_raises_and_leaves_no_descriptor_open(tmp_path, method):
    def fail():
        raise OSError(28, "No space left on device (injected fault)")
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="injected"):
        data_file.write_arrays(str(tmp_path / "f.dat"), [("a", np.ones(100000))], 4096, fault=fail, method=method)
    assert len(os.listdir("/proc/self/fd")) == before


def test_damage_is_detected(tmp_path):
    path = str(tmp_path / "f.dat")
    entries, size = data_file.write_arrays(path, [("a", np.arange(50000.0))], 8192)
    buf = np.empty(8192, np.uint8)
    with open(path, "r+b") as f:
        f.seek(123457)
        f.write(b"\x01")
    with pytest.raises(CorruptCheckpointError, match="fails its checksum"):
        storage.verify_file(path, size, entries, buf)
    os.truncate(path, size - 1)
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        storage.verify_file(path, size, entries, buf)
    os.unlink(path)
    with pytest.raises(CorruptCheckpointError, match="missing"):
        storage.verify_file(path, size, entries, buf)


def test_atomic_write_leaves_no_temp(tmp_path):
    path = str(tmp_path / "m.json")
    storage.atomic_write_json(path, {"a": 1})
    storage.atomic_write_json(path, {"a": 2})
    assert json.load(open(path)) == {"a": 2} and os.listdir(tmp_path) == ["m.json"]


def test_kept_mappings_are_reused_resized_dropped_and_closed(tmp_path):
    """data_file.Mappings: a rewrite of the same file (same size) finds its mapping; another size
    (shrunk, grown: a state whose arrays change length) resizes it (mremap: the same mapping
    object); one that cannot be resized (a view of it still held) is mapped again; a file
    unlinked meanwhile is dropped at the next write; at most ``limit`` are kept; close() leaves
    no descriptor open; the bytes are always the new ones."""
    before = len(os.listdir("/proc/self/fd"))
    maps = data_file.Mappings(2)
    a, b, c = (str(tmp_path / n) for n in "abc")
    data = [np.full(70000, i, np.uint8) for i in range(4)]
    data_file.write_arrays(a, [("x", data[0])], 4096, mappings=maps)
    first = maps._maps[next(iter(maps._maps))][2]
    data_file.write_arrays(a, [("x", data[1])], 4096, mappings=maps)
    assert len(maps._maps) == 1 and maps._maps[next(iter(maps._maps))][2] is first
    assert open(a, "rb").read() == data[1].tobytes()
    data_file.write_arrays(a, [("x", data[2][:5000])], 4096, mappings=maps)   # shrunk
    assert len(maps._maps) == 1 and open(a, "rb").read() == data[2][:5000].tobytes()
    assert maps._maps[next(iter(maps._maps))][2] is first and len(first) == 5000
    grown = np.arange(90000, dtype=np.uint8)
    data_file.write_arrays(a, [("x", grown)], 4096, mappings=maps)            # grown past its old size
    assert maps._maps[next(iter(maps._maps))][2] is first and open(a, "rb").read() == grown.tobytes()
    held = np.frombuffer(first, np.uint8)                                    # a view still in use
    data_file.write_arrays(a, [("x", data[2][:6000])], 4096, mappings=maps)
    assert maps._maps[next(iter(maps._maps))][2] is not first and open(a, "rb").read() == data[2][:6000].tobytes()
    del held, first                 # (the closed mapping keeps its descriptor until collected)
    data_file.write_arrays(b, [("x", data[3])], 4096, mappings=maps)
    os.unlink(a)
    data_file.write_arrays(c, [("x", data[3])], 4096, mappings=maps)        # a's is dropped, not evicted
    assert len(maps._maps) == 2
    fd = os.open(c, os.O_RDONLY)
    try:
        assert maps.find(fd, data[3].nbytes) is not None and maps.find(fd, 10) is None
    finally:
        os.close(fd)
    maps.close()
    assert len(os.listdir("/proc/self/fd")) == before and open(c, "rb").read() == data[3].tobytes()


@pytest.mark.parametrize("reuse", [True, False])
def test_retire_unlinks_what_it_does_not_keep_in_the_background(tmp_path, reuse):
    """LocalCache.retire: the data file becomes the spare (reuse_files) or goes to spare/trash_*
    and is unlinked by a background thread (close() waits for it); prepare() removes the trash
    a crash left, this rank's only."""
    from hpcckpt.config import Config
    from hpcckpt.levels.local import LocalCache
    from hpcckpt.state import PER_RANK
    from hpcckpt.topology import Topology
    cfg = Config.load(environ={}, name="app", cache_dir=str(tmp_path / "node{node}"), pfs_dir=str(tmp_path / "pfs"),
                      reuse_files=reuse)
    cache = LocalCache(cfg, Topology(0, 2, (0, 0)))
    cache.prepare()
    for step in (1, 2):
        m = cache.write(step, "c" * 32, "local", 1, [("u", np.arange(100000, dtype=np.float64), PER_RANK)])
        cache.commit(m)
    cache.retire(1)
    assert not os.path.exists(cache.step_dir(1))
    spare_dir = os.path.join(cache.root, "spare")
    cache.close()
    names = sorted(os.listdir(spare_dir)) if os.path.isdir(spare_dir) else []
    assert names == (["rank_000000.dat"] if reuse else [])
    assert cache.read_manifest(2).step == 2
    # trash left by a crash: this rank's is removed at prepare(), another rank's stays
    os.makedirs(spare_dir, exist_ok=True)
    for name in ("trash_000000_dead", "trash_000001_dead"):
        open(os.path.join(spare_dir, name), "wb").close()
    cache.prepare()
    assert "trash_000000_dead" not in os.listdir(spare_dir) and "trash_000001_dead" in os.listdir(spare_dir)


def test_a_directory_where_the_spare_should_be_is_not_renamed_into_the_step(tmp_path, caplog):
    """reuse_files: something other than a regular file at the spare's path (a directory, a
    link) is not reused: the step's data file is written as a new file (before: the directory was
    renamed to the step's file name, and the write failed naming the step's file), with one
    warning that names the spare's path."""
    from hpcckpt.config import Config
    from hpcckpt.levels.local import LocalCache
    from hpcckpt.state import PER_RANK
    from hpcckpt.topology import Topology
    cfg = Config.load(environ={}, name="app", cache_dir=str(tmp_path / "node{node}"), pfs_dir=str(tmp_path / "pfs"))
    cache = LocalCache(cfg, Topology(0, 1, (0,)))
    cache.prepare()
    os.makedirs(cache.spare_path)
    u = np.arange(1000, dtype=np.float64)
    with caplog.at_level("WARNING", logger="hpcckpt"):
        for step in (1, 2):
            cache.commit(cache.write(step, "c" * 32, "local", 1, [("u", u, PER_RANK)]))
    assert os.path.isdir(cache.spare_path) and os.path.isfile(cache.data_path(2))
    assert np.array_equal(np.fromfile(cache.data_path(2), np.float64, 1000), u)
    told = [r.getMessage() for r in caplog.records if "not a regular file" in r.getMessage()]
    assert len(told) == 1 and cache.spare_path in told[0], told
    cache.close()


@pytest.mark.parametrize("spares", [1, 2])
def test_two_steps_retired_together_are_both_overwritten_with_two_spares(tmp_path, spares):
    """reuse_files with ``spares`` data-file spares (one more per redundant level of the job): a
    retire of two steps at once keeps both files (one with a single spare), and the next two
    writes overwrite them (the same inodes), so a cycle of levels never writes a new file."""
    from hpcckpt.config import Config
    from hpcckpt.levels.local import LocalCache
    from hpcckpt.state import PER_RANK
    from hpcckpt.topology import Topology
    cfg = Config.load(environ={}, name="app", cache_dir=str(tmp_path / "node{node}"), pfs_dir=str(tmp_path / "pfs"))
    cache = LocalCache(cfg, Topology(0, 1, (0,)), spares=spares)
    cache.prepare()
    u = np.arange(100000, dtype=np.float64)
    for step in (1, 2, 3):
        cache.commit(cache.write(step, "c" * 32, "local", 1, [("u", u, PER_RANK)]))
    held = [os.open(cache.data_path(s), os.O_RDONLY) for s in (1, 2)]   # no inode number is reused meanwhile
    inodes = {os.fstat(fd).st_ino for fd in held}
    cache.retire(1)
    cache.retire(2)
    kept = sorted(os.listdir(cache.spare_dir))
    assert kept == ["rank_000000.dat", "rank_000000.dat.1"][:spares]
    for step in (4, 5):
        cache.commit(cache.write(step, "c" * 32, "local", 1, [("u", u + step, PER_RANK)]))
    reused = {os.stat(cache.data_path(s)).st_ino for s in (4, 5)} & inodes
    for fd in held:
        os.close(fd)
    assert len(reused) == spares
    assert all(np.array_equal(np.fromfile(cache.data_path(s), np.float64, u.size), u + s) for s in (4, 5))
    cache.close()
    cache.remove_spares()
    assert not [n for n in os.listdir(cache.spare_dir) if n.startswith("rank_")]
