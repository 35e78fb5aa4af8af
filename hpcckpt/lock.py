"""One job per name and directory: an advisory lock file held while a Checkpointer is open (local).

Two jobs with the same ``name`` writing into the same cache or pfs directory would overwrite each
other's commits. Each rank holds ``flock`` on ``<job dir>/.lock.rank_<R>`` in its node cache, and
rank 0 on ``<pfs_dir>/<name>/.lock`` once it uses the pfs level; a second job of the same name
there finds the lock taken and is refused. The kernel drops the lock when the process ends, also
when it is killed, so a relaunch after a crash never finds a stale lock. A process forked by the
application (a multiprocessing pool, a helper) closes its copies of the lock descriptors at once,
and ``release()`` unlocks before closing: a child that outlives the Checkpointer or its parent
holds no lock. File systems without ``flock`` (some parallel file systems mounted without it)
only get a warning.
"""
import errno
import fcntl
import logging
import os
import socket
import weakref

from .errors import ConcurrentJobError

log = logging.getLogger("hpcckpt")


class DirLock:
    """An exclusive advisory lock on one file; ``release()`` (or process exit) frees it."""

    def __init__(self, path, what, mode=0o600):
        self.path, self.fd = path, None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):   # nothing can be written there anyway
                log.debug("cannot create the lock file %s: %s", path, e.strerror)
                return
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConcurrentJobError(f"another job is using {what} ({path} is locked{holder}); two jobs with "
                                         "the same name must not share their directories: give one another "
                                         "name or other directories") from None
            log.warning("cannot lock %s (%s): a second job of the same name would not be detected", path,
                        e.strerror)
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self.fd = fd
        _HELD.add(self)

    def release(self):
        """Local: free the lock (harmless twice). The file stays: removing it would race."""
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)      # also for a forked child's copy of the descriptor
            finally:
                os.close(self.fd)
                self.fd = None
            _HELD.discard(self)


_HELD = weakref.WeakSet()


def _close_in_child():
    """In a forked child: close the copies of the held locks' descriptors without unlocking
    (the lock is the parent's; it is freed when the parent releases it or ends)."""
    for lock in list(_HELD):
        if lock.fd is not None:
            try:
                os.close(lock.fd)
            except OSError:
                pass
            lock.fd = None
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


def running_jobs(job_dirs, proc_locks="/proc/locks"):
    """Local: ["<lock file>, held by pid <P> on <host>", ...] for the lock files in ``job_dirs``
    that a process of this host holds now. Read from Linux's /proc/locks, so the test never
    takes a lock (a job starting at that moment is not refused); elsewhere: []."""
    try:
        with open(proc_locks) as f:
            held = {_lock_id(line) for line in f if " FLOCK " in line}
    except OSError:
        return []
    out = []
    for d in sorted(set(job_dirs)):
        try:
            names = sorted(n for n in os.listdir(d) if n == ".lock" or n.startswith(".lock.rank_"))
        except OSError:
            continue
        for n in names:
            path = os.path.join(d, n)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in held:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except OSError:
                    out.append(path)
                    continue
                try:
                    out.append(f"{path}, held{_read_holder(fd)}")
                finally:
                    os.close(fd)
    return out


def _lock_id(line):
    """(major, minor, inode) of one /proc/locks line ('1: FLOCK ADVISORY WRITE 29370 00:1b:1286441 0 EOF')."""
    for word in line.split():
        parts = word.split(":")
        if len(parts) == 3 and all(parts):
            try:
                return int(parts[0], 16), int(parts[1], 16), int(parts[2])
            except ValueError:
                continue
    return None


def _read_holder(fd):
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f" by {text}" if text else ""
