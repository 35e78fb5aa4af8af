"""Bounds on the blocking MPI calls of an online job (hpcckpt.online) that cannot be polled, the
shrink and MPI_Finalize: past a deadline a timer thread ends the process, without any MPI call
from the thread. Local.
"""
import os
import time

FINALIZE_TIMEOUT = 5.0     # seconds MPI_Finalize gets at exit once a failure was seen (see bound_finalize)


class ExitAtDeadline:
    """``with ExitAtDeadline(deadline, message):`` a blocking MPI call that cannot be polled: past
    ``deadline`` (time.monotonic) a timer thread prints ``message`` to stderr and ends this
    process with exit status 3 (no MPI call from the thread)."""

    def __init__(self, deadline, message):
        import threading
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire, args=(message,))
        self.timer.daemon = True

    @staticmethod
    def _fire(message):
        os.write(2, f"hpcckpt: {message}\n".encode())
        os._exit(3)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        return False


FINALIZE = {"registered": False, "status": 0}    # status: the exit status past the bound (1: online.run raised)


def bound_finalize(timeout):
    """Local, once per process of an online job: MPI_Finalize is called at exit from an atexit
    handler, with ``timeout`` seconds to complete (a process that saw no failure itself may share
    the job with one that did). Open MPI 5.0.11's MPI_Finalize sometimes
    never returns in a job that lost a process (ompi_mpi_finalize spins); past the bound this
    process flushes its output and ends with the status it was ending with (0, or 1 when
    online.run raised)."""
    if FINALIZE["registered"]:
        return
    FINALIZE["registered"] = True
    import atexit
    atexit.register(_finalize_within, timeout)


def _finalize_within(timeout):
    import sys
    import threading
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return

    def give_up():
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(FINALIZE["status"])
    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    try:     # through ctypes, which releases the GIL (mpi4py's Finalize keeps it: the timer could not run)
        import ctypes
        ctypes.CDLL(_libmpi()).MPI_Finalize()
    except OSError:
        MPI.Finalize()
    timer.cancel()


def _libmpi():
    """The file name of the MPI library mpi4py is linked against (already loaded in this process)."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libmpi.so" in path:
                return path
    raise OSError("libmpi not found among the loaded libraries")

