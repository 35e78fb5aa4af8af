"""The data file of a rank's arrays in the node cache (``rank_<R>.dat``), all local: where each
array goes in it (``file_layout``: 4 KiB-aligned when large, for direct I/O), writing the arrays
with their checksums in the same pass (``write_arrays``: the "mmap" or "pwrite" method), the
mappings kept open between checkpoints (``Mappings``), and reading the arrays back
(``read_into``). The file primitives it is built on (and verify_file) are in storage.py."""
import mmap
import os

import numpy as np

from .codecs.checksum import hexdigest_of, new_hasher
from .codecs.xxh3 import copy_and_hash
from .storage import DIRECT_ALIGN, PAGE_ALIGN_MIN, byte_view, open_checked, pread_into, pwrite_all

# write_method "pwrite" and verify_file hash data right after writing (or reading) it in pieces
# this small, while the piece is still in the CPU cache: a cache-hot pass instead of a second
# trip to memory ("mmap" hashes in the copy itself; docs/BENCHMARKS.md, "Integrity").
HASH_PIECE = 128 << 10
# write_method "mmap" needs Linux's MAP_POPULATE and posix_fallocate; elsewhere "pwrite" is used.
_CAN_MAP = hasattr(mmap, "MAP_POPULATE") and hasattr(os, "posix_fallocate")


def align(n, to=64):
    return (n + to - 1) // to * to


def array_offset(offset, nbytes):
    """Local: where an array of ``nbytes`` goes in a data file whose previous array ends at ``offset``."""
    return align(offset, DIRECT_ALIGN if nbytes >= PAGE_ALIGN_MIN else 64)


def file_layout(arrays):
    """Local: where write_arrays puts (name, array) pairs: [(name, offset, nbytes)] and the file size."""
    layout, offset = [], 0
    for name, array in arrays:
        offset = array_offset(offset, array.nbytes)
        layout.append((name, offset, array.nbytes))
        offset += array.nbytes
    return layout, (layout[-1][1] + layout[-1][2] if layout else 0)


