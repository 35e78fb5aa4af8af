"""MPICH's shared-memory segments in /dev/shm: removing what a killed job left behind, safely.

A job killed with SIGKILL leaves its ``/dev/shm/mpich*`` segments behind. They must be removed
by whoever launched it — but only its own: deleting the segment of another job that is starting
at that moment makes that job's MPI_Init hang for good. So a segment is removed only when it
appeared during our job AND no live process maps it or holds it open. Local, best effort.
"""
import glob
import os

SHM = "/dev/shm"


def snapshot():
    """The MPICH segments present now (call before starting a job)."""
    return set(glob.glob(os.path.join(SHM, "mpich*")))


def in_use(paths):
    """The subset of ``paths`` that some live process maps or holds open."""
    used = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                text = f.read()
        except OSError:
            continue
        used.update(p for p in paths if p in text)
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            target = os.readlink(fd).split(" (deleted)")[0]
        except OSError:
            continue
        if target in paths:
            used.add(target)
    return used


def remove_leftovers(before):
    """Remove the segments that appeared since ``before`` and nobody uses any more."""
    new = snapshot() - before
    for path in new - in_use(new):
        try:
            os.unlink(path)
        except OSError:
            pass
