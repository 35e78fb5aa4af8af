"""Collective helpers: agree on success, gather per-rank errors, raise the same error everywhere.

Two tools, used together: ``Collective`` (or ``agree``) around a collective step makes every rank
raise the same error when any rank failed; ``Deferred`` inside a step keeps a rank in every round
of an exchange after a local error (its own file unreadable, its disk full), so the others are
never left waiting, and raises that error once the exchange is over.

A third, ``InFlight``, runs the point-to-point messages of an exchange (partner copies, parity
rounds) with persistent requests that an MPI error never leaves freed while Open MPI may still
complete them: a process failure in the middle of an exchange ends no survivor (ULFM).

The rule (from PyTorch DCP's collectives wrapper): a rank never raises alone inside a collective
call. It catches its exception, every rank learns who failed and why, and every rank raises.

Every wait here for the other ranks (an agreement, a reduction, an exchange's messages) is
watched by the stall watchdog (hpcckpt.watchdog): one that lasts longer than ``stall_timeout``
is reported on the waiting rank.

Scale: on the success path every helper here is a fixed-size reduction (one ``Allreduce`` of a
few 64-bit words), whatever the number of ranks. Per-rank details travel only when something
failed: gathered to rank 0, which picks the error, and broadcast.
"""
import contextlib
import hashlib
import os
import re
import signal
import sys
import threading
import traceback

import numpy as np
from mpi4py import MPI

from . import errors
from .errors import CollectiveError, HpcCkptError
from .watchdog import watch

U64_MAX = (1 << 64) - 1
WORDS = 8             # the words an agreement carries (fixed, so every rank reduces the same size)


def _describe(exc):
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


def _failure_classes():
    """The MPI error classes that mean "a process failed" (ULFM); empty where the MPI has none
    (MPICH's wheel defines them all as one unknown class)."""
    names = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    codes = {getattr(MPI, n, None) for n in names} - {None}
    if len(codes) < len(names) or codes & {MPI.SUCCESS, MPI.ERR_UNKNOWN, MPI.ERR_OTHER}:
        return frozenset()
    return frozenset(codes)


FAILURE_CLASSES = _failure_classes()
# Open MPI 5.0 with ULFM switched on reports the same failure as MPI_ERR_OTHER on some ranks
# (docs/ONLINE.md): in such a job that class counts too (hpcckpt.online then checks that a
# process really is gone, and raises OnlineRecoveryError when none is).
if FAILURE_CLASSES and os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes", "on"):
    FAILURE_CLASSES = FAILURE_CLASSES | {MPI.ERR_OTHER}