class Mappings:
    """Local: the shared, populated mappings of the last ``limit`` data files written (keyed by
    device and inode), kept open between checkpoints. With ``reuse_files`` the data files
    rotate (the retired file is overwritten next), so the next write into a file finds its
    mapping ready: no MAP_POPULATE of every page, no munmap (together more than the copy itself
    for large arrays). A mapping is reused after the writer has sized the file; for a file whose
    size changed (a state that grows or shrinks) it is resized with mremap; one whose file was unlinked is dropped at the next ``get`` (its memory is
    freed then), and ``close()`` drops them all. Each entry keeps its file open."""

    def __init__(self, limit):
        import threading
        self.limit = limit
        self._maps = {}               # (dev, ino) -> (fd, size, mmap), oldest first
        self._lock = threading.Lock()  # a background flush looks mappings up while a checkpoint writes

    def get(self, fd, size):
        """The mapping of the open file ``fd``, exactly ``size`` bytes long (already sized)."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            self._drop_unlinked(key)
            entry = self._maps.pop(key, None)
            if entry is not None and entry[1] != size:
                entry = _resized(entry, size)
            if entry is not None:
                self._maps[key] = entry   # now the newest
                return entry[2]
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            self._maps[key] = (os.dup(fd), size, mapping)
            while len(self._maps) > self.limit:
                _close_mapping(self._maps.pop(next(iter(self._maps))))
            return mapping

    def find(self, fd, size):
        """The mapping kept for the open file ``fd`` if it is ``size`` bytes long, else None."""
        st = os.fstat(fd)
        with self._lock:
            entry = self._maps.get((st.st_dev, st.st_ino))
            return entry[2] if entry is not None and entry[1] == size and st.st_size == size else None

    def _drop_unlinked(self, keep):
        for key, entry in list(self._maps.items()):
            if key != keep and os.fstat(entry[0]).st_nlink == 0:
                _close_mapping(self._maps.pop(key))

    def close(self):
        with self._lock:
            while self._maps:
                _close_mapping(self._maps.popitem()[1])


def _resized(entry, size):
    """Local: a kept mapping ``entry`` of a file now ``size`` bytes long, moved with mremap
    (mmap.resize: the pages it had stay mapped, only a grown tail is faulted in as written), or
    None (closed) where it cannot be resized: views of it still in use, or no mremap."""
    fd, _, mapping = entry
    try:
        mapping.resize(size)
    except (BufferError, OSError, SystemError, ValueError):
        _close_mapping(entry)
        return None
    return fd, size, mapping


def _close_mapping(entry):
    fd, _, mapping = entry
    try:
        mapping.close()
    except BufferError:     # a view is still in use (a background flush): unmapped when it is collected
        pass
    os.close(fd)


def write_arrays(path, arrays, chunk, mode=0o600, fsync=False, reuse=None, fault=None, method="mmap",
                 on_written=None, on_chunk=None, mappings=None):
    """Write arrays back to back into one file (at array_offset: 4 KiB-aligned when large,
    64-byte aligned otherwise), hashing each while writing.

    ``arrays`` is a list of (name, array). ``method`` "mmap" copies each array into the file
    mapped in memory and hashes it in the same pass (codecs.xxh3), except into a new (empty)
    file whose mapping is not to be kept (no ``mappings``), which it writes as "pwrite" does (on
    tmpfs a write() into new pages costs about half what faulting them into a mapping, then
    unmapping them, does); "pwrite" writes each ``chunk``
    in HASH_PIECE system calls, hashing each piece just after it is written. If ``reuse`` names an
    existing file, it is renamed to ``path`` and overwritten in place (much faster than a new file
    on tmpfs). Returns a list of (name, offset, nbytes, checksum hex) and the file size.
    ``fault()``, a test hook, is called after each chunk. ``on_written(file_bytes)``: called
    with the whole written file before it is closed — a uint8 view of its mapping, or a
    FileBytes reading it — (the incremental block digests not taken during the copy are
    computed there). ``on_chunk(i, final, source)``: called after each ``chunk`` of array ``i``
    with a read-only view of its bytes in the mapped file that are final so far (a growing
    prefix; None when the file is not mapped) and the same prefix of the source array (still in
    the CPU cache: the incremental block digests are taken there; the sync pfs flush writes
    the final bytes, or these, out meanwhile); its views must be released before on_written
    returns.
    ``mappings`` (a Mappings): with the "mmap" method, the file's mapping is taken from there and
    left open in it.
    """
    if reuse is not None:
        try:
            os.replace(reuse, path)
        except FileNotFoundError:
            pass
    layout, size = file_layout(arrays)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, mode)
    try:
        if method == "mmap" and size and _CAN_MAP and (mappings is not None or os.fstat(fd).st_size):
            digests = _write_mapped(fd, size, arrays, layout, chunk, fault, on_written, on_chunk, mappings)
        else:
            digests = _write_pieces(fd, arrays, layout, chunk, fault, on_chunk)
            os.ftruncate(fd, size)
            if on_written is not None:
                on_written(FileBytes(fd, size))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return [(name, offset, nbytes, digest) for (name, offset, nbytes), digest in zip(layout, digests)], size


def _chunk_hook(i, src, dst, fault, on_chunk):
    """The after_chunk(done) of array ``i``'s copy of ``src`` into ``dst``: the fault hook, then
    on_chunk."""
    if fault is None and on_chunk is None:
        return None

    def after_chunk(done):
        if fault is not None:
            fault()
        if on_chunk is not None:
            final = dst[:done]
            final.flags.writeable = False
            on_chunk(i, final, src[:done])
    return after_chunk


class FileBytes:
    """Local: the bytes of an open file, read on slicing (``file[lo:hi]``, a uint8 array)."""

    def __init__(self, fd, size):
        self.fd, self.size = fd, size

    def __getitem__(self, s):
        lo, hi, _ = s.indices(self.size)
        return np.frombuffer(os.pread(self.fd, max(0, hi - lo), lo), np.uint8)


def _write_mapped(fd, size, arrays, layout, chunk, fault, on_written=None, on_chunk=None, mappings=None):
    """write_arrays' "mmap" method: copy and hash in one pass into the mapped file."""
    before = os.fstat(fd)
    os.ftruncate(fd, size)
    # Every block must exist before it is copied to: a page the file system cannot give to a
    # mapped write kills the process with SIGBUS, where fallocate fails with a clean ENOSPC. An
    # overwritten file has them all already up to its old size (and fallocate would walk its
    # pages for nothing): only a tail it grew by is allocated.
    allocated = before.st_size if before.st_blocks * 512 >= before.st_size else 0
    if allocated < size:
        os.posix_fallocate(fd, allocated, size - allocated)
    # MAP_POPULATE maps every page up front, which costs about what faulting them in during the
    # copy does; with on_chunk (the sync pfs flush writes each chunk as it is copied) the pages
    # are faulted in as copied instead, so the first chunk is handed over without waiting for all
    populate = mmap.MAP_POPULATE if on_chunk is None else 0
    mapping = mappings.get(fd, size) if mappings is not None else \
        mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate)
    try:
        file_bytes = np.frombuffer(mapping, np.uint8)
        digests = []
        for i, ((_, array), (_, offset, nbytes)) in enumerate(zip(arrays, layout)):
            src, dst = byte_view(array), file_bytes[offset:offset + nbytes]
            digests.append(hexdigest_of(copy_and_hash(src, dst, chunk, _chunk_hook(i, src, dst, fault, on_chunk))))
            del src, dst
        if on_written is not None:
            on_written(file_bytes)
        del file_bytes
    finally:
        if mappings is None:
            try:
                mapping.close()
            except BufferError:   # a fault's traceback still holds a view: unmapped when collected
                pass
    return digests


def _write_pieces(fd, arrays, layout, chunk, fault, on_chunk=None):
    """write_arrays' "pwrite" method (and "mmap" into a new file it keeps no mapping of):
    HASH_PIECE system calls, each piece hashed after its write."""
    digests = []
    for i, ((_, array), (_, offset, nbytes)) in enumerate(zip(arrays, layout)):
        src = byte_view(array)
        data = memoryview(src)   # memoryview slices are the cheapest
        hasher = new_hasher()
        update = hasher.update
        piece_size = min(chunk, HASH_PIECE)
        for start in range(0, nbytes, chunk):
            end = min(start + chunk, nbytes)
            for at in range(start, end, piece_size):
                piece = data[at:min(at + piece_size, end)]
                pwrite_all(fd, piece, offset + at)
                update(piece)   # after the write: the piece is in the CPU cache now
            if fault is not None:
                fault()
            if on_chunk is not None:
                on_chunk(i, None, src[:end])
        digests.append(hasher.hexdigest())
    return digests


def read_into(path, expected_size, targets, chunk, fault=None):
    """Read (array, offset) pairs straight into the arrays' memory (no copy, no hashing)."""
    fd = open_checked(path, expected_size)
    try:
        for array, offset in targets:
            data = byte_view(array)
            for start in range(0, data.nbytes, chunk):
                pread_into(fd, data[start:start + chunk], offset + start, path)
                if fault is not None:
                    fault()
    finally:
        os.close(fd)
