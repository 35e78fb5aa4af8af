"""One job per name and directory: an advisory lock file held while a Checkpointer is open (local).

Two jobs with the same ``name`` writing into the same cache or pfs directory would overwrite each
other's commits. Each rank holds ``flock`` on ``<job dir>/.lock.rank_<R>`` in its node cache, and
rank 0 on ``<pfs_dir>/<name>/.lock`` once it uses the pfs level; a second job of the same name
there finds the lock taken and is refused. The kernel drops the lock when the process ends, also
when it is killed, so a relaunch after a crash never finds a stale lock. File systems without
``flock`` (some parallel file systems mounted without it) only get a warning.
"""
import errno
import fcntl
import logging
import os
import socket

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

    def release(self):
        """Local: free the lock (harmless twice). The file stays: removing it would race."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _read_holder(fd):
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f" by {text}" if text else ""
