"""The background work of a committed step: its level's protect (redundancy, flush), then the
commit at its level and its retire, in a thread of its own; joined, and its outcome agreed, at the
next call of the application (``finish``).

The thread reads the node-local files, never the live arrays, and talks MPI only on the levels'
communicators (``Context.level_comm``: a duplicate of its own, or the level's own duplicate, as
the pfs store has), never on the one the caller uses.
"""
import logging
import threading
import time

from . import faults, watchdog
from .comm import Collective, Deferred, agree, signals_deferred
from .errors import CheckpointWriteError, HpcCkptError

log = logging.getLogger("hpcckpt")


class Background:
    """The background work of one committed step: a thread, its error, its duration.
    ``redundant``: the step's redundancy is part of it (so the previous redundant step is not
    retired before it completes)."""

    def __init__(self, step, level, work, redundant):
        self.step, self.level, self.redundant = step, level, redundant
        self.error, self.seconds = None, None
        self.what = f"{level} redundancy" if redundant else f"{level} flush"

        def run():
            t = time.perf_counter()
            try:
                work()
            except Exception as e:  # noqa: BLE001 - surfaced collectively at the next call
                self.error = e
            self.seconds = time.perf_counter() - t
        # not a daemon: an application that exits without close() still gets this step made
        # redundant (the interpreter joins the thread before mpi4py finalizes MPI at exit)
        self.thread = threading.Thread(target=run, name=f"hpcckpt-background-{step}")
        self.thread.start()

    def join(self):
        """Local: wait for the thread; return its error (or None)."""
        with watchdog.watch("this rank's background thread: the %s of step %d", (self.what, self.step)):
            self.thread.join()
        return self.error


def protect(level, manifest, pending=None, error=None):
    """Local part of a collective protect: the level's protect of this rank's committed step;
    returns the manifest to commit (a redundant level's may name an incremental base).
    ``error``: a local failure that came before (raised once the exchange is done)."""
    try:
        with signals_deferred():            # an interrupt mid-exchange would strand the peers
            committed = level.protect(manifest, pending)
        if error is not None:
            raise error
        return manifest if committed is None else committed
    except OSError as e:
        what = "redundancy" if level.redundant else "copy"
        raise CheckpointWriteError(f"cannot write the {level.name} {what} of step {manifest.step}: "
                                   f"{e.strerror}" + (f" ({e.filename})" if e.filename else "")) from e


def start(ctx, manifest, level):
    """Collective: the rest of a committed step in a background thread: the level's protect;
    for a redundant level then the manifest committed at its level (the cache holds the step as
    a local one until then); the level's retire."""
    step, name = manifest.step, level.name
    with Collective(ctx.comm, f"setting up the {name} level for the background work of checkpoint {step}"):
        level.ready()
    comm = ctx.background_comm()

    def work():
        if level.redundant:
            with Collective(comm, f"encoding checkpoint {step} ({name}) in the background"):
                hook = Deferred()      # test hook: kill/ENOSPC; the exchange still runs on every rank
                hook.run(faults.hit, "background", ctx.rank, step)
                committed = protect(level, manifest, error=hook.error)
            with Collective(comm, f"committing the {name} level of checkpoint {step}"):
                ctx.cache.commit(committed)
            with Collective(comm, f"retiring at the {name} level after checkpoint {step}"):
                level.retire(manifest, ctx.clear_others and ctx.committed)
        else:
            with Collective(comm, f"the {name} copy of checkpoint {step} in the background"):
                protect(level, manifest)
            with Collective(comm, f"retiring at the {name} level after checkpoint {step}"):
                level.retire(manifest, ctx.clear_others and ctx.committed)
    ctx.flush = Background(step, name, work, level.redundant)


def finish(ctx, raise_error, retire):
    """Collective: join the background work; agree on its outcome. Its error (agreed, the same
    on every rank) is raised, or returned when ``raise_error`` is False. ``retire(keep_upto)``:
    the cache retire, run once the work is done."""
    if ctx.flush is None:
        return None
    flush, ctx.flush = ctx.flush, None
    error = flush.join()
    micros = int((flush.seconds or 0.0) * 1e6)
    try:      # the slowest rank's background time, in the same reduction
        micros, = agree(ctx.comm, error, f"background {flush.what} of step {flush.step}", [micros])
    except HpcCkptError as e:
        if raise_error:
            raise
        return e
    if ctx.rank == 0:
        ctx.policy.record_background(flush.level, micros / 1e6)
        log.info("the %s of step %d took %.3f s in the background", flush.what, flush.step, micros / 1e6)
        ctx.events.background(flush.step, flush.level, flush.what, micros / 1e6)
    if ctx.last_step is not None:
        retire(ctx, keep_upto=ctx.last_step)
    return None


def join_unwinding(ctx):
    """Local, while an exception unwinds: let running background work end (its thread talks
    only to the other ranks' threads), and say how it ended."""
    if ctx.flush is None:
        return
    flush, ctx.flush = ctx.flush, None
    error = flush.join()
    if error is not None:
        log.warning("rank %d: the background %s of step %d failed while an exception was unwinding: %s",
                    ctx.rank, flush.what, flush.step, error)
    elif ctx.rank == 0:
        log.warning("the background %s of step %d completed while an exception was unwinding",
                    flush.what, flush.step)
