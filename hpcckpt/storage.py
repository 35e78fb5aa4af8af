"""The file primitives every level builds on (all local): directories of the library's own
(never through a planted link), safe paths, fsync, atomic writes and JSON documents, removal
(now, or by the background Deleter), positioned and direct I/O (O_DIRECT, early writeback), and
the re-hash of a file's checksummed byte ranges (verify_file). The data file of a rank's arrays
(layout, writing with checksums, kept mappings) is data_file.py."""
import concurrent.futures
import errno
import json
import logging
import mmap
import os
import shutil
import stat

import numpy as np

from .codecs.checksum import new_hasher
from .errors import CorruptCheckpointError

log = logging.getLogger("hpcckpt")

MAX_JSON_BYTES = 16 << 20  # a manifest larger than this is refused before parsing


def makedirs(path, mode=0o700):
    """Create a directory and its missing parents, every one of them with ``mode`` (os.makedirs
    gives ``mode`` to the last one only); race-safe between ranks."""
    missing = []
    head = os.path.abspath(path)
    while head and not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def is_own_dir(path):
    """Local: whether ``path`` is a directory itself, not a symbolic link to one (lstat)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def own_dir(path, mode=0o700):
    """Local: make ``path`` a directory of the library's own and return it: created when missing;
    a symbolic link (or any other non-directory) planted there is removed, never followed — with
    a warning — and a directory made in its place. For the directories the library moves files
    into and out of (spares, trash): a link there would move files outside its directories."""
    if is_own_dir(path):
        return path
    if os.path.lexists(path):
        log.warning("%s is %s, not a directory of hpcckpt's: removed (not followed) and replaced by a "
                    "directory", path, "a symbolic link" if os.path.islink(path) else "not a directory")
        try:
            os.unlink(path)
        except (FileNotFoundError, IsADirectoryError):
            pass                # another rank of the node replaced it first
    makedirs(path, mode)
    if not is_own_dir(path):    # planted again, or a directory that cannot be unlinked
        raise OSError(errno.ENOTDIR, "not a directory of hpcckpt's (a symbolic link?)", path)
    return path


def safe_join(root, *parts):
    """Join parts under root; refuse absolute parts, '..' and anything that escapes root."""
    for p in parts:
        if not isinstance(p, str) or not p or os.path.isabs(p) or p in (".", "..") \
                or "/" in p or "\\" in p or "\0" in p:
            raise CorruptCheckpointError(f"refusing path component {p!r} under {root}")
    path = os.path.join(root, *parts)
    if os.path.commonpath([os.path.realpath(root), os.path.realpath(path)]) != os.path.realpath(root):
        raise CorruptCheckpointError(f"refusing {path}: it resolves outside {root}")
    return path


def fsync_dir(path):
    """Make a rename in ``path`` durable."""
    _fsync_path(path, os.O_RDONLY | os.O_DIRECTORY)


def fsync_file(path):
    """Make a file's data durable (a file written by another library, such as h5py)."""
    _fsync_path(path, os.O_RDONLY | os.O_NOFOLLOW)


def _fsync_path(path, flags):
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path, data, mode=0o600, fsync=True):
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync of the directory."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quiet(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(os.path.dirname(path) or ".")


def atomic_write_json(path, obj, mode=0o600, fsync=True):
    """Write a JSON document atomically (see atomic_write_bytes)."""
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode(), mode, fsync)


