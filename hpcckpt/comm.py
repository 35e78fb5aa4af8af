"""Collective helpers: agree on success, gather per-rank errors, raise the same error everywhere.

The rule (from PyTorch DCP's collectives wrapper): a rank never raises alone inside a collective
call. It catches its exception, every rank learns who failed and why, and every rank raises.
"""
import contextlib
import traceback

from . import errors
from .errors import CollectiveError, HpcCkptError


def _describe(exc):
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


def agree(comm, exc=None, value=None, what="operation"):
    """Collective: every rank reports its exception (or None) and a small value.

    Returns the list of every rank's value when no rank failed. Otherwise raises on every rank:
    the HpcCkptError subclass the lowest failing rank raised (so a ConfigError stays a
    ConfigError), or CollectiveError for anything else, naming each failing rank.
    """
    local = None
    if exc is not None:
        cls = type(exc).__name__ if isinstance(exc, HpcCkptError) else None
        local = (cls, _describe(exc) if cls is None else str(exc))
    gathered = comm.allgather((local, value))
    failures = {rank: rep for rank, (rep, _) in enumerate(gathered) if rep is not None}
    if not failures:
        return [v for _, v in gathered]
    first = min(failures)
    cls_name, message = failures[first]
    cls = errors.ALL.get(cls_name, CollectiveError) if cls_name else CollectiveError
    text = f"{what} failed on rank {first}: {message}" if comm.size > 1 else f"{what} failed: {message}"
    others = len(failures) - 1
    if others:
        text += f" (and on {others} more rank{'s' if others > 1 else ''}: {', '.join(map(str, sorted(failures)[1:][:8]))})"
    if cls is CollectiveError:
        err = CollectiveError(text, {r: m for r, (_, m) in failures.items()})
    else:
        err = cls(text)
    raise err from exc


class Collective(contextlib.AbstractContextManager):
    """``with Collective(comm, "checkpoint") as c: ...local work...; values = c.values``

    Collective: exceptions inside the block are caught and agreed on at exit, so every rank
    raises together. ``c.value`` is what this rank contributes; ``c.values`` every rank's.
    """

    def __init__(self, comm, what):
        self.comm, self.what, self.value, self.values = comm, what, None, None

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, SystemExit: let them go
        if exc is not None and not isinstance(exc, HpcCkptError):
            exc.__hpcckpt_traceback__ = traceback.format_exc()
        self.values = agree(self.comm, exc, self.value, self.what)
        return True


def same_on_all_ranks(comm, value, what):
    """Collective: raise HpcCkptError on every rank unless every rank passed an equal value."""
    values = comm.allgather(value)
    for rank, v in enumerate(values):
        if v != values[0]:
            raise HpcCkptError(f"{what} differs between ranks: rank 0 has {values[0]!r}, rank {rank} has {v!r}; "
                               "every rank must make the same collective call with the same arguments")
    return values
