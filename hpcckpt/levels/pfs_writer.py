"""One rank's writes into its pfs node file: ``NodeWriter``, a thread of its own that writes the
bytes handed over at their offsets (``os.pwrite``; direct I/O where it can), in pieces of
``WRITE_PIECE``. Local, no MPI.
"""
import os

from .. import storage
from ..watchdog import watch

WRITE_PIECE = 8 << 20
"""Bytes per pwrite of the node files (at least ``io_chunk``). With ``pfs_direct_io`` the
4 KiB-aligned part of each array goes to the device straight from the cache's mapping (O_DIRECT);
the rest goes through the page cache, and the kernel starts writing each such piece right after
it (storage.start_writeback), so that the final fsync has less left to do (docs/PFS.md, "The
flush protocol")."""


class NodeWriter:
    """Local: one rank's writes into its node file, in a thread of their own. ``targets``:
    {item number: (file offset, nbytes)}. Large parts go with direct I/O when ``direct``: from
    their own memory when it is aligned, else through ``bounce`` (storage.write_pieces_at).
    ``close()`` waits for what was handed over and returns the first error (an exception, or
    None); handing over more starts the thread again."""

    def __init__(self, path, targets, piece, direct, fault=None, bounce=None):
        self.path, self.targets, self.piece, self.direct, self.fault = path, targets, piece, direct, fault
        self.bounce = bounce      # for bytes whose address is not aligned (storage.write_pieces_at)
        self.given = {}               # item number -> bytes handed over so far
        self.error = None
        self._queue = self._thread = None

    def missing(self, i):
        """True when item ``i`` is this rank's and not all of its bytes were handed over."""
        return i in self.targets and self.given.get(i, 0) < self.targets[i][1]

    def write(self, i, data, early=False):
        """Hand over the bytes of item ``i`` that ``data`` (a uint8 view of its first bytes) adds.
        ``early``: more will follow; hand over only whole ``piece``s (DIRECT_ALIGN-aligned
        ends) until ``data`` is the whole item."""
        if i not in self.targets:
            return
        at, nbytes = self.targets[i]
        start, end = self.given.get(i, 0), data.nbytes
        if early and end < nbytes:
            end = end // storage.DIRECT_ALIGN * storage.DIRECT_ALIGN
            if end - start < self.piece:
                return
        if end <= start:
            return
        if self._thread is None:
            import queue
            import threading
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="hpcckpt-pfs-write", daemon=True)
            self._thread.start()
        self._queue.put((data[start:end], at + start))
        self.given[i] = end

    def _run(self):
        fd = direct = None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
            direct = storage.open_direct(self.path) if self.direct else None
            while (job := self._queue.get()) is not None:
                if self.error is None:
                    direct = storage.write_pieces_at(fd, direct, job[0], job[1], self.piece, self.fault, self.bounce)
                del job
        except BaseException as e:   # noqa: BLE001 - close() hands it to the caller (a test fault's exit too)
            self.error = self.error or e
        finally:
            for f in (fd, direct):
                if f is not None:
                    os.close(f)

    def close(self):
        if self._thread is not None:
            self._queue.put(None)
            with watch("this rank's pfs writer thread (writing %s)", self.path):
                self._thread.join()
            self._thread = self._queue = None      # what a failed thread left queued is released
        return self.error
