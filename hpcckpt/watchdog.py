"""The stall watchdog (local): a wait inside an hpcckpt call that lasts too long is reported.

The waiting code enters ``watch(what)`` around a wait that depends on other ranks or threads:
an agreement (``comm.agree``, so every ``Collective``), the reductions of ``comm``, the messages
of an exchange (``InFlight.wait``), the join of the background thread, the pfs node-file
writer's. Entering records the start and a description; nothing else happens on the success
path (no thread is started, no MPI call made, no text formatted: one small object per wait).

One daemon thread per process, started by ``configure()`` (the Checkpointer's constructor, when
``stall_timeout`` is not off), sleeps until the earliest deadline of the waits in progress (or a
quarter of ``stall_timeout`` when none is) and, for each wait past ``stall_timeout``, once per
wait: logs a warning on the ``hpcckpt`` logger naming this rank, the hpcckpt call (found in the
waiting thread's stack: the outermost public function of the library, with its simple
arguments), the step, what it waits for and for how long; then, the first time in the process
only, dumps the Python stacks of all its threads to stderr (``faulthandler``; each line
prefixed with ``hpcckpt[rank R] | ``). With
``stall_action = "abort"`` it then aborts the job: ``MPI_Abort(MPI_COMM_WORLD, ABORT_STATUS)``.

Nested waits: only the innermost wait of a thread is watched; the outer one is watched again
from its own start once the inner one is over (no hpcckpt wait nests another today).

The settings are the process's: the newest ``configure()`` wins (a Checkpointer's constructor),
and ``stall_timeout`` 0 stops watching (the thread then sleeps until reconfigured).
"""
import faulthandler
import logging
import os
import sys
import tempfile
import threading
import time

log = logging.getLogger("hpcckpt")
ABORT_STATUS = 124            # the exit status of MPI_Abort after a stall (as coreutils' timeout)
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

_timeout = 0.0                # seconds; 0: off
_action = "warn"
_rank = None
_current = {}                 # thread ident -> its innermost Watch in progress
_wake = threading.Event()
_thread = None
_dumped = False


class Watch:
    """One wait in progress: ``with watch(...)`` (see ``watch``)."""
    __slots__ = ("what", "detail", "step", "start", "ident", "outer", "reported")

    def __init__(self, what, detail, step):
        self.what, self.detail, self.step, self.reported = what, detail, step, False

    def text(self):
        """What it waits for, formatted (only when it stalls)."""
        if self.detail is None:
            return self.what
        return self.what % (self.detail if isinstance(self.detail, tuple) else (self.detail,))

    def __enter__(self):
        self.ident = threading.get_ident()
        self.outer = _current.get(self.ident)
        self.start = time.monotonic()
        _current[self.ident] = self
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.outer is None:
            _current.pop(self.ident, None)
        else:
            _current[self.ident] = self.outer
        return False


class _Off:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False


_OFF = _Off()


def watch(what, detail=None, step=None):
    """Local: a context manager around one wait. ``what`` says what it waits for: a str whose
    ``%`` fields ``detail`` fills (one value, or a tuple of them; formatted only if the wait
    stalls, never on the success path); ``step``: the step (None: the one found in the waiting stack). A shared no-op
    object while the watchdog is off."""
    return Watch(what, detail, step) if _timeout else _OFF


def configure(timeout, action="warn", rank=None):
    """Local: watch waits longer than ``timeout`` seconds (0: stop watching) with ``action``
    ("warn" or "abort"); ``rank`` names this process in the lines. Starts the thread once."""
    global _timeout, _action, _rank, _thread
    _timeout, _action = float(timeout or 0.0), action
    if rank is not None:
        _rank = rank
    if _timeout and _thread is None:
        _thread = threading.Thread(target=_run, name="hpcckpt-watchdog", daemon=True)
        _thread.start()
    _wake.set()


def _run():
    while True:
        _wake.wait(_next_sleep())
        _wake.clear()
        if not _timeout:
            continue
        now = time.monotonic()
        for w in _in_progress():
            if not w.reported and now - w.start >= _timeout:
                w.reported = True
                try:
                    _report(w, now - w.start)
                except Exception:  # noqa: BLE001 - the watchdog never dies of a report
                    log.exception("hpcckpt watchdog: could not report a stall")


