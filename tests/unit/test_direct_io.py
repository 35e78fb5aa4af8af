"""Direct I/O and the pfs node writer (local, one process, real files): what reaches the file is
exactly the bytes handed over, whichever way each part went (O_DIRECT, the page cache, a
fallback after the file system refused direct I/O), and errors come back from close()."""
import errno
import mmap
import os

import numpy as np
import pytest

from hpcckpt import data_file, storage
from hpcckpt.levels.pfs_writer import NodeWriter

A = storage.DIRECT_ALIGN


def aligned(nbytes, misalign=0, seed=0):
    """Random uint8 data at a DIRECT_ALIGN boundary (+ misalign) of an anonymous mapping."""
    m = mmap.mmap(-1, nbytes + A + misalign)
    view = np.frombuffer(m, np.uint8)[misalign:misalign + nbytes]
    view[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return view


def file_of(path, size):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    return fd


def test_large_arrays_start_page_aligned_in_data_files(tmp_path):
    """array_offset: 4 KiB for arrays of PAGE_ALIGN_MIN or more (the pfs flush writes them with
    direct I/O from the cache's mapping), 64 bytes for smaller ones; the file round-trips."""
    big = storage.PAGE_ALIGN_MIN
    arrays = [("s", np.arange(3, dtype=np.int8)), ("b", np.ones(big // 8 + 1)), ("t", np.zeros(5)),
              ("c", np.arange(big, dtype=np.uint8))]
    entries, size = data_file.write_arrays(str(tmp_path / "f.dat"), arrays, 1 << 20)
    offsets = {name: off for name, off, _, _ in entries}
    assert offsets["s"] == 0 and offsets["b"] % A == 0 and offsets["c"] % A == 0
    assert offsets["t"] % 64 == 0 and offsets["t"] % A != 0
    data = (tmp_path / "f.dat").read_bytes()
    for (_, a), (_, off, nbytes, _) in zip(arrays, entries):
        assert data[off:off + nbytes] == a.tobytes()


@pytest.mark.parametrize("nbytes,misalign,offset", [
    (3 * A, 0, 0),                 # all direct
    (5 * A + 123, 0, 2 * A),       # direct, then a buffered tail
    (5 * A + 123, 8, 2 * A),       # memory not aligned: all buffered
    (5 * A, 0, 100),               # file offset not aligned: all buffered
    (100, 0, 0),                   # shorter than one block
])
def test_write_pieces_at_writes_exactly_the_bytes(tmp_path, nbytes, misalign, offset):
    view = aligned(nbytes, misalign)
    path = str(tmp_path / "f")
    fd = file_of(path, offset + nbytes + 50)
    direct = storage.open_direct(path)
    try:
        left = storage.write_pieces_at(fd, direct, view, offset, 2 * A)
        assert left is direct                     # nothing refused
    finally:
        os.close(fd)
        if direct is not None:
            os.close(direct)
    data = open(path, "rb").read()
    assert data[offset:offset + nbytes] == view.tobytes()
    assert data[:offset] == bytes(offset) and data[offset + nbytes:] == bytes(50)


@pytest.mark.parametrize("misalign", [8, 1000])
def test_memory_not_aligned_goes_direct_through_a_bounce_buffer(tmp_path, monkeypatch, misalign):
    """With ``bounce`` (an aligned buffer smaller than the piece), bytes at an address direct I/O
    cannot take (an application's array) are copied through it and written with direct I/O, a
    bounce at a time; the tail shorter than a block goes through the page cache."""
    view = aligned(7 * A + 123, misalign, seed=9)
    path = str(tmp_path / "f")
    offset = 2 * A
    fd = file_of(path, offset + view.nbytes)
    direct = storage.open_direct(path)
    if direct is None:
        pytest.skip("no O_DIRECT here")
    real, calls = os.pwrite, []

    def pwrite(f, data, at):
        calls.append((f == direct, at, memoryview(data).nbytes))
        return real(f, data, at)
    monkeypatch.setattr(os, "pwrite", pwrite)
    try:
        assert storage.write_pieces_at(fd, direct, view, offset, 4 * A, bounce=storage.aligned_buffer(3 * A)) is direct
    finally:
        monkeypatch.undo()
        os.close(fd)
        os.close(direct)
    assert calls[:3] == [(True, offset, 3 * A), (True, offset + 3 * A, 3 * A), (True, offset + 6 * A, A)]
    assert all(not d for d, _, _ in calls[3:]) and sum(n for _, _, n in calls[3:]) == 123
    assert open(path, "rb").read()[offset:] == view.tobytes()


def test_direct_bytes_is_the_aligned_prefix():
    view = aligned(3 * A + 5)
    assert storage.direct_bytes(view, 0) == 3 * A
    assert storage.direct_bytes(view, 512) == 0
    assert storage.direct_bytes(view[8:], 0) == 0
    assert storage.direct_bytes(view[:A - 1], 0) == 0


def test_a_refused_direct_write_falls_back_to_the_page_cache(tmp_path, monkeypatch):
    """EINVAL from a direct write (a file system that opens O_DIRECT but cannot do it): the
    direct descriptor is closed, None returned, and every byte still written."""
    view = aligned(6 * A)
    path = str(tmp_path / "f")
    fd = file_of(path, view.nbytes)
    direct = os.open(path, os.O_WRONLY)          # stands in for the O_DIRECT descriptor
    real = os.pwrite
    calls = []

    def pwrite(f, data, at):
        if f == direct:
            calls.append(at)
            if len(calls) == 2:
                raise OSError(errno.EINVAL, "Invalid argument")
        return real(f, data, at)
    monkeypatch.setattr(os, "pwrite", pwrite)
    try:
        assert storage.write_pieces_at(fd, direct, view, 0, 2 * A) is None
        with pytest.raises(OSError):
            os.fstat(direct)                       # closed by write_pieces_at
    finally:
        os.close(fd)
    assert calls == [0, 2 * A]
    assert open(path, "rb").read() == view.tobytes()


@pytest.mark.parametrize("direct", [True, False])
def test_node_writer_takes_growing_prefixes(tmp_path, direct):
    """The cache write hands over final prefixes as it copies (early=True): only whole pieces
    go until the item is complete; small items and an item never handed over are written later;
    the file holds every item at its offset."""
    piece = 4 * A
    big = aligned(10 * piece + 777, seed=1)
    small = aligned(300, seed=2)
    late = aligned(3 * A, seed=3)
    targets = {0: (0, big.nbytes), 1: (12 * piece, small.nbytes), 3: (13 * piece, late.nbytes)}
    path = str(tmp_path / "node.h5")
    os.close(file_of(path, 14 * piece))
    w = NodeWriter(path, targets, piece, direct)
    for done in range(0, big.nbytes, 3 * A):       # prefixes, as copy_and_hash reports them
        w.write(0, big[:done], early=True)
        assert w.given.get(0, 0) % A == 0
    assert w.missing(0)
    w.write(0, big, early=True)                    # complete: the tail goes too
    w.write(1, small, early=True)
    w.write(2, small, early=True)                  # not this rank's: ignored
    assert not w.missing(0) and not w.missing(1) and not w.missing(2) and w.missing(3)
    assert w.close() is None                       # drained; handing over more restarts it
    w.write(3, late)
    assert w.close() is None and not w.missing(3)
    data = open(path, "rb").read()
    for i, v in ((0, big), (1, small), (3, late)):
        at, n = targets[i]
        assert data[at:at + n] == v.tobytes()


def test_node_writer_reports_its_error_and_a_test_fault(tmp_path):
    w = NodeWriter(str(tmp_path / "missing" / "node.h5"), {0: (0, A)}, A, True)
    w.write(0, aligned(A))
    assert isinstance(w.close(), FileNotFoundError)
    path = str(tmp_path / "node.h5")
    os.close(file_of(path, 4 * A))

    def interrupt():
        raise KeyboardInterrupt("injected")
    w = NodeWriter(path, {0: (0, 4 * A)}, A, True, fault=interrupt)
    w.write(0, aligned(4 * A))
    assert isinstance(w.close(), KeyboardInterrupt)


def _node_index(step, shapes, dtype="<f8", checksum="00" * 8):
    """A two-rank node's index: array ``a`` of ``shapes[r]`` per rank, plus a block-layout ``g``."""
    from hpcckpt.levels.pfs_index import Block, Entry, Index
    a = Entry("a", dtype, "rank", None, tuple(Block(s, None, checksum) for s in shapes))
    g = Entry("g", "<i4", "block", (2, 3), (Block((1, 3), (0, 0), checksum), Block((1, 3), (1, 0), checksum)))
    return Index(name="job", step=step, ckpt_id=f"id{step}", world_size=2, created=0.0, node_of=(0, 0), files={},
                 arrays=(a, g), epoch=1, state_keys={})


def test_a_retired_node_file_of_the_same_layout_is_reused_in_place(tmp_path):
    """reuse_node_file: same datasets -> same offsets, the attributes of the new step; another
    layout (shape, dtype) -> None, the file left for relayout_node_file, which makes it, on the
    same inode, the file create_node_file makes (its bytes outside the datasets the same); an
    unreadable file -> None and removed."""
    import h5py
    from hpcckpt.levels import pfs_files as files
    path = str(tmp_path / "node_0.h5")
    shapes = [(20000,), (30001,)]
    offsets = files.create_node_file(path, _node_index(4, shapes), 0, [0, 1], 0o600)
    assert all(off % A == 0 for (r, name), off in offsets.items() if name == "a")
    inode = os.stat(path).st_ino
    assert files.reuse_node_file(path, _node_index(9, shapes, checksum=None), 0, [0, 1]) == offsets
    assert os.stat(path).st_ino == inode
    with h5py.File(path, "r") as f:
        assert int(f.attrs["step"]) == 9 and files.to_str(f.attrs["ckpt_id"]) == "id9"
        assert files.to_str(f["rank_000001/a"].attrs["checksum"]) == ""       # set_checksums fills it
        assert list(f["rank_000001/g"].attrs["global_offset"]) == [1, 0]
    files.set_checksums(path, {0: {"a": "ab" * 8}, 1: {"a": "cd" * 8, "g": "ef" * 8}})
    with h5py.File(path, "r") as f:
        assert files.to_str(f["rank_000001/a"].attrs["checksum"]) == "cd" * 8
    fresh = str(tmp_path / "fresh.h5")
    for other in (_node_index(10, [(20000,), (30002,)]), _node_index(10, [(9000,), (40000,)]),
                  _node_index(10, shapes, dtype="<f4")):
        # another layout: left as it is; relayout_node_file makes it the new file on the same inode
        assert files.reuse_node_file(path, other, 0, [0, 1]) is None and os.stat(path).st_ino == inode
        got = files.relayout_node_file(path, other, 0, [0, 1], 0o600)
        want = files.create_node_file(fresh, other, 0, [0, 1], 0o600)
        assert got == want and os.stat(path).st_ino == inode and not os.path.exists(path + ".layout")
        size = os.path.getsize(fresh)
        outside = files.metadata_extents(size, [(off, other.entry(n).nbytes(r)) for (r, n), off in want.items()])
        assert os.path.getsize(path) == size
        assert files.extents_digest(path, outside) == files.extents_digest(fresh, outside)
        with h5py.File(path, "r") as f:
            assert f["rank_000001/a"].shape == other.entry("a").blocks[1].shape and int(f.attrs["step"]) == 10
        os.unlink(fresh)
    assert files.reuse_node_file(path, _node_index(10, shapes), 0, [0]) is None     # another node's ranks
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")                               # unreadable: removed
    assert files.reuse_node_file(str(tmp_path / "junk.h5"), _node_index(10, shapes), 0, [0, 1]) is None
    assert not os.path.exists(tmp_path / "junk.h5")


def _piped_write(path, arrays, chunk=1 << 20, handed=None, finals=None):
    """data_file.write_arrays with on_chunk (as the sync pfs flush calls it): its entries, and per
    array the prefix lengths handed over (into ``handed``, when given) and whether each came
    with the mapped file's bytes (into ``finals``)."""
    handed = {} if handed is None else handed
    finals = {} if finals is None else finals

    def on_chunk(i, final, source):
        if final is not None:                   # the mapped file's bytes: read-only, the source's
            assert not final.flags.writeable and final.nbytes == source.nbytes
            assert final.tobytes() == source.tobytes()
        handed.setdefault(i, []).append(source.nbytes)
        finals.setdefault(i, set()).add(final is not None)
    entries, size = data_file.write_arrays(path, arrays, chunk, on_chunk=on_chunk)
    return entries, size, handed


def test_on_chunk_hands_over_growing_prefixes_of_a_new_file_and_of_an_overwritten_one(tmp_path):
    """write_arrays' "mmap" method writes a new file with pwrite (on_chunk gets the source's
    prefixes, no mapped bytes, and nothing is fallocated) and copies into the mapping of an
    existing one (on_chunk gets the mapped file's final bytes; its blocks, all there, are not
    allocated again); both give the file and the checksums of a write without on_chunk, and
    every array's prefixes grow to its whole size."""
    arrays = [("big", aligned(9 * (1 << 20) + 123, seed=4)), ("small", aligned(100, seed=5)),
              ("second", aligned(5 * (1 << 20), seed=6))]
    allocated = []
    real = os.posix_fallocate

    def fallocate(fd, offset, length):
        allocated.append((offset, length))
        return real(fd, offset, length)
    plain, plain_size = data_file.write_arrays(str(tmp_path / "plain"), arrays, 1 << 20)
    for new in (True, False):                    # the second write goes over the first's file
        handed, finals = {}, {}
        os.posix_fallocate = fallocate
        try:
            entries, size, handed = _piped_write(str(tmp_path / "piped"), arrays, handed=handed, finals=finals)
        finally:
            os.posix_fallocate = real
        assert (entries, size) == (plain, plain_size) and allocated == []
        assert open(tmp_path / "piped", "rb").read() == open(tmp_path / "plain", "rb").read()
        for i, (_, a) in enumerate(arrays):
            assert handed[i] == sorted(handed[i]) and handed[i][-1] == a.nbytes
            assert finals[i] == {not new}


def test_an_overwritten_file_that_grew_has_only_its_tail_allocated(tmp_path):
    """Into the mapping of an existing file that the data outgrew, only the grown tail is
    allocated (a full file system then fails with ENOSPC, never SIGBUS)."""
    path = str(tmp_path / "f.dat")
    data_file.write_arrays(path, [("x", np.ones(1000))], 4096)
    allocated = []
    real = os.posix_fallocate

    def fallocate(fd, offset, length):
        allocated.append((offset, length))
        return real(fd, offset, length)
    data = np.arange(5000.0)
    os.posix_fallocate = fallocate
    try:
        entries, size = data_file.write_arrays(path, [("x", data)], 4096)
    finally:
        os.posix_fallocate = real
    assert allocated == [(8000, size - 8000)]
    assert open(path, "rb").read() == data.tobytes()


def test_a_full_file_system_in_the_middle_of_a_piped_copy_raises_enospc(tmp_path):
    """A tmpfs that fills up while a new file is written and handed over: ENOSPC is raised from
    the write (never SIGBUS from a mapped page without a block), after the first chunks were
    handed over."""
    import subprocess
    mnt = str(tmp_path / "small")
    os.makedirs(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {r.stderr.strip()}")
    try:
        handed = {}
        with pytest.raises(OSError) as e:
            _piped_write(os.path.join(mnt, "data"), [("big", aligned(16 << 20, seed=7))], handed=handed)
        assert e.value.errno == errno.ENOSPC           # and this process is alive: no SIGBUS
        assert handed[0] and handed[0][-1] >= 1 << 20  # failed in the middle of the copy
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)