def is_process_failure(exc):
    """Local: True when ``exc`` (or an exception it was raised from) is an MPI error saying that a
    process failed or that a communicator was revoked after one did (ULFM)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MPI.Exception):
            try:
                if exc.Get_error_class() in FAILURE_CLASSES:
                    return True
            except Exception:  # noqa: BLE001 - a broken error object is not a failure report
                pass
        exc = exc.__cause__ or exc.__context__
    return False


def mark_collective(exc):
    """Local: mark the HpcCkptError ``exc`` as raised on every rank (so that nobody needs to abort
    the job for it); returns it."""
    exc.collective = True
    return exc


def is_collective(exc):
    """Local: True when ``exc`` was raised by hpcckpt on every rank of a collective call."""
    return isinstance(exc, HpcCkptError) and exc.collective


def mark_agreed(exc):
    """Local: note on a KeyboardInterrupt or SystemExit of this rank that an agreement told the
    other ranks about it (they raised a CollectiveError naming it). The one note hpcckpt puts on
    an exception it did not create (its own errors have fields: HpcCkptError)."""
    exc.__hpcckpt_agreed__ = True


def was_agreed(exc):
    """Local: whether mark_agreed noted ``exc``."""
    return getattr(exc, "__hpcckpt_agreed__", False)


def explain(comm, mine, pick):
    """Collective, on failure paths only (it gathers): every rank's ``mine`` goes to rank 0, where
    ``pick(reports)`` (the reports by rank) makes one text (or None); every rank returns it.
    The one way hpcckpt turns per-rank details into a message; the success path agrees with
    fixed-size reductions instead (``agree``)."""
    reports = comm.gather(mine, root=0)
    return comm.bcast(pick(reports) if comm.rank == 0 else None, root=0)


def _report(exc):
    """What one rank says about its failure: (HpcCkptError class name or None, message, whether
    it was agreed already: then the message is its whole text, which names the failing ranks)."""
    if isinstance(exc, HpcCkptError):
        if is_collective(exc):
            return type(exc).__name__, str(exc), True
        return type(exc).__name__, exc.reason or str(exc), False
    return None, _describe(exc), False


def reduce_max(comm, words):
    """Collective: element-wise maximum over the ranks of a short list of unsigned 64-bit ints."""
    local = np.asarray(words, dtype=np.uint64)
    out = np.empty_like(local)
    comm.Allreduce(local, out, op=MPI.MAX)
    return [int(x) for x in out]


def reduce_sum_max(comm, total, largest):
    """Collective: (sum over ranks of the int ``total``, max over ranks of the float ``largest``)."""
    s, m = np.array([int(total)], np.int64), np.array([float(largest)], np.float64)
    out_s, out_m = np.empty_like(s), np.empty_like(m)
    with watch("the other ranks in a reduction of bytes and seconds (MPI_Allreduce on the library's communicator)"):
        comm.Allreduce(s, out_s, op=MPI.SUM)
        comm.Allreduce(m, out_m, op=MPI.MAX)
    return int(out_s[0]), float(out_m[0])


def same_everywhere(comm, value):
    """Collective: True on every rank when every rank passed the same non-negative int (< 2**64)."""
    hi, neg = reduce_max(comm, [value, U64_MAX - value])
    return hi == U64_MAX - neg


def agree(comm, exc=None, what="operation", words=()):
    """Collective: every rank reports its exception (or None), and optionally a few words to be
    maximised over the ranks (``reduce_max``) in the same reduction.

    Returns the maxima of ``words`` when no rank failed. Otherwise raises on every rank: the
    HpcCkptError subclass the lowest failing rank raised (so a ConfigError stays a ConfigError),
    or CollectiveError for anything else, naming each failing rank. The raised error is marked
    collective (``is_collective``).
    """
    if exc is not None and is_process_failure(exc):
        raise exc               # ULFM: a process is gone, no agreement: online recovery (hpcckpt.online) takes it
    words = list(words)
    if len(words) > WORDS:
        raise ValueError(f"agree() carries at most {WORDS} words")
    with watch("the other ranks in the agreement %r (MPI_Allreduce on the library's communicator)", what):
        return _agree(comm, exc, what, words)


def _agree(comm, exc, what, words):
    """Collective: agree() (a watched wait)."""
    # always the same size on every rank, whatever each rank got to before failing; with the
    # step's name (call_id: its maximum and its complement's) so that ranks at different steps
    # of the library (the application made different calls on different ranks) find out
    ident = call_id(what)
    result = reduce_max(comm, [1 if exc is not None else 0, ident, U64_MAX - ident]
                        + words + [0] * (WORDS - len(words)))
    if result[1] != U64_MAX - result[2]:
        _raise_different_calls(comm, what, exc)
    if not result[0]:
        return result[3:3 + len(words)]
    # failure path: details gathered to rank 0, the chosen error broadcast
    reports = comm.gather(_report(exc) if exc is not None else None, root=0)
    if comm.rank == 0:
        failures = {r: rep for r, rep in enumerate(reports) if rep is not None}
        first = min(failures)
        cls_name, message, agreed = failures[first]
        if len(failures) == comm.size and all(rep[2] for rep in failures.values()):
            text = f"{what}: {message}"     # one error agreed before, on every rank: it names its ranks
        else:
            where = f" on rank {first}" if comm.size > 1 else ""
            text = f"{what} failed{where}: {message}"
            others = sorted(failures)[1:]
            if others:
                text += f" [also failed on {len(others)} more rank{'s' if len(others) > 1 else ''}: " \
                        f"{', '.join(map(str, others[:8]))}{', …' if len(others) > 8 else ''}]"
        detail = {r: m for r, (_, m, _) in list(failures.items())[:64]}
        decision = (cls_name, text, message, detail)
    else:
        decision = None
    cls_name, text, message, detail = comm.bcast(decision, root=0)
    cls = errors.ALL.get(cls_name, CollectiveError) if cls_name else CollectiveError
    err = CollectiveError(text, detail) if cls is CollectiveError else cls(text)
    err.reason = message                    # the first rank's own words, not wrapped again
    mark_collective(err)
    raise err from exc


def call_id(what):
    """Local: a 32-bit digest of the name of a collective step: the leading words of its
    description, without the numbers, paths and values after them ("writing checkpoint 12" and
    "writing checkpoint 13" have the same), so that ranks at the same step always agree on it."""
    name = re.match(r"[A-Za-z _]*", what).group(0).strip()
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "little")


def _raise_different_calls(comm, what, exc):
    """Collective (failure path): the ranks are at different collective steps of the library;
    raise CollectiveError naming them on every rank."""
    def pick(steps):
        first = {}
        for r, w in enumerate(steps):
            first.setdefault(w, r)
        named = "; ".join(f"rank {r}: {w}" for w, r in list(first.items())[:4])
        return (f"the ranks made different hpcckpt calls ({named}): every rank must make the same calls of a "
                "Checkpointer, in the same order (they are collective)")
    # not marked collective: the ranks are at different places of the application, so one that
    # leaves it uncaught ends the job (abort_on_error) rather than leave the others waiting
    err = CollectiveError(explain(comm, what, pick))
    err.reason, err.different_calls = err.args[0], True
    raise err from exc


def is_different_calls(exc):
    """Local: True when ``exc`` says that the ranks made different hpcckpt calls (never to be
    handled as a failure of the step: the application's ranks diverged)."""
    return isinstance(exc, HpcCkptError) and exc.different_calls


class Collective(contextlib.AbstractContextManager):
    """``with Collective(comm, "checkpoint"): ...local work...``

    Collective: an exception inside the block is caught and agreed on at exit, so every rank
    raises together. This includes KeyboardInterrupt and SystemExit: the other ranks raise a
    CollectiveError naming them, the interrupted rank re-raises its own. ``c.words`` (a few
    unsigned 64-bit ints this rank sets inside the block) come back as ``c.result``, their
    maxima over the ranks, in the same single reduction.

    One exception is not agreed on: an MPI error saying that a process failed or that the
    communicator was revoked (``is_process_failure``, ULFM only). No agreement can complete then;
    it propagates as it is, and hpcckpt.online revokes and recovers.
    """

    def __init__(self, comm, what):
        self.comm, self.what, self.words, self.result = comm, what, (), None

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and is_process_failure(exc):
            return False        # a process failed (ULFM): no agreement is possible; online recovery takes it
        words = self.words if exc is None else ()
        try:
            self.result = agree(self.comm, exc, self.what, words)
        except HpcCkptError:
            if exc is not None and not isinstance(exc, Exception):
                mark_agreed(exc)
                return False            # KeyboardInterrupt, SystemExit: the others know; re-raise it here
            raise
        return True


_KEPT_AFTER_FAILURE = []     # requests (and their buffers) of exchanges an MPI error interrupted


class InFlight(contextlib.AbstractContextManager):
    """``with InFlight() as flight:`` the point-to-point messages of one exchange (local).

    ``flight.send(comm, buf, dest, tag)`` / ``flight.recv(comm, buf, source, tag)`` start a
    *persistent* request (``Send_init`` / ``Recv_init``, then ``Start``); ``flight.wait(reqs)``
    waits for them and frees them. Why persistent: completion does not free such a request, so
    when an exchange ends in an MPI error (ULFM: a process failed or the communicator was
    revoked) its requests are still ours, and they are kept, with their buffers, for the rest of
    the process instead of being freed. Open MPI 5.0's ob1 can complete a fragment of such a
    request after the error; had the request been freed by then (``Waitall`` frees a completed
    nonblocking request, mpi4py frees an active one it drops), the process would end with "Send
    error after request freed" (docs/ONLINE.md, "Messages in flight"). Any other exception
    leaving the block keeps the requests not yet freed the same way. Otherwise it behaves as
    ``Isend`` / ``Irecv`` + ``Waitall``.
    """

    def __init__(self):
        self.live = []

    def send(self, comm, buf, dest, tag):
        return self._start(comm.Send_init(buf, dest=dest, tag=tag))

    def recv(self, comm, buf, source, tag):
        return self._start(comm.Recv_init(buf, source=source, tag=tag))

    def _start(self, request):
        self.live.append(request)
        request.Start()
        return request

    def wait(self, requests):
        """Local: wait for ``requests`` (from this flight) and free them."""
        with watch("the other ranks of an exchange (MPI_Waitall of %d point-to-point messages)", len(requests)):
            MPI.Request.Waitall(requests)
        for r in requests:
            r.Free()
        self.live = [r for r in self.live if r]

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            _KEPT_AFTER_FAILURE.extend(r for r in self.live if r)
        self.live = []
        return False


class Deferred:
    """Local: keeps the first local error of a collective exchange; ``raise_if_any()`` at the end.

    ``run(fn, *args)`` calls ``fn`` unless an error was already kept, and returns its result (None
    after an error)."""

    def __init__(self):
        self.error = None

    def run(self, fn, *args):
        if self.error is not None:
            return None
        try:
            return fn(*args)
        except BaseException as e:  # noqa: BLE001 - any local failure (an interrupt too): raised after the exchange
            self.error = e
            return None

    def raise_if_any(self):
        if self.error is not None:
            raise self.error


DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2",
                                                             "SIGALRM", "SIGQUIT", "SIGXCPU") if hasattr(signal, name))