def _in_progress():
    for _ in range(8):
        try:
            return list(_current.values())
        except RuntimeError:      # changed during the copy (a free-threaded build): try again
            continue
    return []


def _next_sleep():
    """Seconds until the earliest deadline of an unreported wait, at most a quarter of the
    timeout (a wait that starts meanwhile is seen at most that late); None (until woken) when off."""
    if not _timeout:
        return None
    period = _timeout / 4
    now = time.monotonic()
    deadlines = [w.start + _timeout - now for w in _in_progress() if not w.reported]
    return max(0.01, min([period] + deadlines))


def _report(w, waited):
    """Log one stalled wait; dump the stacks the first time; abort with stall_action = "abort"."""
    global _dumped
    frame = sys._current_frames().get(w.ident)
    call, step = describe_call(frame)
    step = w.step if w.step is not None else step
    what = w.text()
    thread = next((t.name for t in threading.enumerate() if t.ident == w.ident), None)
    where = f" (thread {thread})" if thread and thread != "MainThread" else ""
    abort = _action == "abort"
    dump = not _dumped
    log.warning("rank %s: stalled for %.1f s in %s%s, step %s: waiting for %s (stall_timeout = %g s)%s%s",
                "?" if _rank is None else _rank, waited, call, where, "unknown" if step is None else step, what,
                _timeout, "; the Python stacks of this process follow" if dump else "",
                f"; aborting the job (stall_action = 'abort', status {ABORT_STATUS})" if abort else "")
    if dump:
        _dumped = True
        dump_stacks()
    if abort:
        _abort()


def dump_stacks():
    """Local: write the Python stacks of every thread of this process to stderr (faulthandler),
    each line prefixed with ``hpcckpt[rank R] | ``, in one write: the lines of the ranks of a job
    that share one stderr stay together, and say whose they are."""
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):      # replaced by an object without a descriptor
        fd = 2
    prefix = f"hpcckpt[rank {'?' if _rank is None else _rank}] | ".encode()
    try:
        with tempfile.TemporaryFile() as f:
            faulthandler.dump_traceback(file=f.fileno(), all_threads=True)
            f.seek(0)
            text = f.read()
    except OSError:                                    # no temporary file: straight to stderr
        faulthandler.dump_traceback(file=fd, all_threads=True)
        return
    data = b"".join(prefix + line for line in text.splitlines(keepends=True))
    while data:
        data = data[os.write(fd, data):]


def _abort():
    from mpi4py import MPI
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - nothing may stop the abort
        pass
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_WORLD.Abort(ABORT_STATUS)
    os._exit(ABORT_STATUS)


_SIMPLE = (int, float, str, bool, type(None))


def describe_call(frame):
    """Local: (the hpcckpt call a stack is in, e.g. "Checkpointer.checkpoint(step=9,
    level='partner')", the step found in it or None), from the innermost ``frame`` of a thread.
    The call is the outermost public function of the package (its outermost function when none
    is public); the step, the outermost integer local named ``step``."""
    frames = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(_PACKAGE) and not frame.f_code.co_filename.endswith("watchdog.py"):
            frames.append(frame)
        frame = frame.f_back
    frames.reverse()                                  # outermost first
    if not frames:
        return "an hpcckpt call", None
    public = [f for f in frames if not f.f_code.co_name.startswith("_") and "<locals>" not in f.f_code.co_qualname]
    top = (public or frames)[0]
    step = None
    for f in frames:
        try:
            value = f.f_locals.get("step")
        except Exception:  # noqa: BLE001 - a frame that cannot be read names no step
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            step = value
            break
    return _signature(top), step


def _signature(frame):
    code = frame.f_code
    try:
        values = frame.f_locals
    except Exception:  # noqa: BLE001
        values = {}
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    args = []
    for name in names:
        if name == "self" or name not in values:
            continue
        v = values[name]
        simple = isinstance(v, _SIMPLE) and len(repr(v)) <= 80
        args.append(f"{name}={v!r}" if simple else f"{name}=<{type(v).__name__}>")
    return f"{code.co_qualname}({', '.join(args)})"