def read_json(path, max_bytes=MAX_JSON_BYTES):
    """Read a JSON document written by hpcckpt; CorruptCheckpointError if it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CorruptCheckpointError(f"{path}: is a symbolic link; refusing to follow it") from None
        raise
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(min(size, max_bytes) + 1) if size <= max_bytes else b"x" * (max_bytes + 1)
    if len(data) > max_bytes:
        raise CorruptCheckpointError(f"{path}: larger than {max_bytes} bytes; not a manifest")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: not valid JSON ({e})") from None


def _unlink_quiet(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_file(path):
    """Unlink a file; missing is fine."""
    _unlink_quiet(path)


def remove_dir_if_empty(path):
    """rmdir that tolerates a missing or (because another rank still works in it) non-empty dir."""
    try:
        os.rmdir(path)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
            raise


class Deleter:
    """Local: removes files and trees in one background thread (no MPI); ``wait()`` blocks until
    what was submitted is done. Failures are logged, never raised: what remains is removed by a
    later retire."""

    def __init__(self, thread_name):
        self._pool, self._pending, self._name = None, [], thread_name

    def remove(self, path, keep=None, spare=None):
        """Remove ``path`` (a file, or a tree; with ``keep``, a regular expression, the files
        whose names match stay, and so does the directory if they do). ``spare``: a file path
        ``path`` (a regular file) is moved to instead, if nothing is there yet."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._name)
        self._pending.append(self._pool.submit(remove_path, path, keep, spare))

    def wait(self):
        for f in self._pending:
            f.result()
        self._pending = []


def remove_path(path, keep=None, spare=None):
    """Local: Deleter.remove's work, done now (failures logged)."""
    try:
        if spare is not None and os.path.isfile(path) and not os.path.islink(path) and not os.path.lexists(spare):
            os.replace(path, spare)
            return
        if os.path.isdir(path) and not os.path.islink(path):
            if keep is None:
                remove_tree(path)
                return
            for name in os.listdir(path):
                if not keep.fullmatch(name):
                    remove_path(os.path.join(path, name))
            remove_dir_if_empty(path)    # other nodes' files still there: their aggregators remove them
        else:
            remove_file(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)


def remove_tree(path):
    """Local: shutil.rmtree; missing is fine, a symbolic link is unlinked (never followed), other
    failures are logged (a later retire retries)."""
    try:
        if os.path.islink(path):
            os.unlink(path)
            return
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)


def byte_view(array):
    """A flat uint8 view of a C-contiguous array (no copy)."""
    return array.reshape(-1).view(np.uint8)


DIRECT_ALIGN = 4096
"""Address, file offset and length unit of direct I/O (O_DIRECT): 4 KiB suits devices of 512-byte
and of 4 KiB logical blocks."""
PAGE_ALIGN_MIN = 64 << 10
"""Arrays at least this large start at a DIRECT_ALIGN offset of a local data file, so that the
pfs flush can write them from their mapping with direct I/O; smaller ones are 64-byte aligned."""


