"""Process-wide hooks of the Checkpointers of this process (local): the excepthook that aborts
the MPI job on an exception of one rank, MPI_Finalize joining the background work of every open
Checkpointer, the warning at exit about one not closed, the logger, and small helpers of the
facade (the settings digest, revoke)."""
import atexit
import json
import logging
import sys
import weakref

from mpi4py import MPI

from .comm import is_collective, print_abort_notice
from .config import LOCAL_KEYS
from .save import digest_int

log = logging.getLogger("hpcckpt")


def opened(ck):
    """Local: a Checkpointer was opened: warned about at exit if not closed; its background work
    joined by MPI_Finalize."""
    _OPEN.add(ck)
    _join_at_finalize()


def settings_digest(cfg):
    """An int digest of every setting that must be the same on all ranks (all but LOCAL_KEYS)."""
    values = {k: v for k, v in cfg.as_dict().items() if k not in LOCAL_KEYS}
    return digest_int(json.loads(json.dumps(values, sort_keys=True, default=str)))


def revoke(comm):
    """Local: revoke ``comm`` (ULFM) so that every pending and future call on it fails everywhere;
    nothing where the MPI cannot (no ULFM) or the communicator is already unusable."""
    try:
        comm.Revoke()
    except Exception:  # noqa: BLE001 - NotImplementedError (no ULFM), MPI.Exception (already broken)
        pass


def thread_multiple():
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def should_abort(exc):
    """An exception on one rank that the others cannot know about: anything but an error
    hpcckpt raised on every rank, and sys.exit(0)."""
    if is_collective(exc):
        return False
    if isinstance(exc, SystemExit):
        return exc.code not in (None, 0)
    return True


def exit_code(exc):
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return 1


_hook_installed = False


_OPEN = weakref.WeakSet()       # Checkpointers not closed yet (_warn_unclosed at exit)


@atexit.register
def _warn_unclosed():
    """At interpreter exit (after the background threads were joined, before mpi4py finalizes
    MPI): say which Checkpointers the application did not close."""
    for ck in list(_OPEN):
        if not ck._closed and ck.topology.rank == 0:
            log.warning("the Checkpointer of job %r was not closed: its background work was completed at exit; "
                        "call close() or use it as a context manager (with)", ck.config.name)


_FINALIZE_KEYVAL = []


def _join_at_finalize():
    """Local (once per process): have MPI_Finalize join the background work of every open
    Checkpointer. MPI_Finalize deletes MPI_COMM_SELF's attributes first, while MPI still works,
    so an application that finalizes MPI before close() does not pull MPI away from a background
    thread in the middle of its messages (it talks only to the other ranks' threads, which their
    own MPI_Finalize joins the same way)."""
    if _FINALIZE_KEYVAL:
        return

    def joined(comm, keyval, value):
        for ck in list(_OPEN):
            flush = None if ck._closed else ck._ctx.flush
            if flush is not None:
                flush.thread.join()
    keyval = MPI.Comm.Create_keyval(delete_fn=joined)
    MPI.COMM_SELF.Set_attr(keyval, True)
    _FINALIZE_KEYVAL.append(keyval)


def install_excepthook():
    """Once per process: an uncaught exception on one rank prints its traceback and aborts the
    MPI job (as ``python -m mpi4py`` does), so the other ranks do not wait forever."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if (not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.size == 1
                or not should_abort(exc)):
            previous(exc_type, exc, tb)
            return
        print_abort_notice(exc, MPI.COMM_WORLD.rank)
        MPI.COMM_WORLD.Abort(exit_code(exc))
    sys.excepthook = hook


def setup_logging(cfg, rank):
    log.setLevel(cfg.log_level.upper())
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"hpcckpt[rank {rank}] %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