@contextlib.contextmanager
def signals_deferred():
    """Local: while a point-to-point exchange runs in the main thread, its Python signal handlers
    (a KeyboardInterrupt, an application's handler calling sys.exit()) only record the signal;
    they run when the exchange is over. Raised in the middle of an exchange, their exception
    would leave the peers waiting for messages forever; after it, the ranks agree on it like
    any error. Other threads get no Python signals: nothing to do there."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got, saved = [], {}
    for num in DEFERRED_SIGNALS:
        handler = signal.getsignal(num)
        if callable(handler):
            saved[num] = handler
            signal.signal(num, lambda n, frame: got.append((n, frame)))
    try:
        yield
    finally:
        for num, handler in saved.items():
            signal.signal(num, handler)
        for num, frame in got:
            saved[num](num, frame)


def print_abort_notice(exc, rank):
    """Local: print a rank's uncaught exception with its traceback to stderr, before an abort."""
    if isinstance(exc, SystemExit):
        sys.stderr.write(f"hpcckpt[rank {rank}]: sys.exit({exc.code!r}) on this rank; aborting the job so that the "
                         "other ranks do not wait for it (abort_on_error = true)\n")
        sys.stderr.flush()
        return
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(f"hpcckpt[rank {rank}]: uncaught exception on this rank; aborting the job "
                     f"(abort_on_error = true):\n{text}")
    sys.stderr.flush()