def open_direct(path):
    """Local: ``path`` opened for writing with direct I/O (O_DIRECT: the device reads the bytes
    from the process's memory, no copy into the page cache), or None where the OS or the file
    system does not do direct I/O."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_NOFOLLOW | flag)
    except OSError as e:
        if e.errno == errno.EINVAL:       # tmpfs before Linux 6.6, some FUSE and network file systems
            return None
        raise


def aligned_buffer(nbytes):
    """Local: a uint8 buffer of ``nbytes`` whose address is page-aligned (anonymous memory)."""
    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


def direct_bytes(view, offset):
    """Local: how many leading bytes of ``view`` (uint8) may go to ``offset`` with direct I/O: 0
    unless its address and the offset are DIRECT_ALIGN-aligned, else its length rounded down."""
    if view.nbytes < DIRECT_ALIGN or offset % DIRECT_ALIGN or view.ctypes.data % DIRECT_ALIGN:
        return 0
    return view.nbytes // DIRECT_ALIGN * DIRECT_ALIGN


def write_pieces_at(fd, direct_fd, view, offset, piece, fault=None, bounce=None):
    """Local: write ``view`` (uint8) at ``offset`` in system calls of ``piece`` bytes: its aligned
    part through ``direct_fd`` (the file opened with open_direct, or None), the rest through
    ``fd`` with early writeback (start_writeback). ``bounce``: a DIRECT_ALIGN-aligned uint8
    buffer through which a view whose address is not aligned (an application's array) still
    goes with direct I/O, a ``bounce``-sized piece at a time. Returns ``direct_fd``, or None after
    closing it when the file system refused a direct write (EINVAL): the rest goes through
    ``fd``. ``fault()``, a test hook, is called after each piece."""
    start = 0
    direct = direct_bytes(view, offset) if direct_fd is not None else 0
    staged = (not direct and direct_fd is not None and bounce is not None and view.nbytes >= DIRECT_ALIGN
              and offset % DIRECT_ALIGN == 0)
    if staged:
        direct, piece = view.nbytes // DIRECT_ALIGN * DIRECT_ALIGN, min(piece, bounce.nbytes)
    while start < direct:
        end = min(start + piece, direct)
        src = view[start:end]
        if staged:
            src = bounce[:end - start]
            np.copyto(src, view[start:end])
        try:
            n = os.pwrite(direct_fd, src, offset + start)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            os.close(direct_fd)
            direct_fd, direct = None, start
            break
        if n <= 0 or n % DIRECT_ALIGN:     # a short direct write: the rest buffered
            start += max(n, 0)
            direct = start
            break
        start += n
        if fault is not None:
            fault()
    for at in range(start, view.nbytes, piece):
        end = min(at + piece, view.nbytes)
        pwrite_all(fd, view[at:end], offset + at)
        start_writeback(fd, offset + at, end - at)
        if fault is not None:
            fault()
    return direct_fd



def _load_sync_file_range():
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):       # not Linux / not glibc: writeback starts at fsync
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd, offset, nbytes):
    """Local: ask the kernel to start writing ``nbytes`` at ``offset`` of ``fd`` to the device now
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``: it does not wait and makes nothing
    durable; the fsync that follows does, with less left to write). A no-op where unsupported."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)   # advisory: its errors are the fsync's


def pwrite_all(fd, view, offset):
    """Write all of ``view`` at ``offset`` (local)."""
    view = memoryview(view)
    while view:
        n = os.pwrite(fd, view, offset)
        if n == 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view, offset = view[n:], offset + n


def pread_into(fd, view, offset, path):
    """Fill ``view`` from ``offset``; CorruptCheckpointError when the file ends first (local)."""
    view = memoryview(view)
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise CorruptCheckpointError(f"{path}: truncated (ends before byte {offset + len(view)})")
        view, offset = view[n:], offset + n


def open_checked(path, expected_size):
    """Open a data file for reading and check its size; CorruptCheckpointError if wrong."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path}: missing") from None
    except OSError as e:
        raise CorruptCheckpointError(f"{path}: cannot open ({e.strerror})") from None
    size = os.fstat(fd).st_size
    if size != expected_size:
        os.close(fd)
        raise CorruptCheckpointError(f"{path}: size {size} bytes, the manifest says {expected_size} "
                                     f"({'truncated' if size < expected_size else 'too long'})")
    return fd


def verify_file(path, expected_size, entries, buffer):
    """Re-hash every (name, offset, nbytes, checksum) entry of a file; raise on any difference.

    ``buffer`` is a reusable uint8 array (its size is the read chunk; data_file.HASH_PIECE is the fastest:
    each piece is hashed while it is still in the CPU cache).
    """
    fd = open_checked(path, expected_size)
    try:
        for name, offset, nbytes, checksum in entries:
            hasher = new_hasher()
            for start in range(0, nbytes, buffer.nbytes):
                piece = buffer[:min(buffer.nbytes, nbytes - start)]
                pread_into(fd, piece, offset + start, path)
                hasher.update(piece)
            if hasher.hexdigest() != checksum:
                raise CorruptCheckpointError(f"{path}: array {name!r} fails its checksum "
                                             f"({hasher.hexdigest()} != {checksum})")
    finally:
        os.close(fd)
