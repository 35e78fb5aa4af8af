"""What each checkpoint and restart cost: one INFO line each on rank 0, and the event log.

The event log (config key ``events_file``; none by default) is a file of JSON lines written by
rank 0 only: one object per event, written with one ``write`` on a file opened in append mode
(a relaunch of the job adds to the same file), so a killed job loses at most the event it was
writing. The schema (``"v": 1``) is in docs/EVENTS.md; ``read`` parses it back, refusing a bad
line with its file and line number; ``hpcckpt report`` summarises it (hpcckpt/report.py).

The Checkpointer wires it in with a decorator on its public calls (``recorded``: the checkpoint
and restart events and their INFO lines, a failure event for an error that leaves the call) and
a few notes from inside the restore protocol (where a step came from, a fallback, a background
work's time). Everything here is local and costs no message: the restart's sources come from
what the restore protocol already knows (the rebuild's list of lost ranks is gathered on its
failure path only). Writing an event never raises: a failure warns once and stops the log.
"""
import functools
import json
import logging
import math
import operator
import os
import time
import uuid
import weakref

from .errors import HpcCkptError
from .levels import registry
from .levels.registry import LEVELS
from .units import format_size

log = logging.getLogger("hpcckpt")

VERSION = 1
KINDS = ("start", "checkpoint", "background", "restart", "fallback", "failure")
MESSAGE_MAX = 2000          # characters of an error message or a fallback's reason kept in an event


class EventsFormatError(HpcCkptError):
    """A line of an events file that is not an event of a known schema version."""


def sources():
    """Local: what a restart's ``source`` may be: ``cache`` (every rank's own), a redundant level
    (some ranks rebuilt from it), a level that restores directly (registry)."""
    return ("cache", *registry.redundant(), *registry.restoring())


# ---------------------------------------------------------------------- the INFO lines (pure)
def checkpoint_line(step, level, nbytes, seconds, follows=None, before=None):
    """The INFO line of one checkpoint. ``follows``: the background work it leaves (e.g.
    "partner redundancy"); ``before``: (seconds, text) the call waited first for the previous
    step's background work."""
    text = f"checkpoint {step} ({level}): {format_size(nbytes)} in {seconds:.3f} s (application waited"
    if before is not None:
        text += f", and {before[0]:.3f} s before it for the {before[1]}"
    text += ")"
    if follows:
        text += f"; the {follows} follows in the background"
    return text


def restart_line(step, level, source, own, rebuilt, seconds):
    """The INFO line of one restart: where the ranks' data came from, and how long it took."""
    if source in registry.restoring():
        where = f"read from {source} on {own + rebuilt} rank{'s' if own + rebuilt != 1 else ''}"
    else:
        where = f"own cache on {own} rank{'s' if own != 1 else ''}"
        if rebuilt:
            cls = registry.classes().get(source)
            where += f", rebuilt from {source} {cls.keeps if cls is not None else 'copies'} on {rebuilt}"
    return f"restarted from step {step} ({level or 'level unknown'}): {where}; {seconds:.3f} s"


# ---------------------------------------------------------------------- writing (rank 0)
class EventLog:
    """Local: the event log of one Checkpointer. Writes on rank 0 only, and only with a path;
    every method is a no-op elsewhere. Never raises: a write failure warns once and ends it."""

    def __init__(self, path, rank, size, name, file_mode=0o600, dir_mode=0o700):
        self.rank, self.size, self.name = rank, size, name
        self.path = os.path.abspath(path) if path and rank == 0 else None
        self.run = uuid.uuid4().hex[:16]        # this Checkpointer (a relaunch is another run)
        self.epoch = None
        self._modes = (file_mode, dir_mode)
        self._fd = None
        self._restored = None                   # (step, level, source, own, rebuilt) noted by the restore
        self._inside = False                    # a recorded call is running (recorded)
        self._warned = False                    # recording failed once (said once)

    @property
    def active(self):
        return self.path is not None

    def emit(self, kind, **fields):
        """Local: append one event (rank 0 with a path; else nothing)."""
        if self.path is None:
            return
        event = {"v": VERSION, "event": kind, "t": time.time(), "run": self.run, "job": self.name,
                 "ranks": self.size, "epoch": self.epoch, **fields}
        try:
            data = (json.dumps(_finite(event), separators=(",", ":"), allow_nan=False) + "\n").encode()
            if self._fd is None:
                os.makedirs(os.path.dirname(self.path), mode=self._modes[1], exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, self._modes[0])
                self._closer = weakref.finalize(self, os.close, self._fd)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except (OSError, TypeError, ValueError) as e:
            log.warning("cannot write the events file %s (%s); this run writes no more events", self.path,
                        e.strerror if isinstance(e, OSError) and e.strerror else e)
            self.close()
            self.path = None

    def close(self):
        """Local: close the file (harmless twice)."""
        if self._fd is not None:
            self._closer()
            self._fd = None

    # notes from inside the restore protocol (local; every rank may call them)
    def restored(self, step, level, data_ok=None, direct=False):
        """Local: ``step`` (of ``level``) is being restored: ``direct``ly by that level (one that
        keeps a copy of its own), or from the node caches, ``data_ok`` (one bool per rank: its own
        cache verified) when a rebuild happened."""
        if direct:
            self._restored = (step, level, level, self.size, 0)
        elif data_ok is None:
            self._restored = (step, level, "cache", self.size, 0)
        else:
            own = sum(1 for ok in data_ok if ok)
            self._restored = (step, level, level, own, len(data_ok) - own)

    def fallback(self, step, source, reason):
        """Local (rank 0 writes): step ``step`` could not be restored from ``source``, for ``reason``."""
        self.emit("fallback", step=step, source=source, reason=_clip(reason))

    def background(self, step, level, what, seconds):
        """Local (rank 0 writes): the background ``what`` of ``step`` took ``seconds`` (slowest rank)."""
        self.emit("background", step=step, level=level, work="redundancy" if what.endswith("redundancy") else "flush",
                  seconds=seconds)

    def start(self, ckpt):
        """Local (rank 0 writes): the run's settings that the report needs (policy, MTBF)."""
        if self.path is not None:
            _safely(_start, ckpt, self)


def _clip(text):
    text = str(text)
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX] + "…"


def _finite(value):
    """``value`` with every non-finite float as None (JSON has no infinity), the others rounded
    to microseconds."""
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ---------------------------------------------------------------------- the Checkpointer's calls
def recorded(op):
    """Decorator of a public Checkpointer call ``op`` ("checkpoint", "restart", "wait",
    "close"): after it, the checkpoint or restart event and its INFO line (rank 0); an
    exception that leaves it, a failure event (rank 0 sees the error every rank agreed on).
    Adds no communication; what it records can never make the call fail."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            ev = getattr(self, "_events", None)
            if ev is None or ev._inside:                  # a call made by another: the outer one records
                return method(self, *args, **kwargs)
            t0 = time.perf_counter()
            pending = getattr(self, "_flush", None)       # background work this call waits for first
            pending = None if pending is None else (pending.step, pending.what)
            ev._restored, ev._inside = None, True
            try:
                result = method(self, *args, **kwargs)
            except BaseException as e:
                ev._inside = False
                _safely(_after_error, self, ev, op, args, e, t0, pending)
                raise
            ev._inside = False
            _safely(_after, self, ev, op, result, t0, pending)
            if op == "close":
                ev.close()
            return result
        return call
    return wrap


def _safely(fn, self, ev, *args):
    try:
        fn(self, ev, *args)
    except Exception as e:  # noqa: BLE001 - the log must never fail the call it observes
        if ev.rank == 0 and not ev._warned:
            ev._warned = True
            log.warning("recording an event failed (%s: %s); the checkpoints are not affected", type(e).__name__, e)


def _start(self, ev):
    policy, cfg = self.policy, self.config
    from . import __version__
    ev.emit("start", hpcckpt=__version__, nodes=len(set(self.topology.node_of)), policy=policy.kind,
            levels=list(policy.levels), system_mtbf=policy.mtbf,
            mtbf={lv: (1.0 / r if r > 0 else None) for lv, r in policy.rates.items()},
            schedule=None if policy.schedule is None else {lv: list(v) for lv, v in policy.schedule.items()},
            background=cfg.background, async_flush=cfg.async_flush, incremental=cfg.incremental)


def _after(self, ev, op, result, t0, pending):
    ev.epoch = self._epoch
    if ev.rank != 0:
        return
    if op == "checkpoint":
        _checkpoint_done(self, ev, result, time.perf_counter() - t0, pending)
    elif op == "restart" and result is not None:
        seconds = time.perf_counter() - t0
        note = ev._restored if ev._restored is not None and ev._restored[0] == result else (result, None, "cache",
                                                                                          ev.size, 0)
        _, level, source, own, rebuilt = note
        if log.isEnabledFor(logging.INFO):
            log.info("%s", restart_line(result, level, source, own, rebuilt, seconds))
        ev.emit("restart", step=result, level=level, source=source, own=own, rebuilt=rebuilt, seconds=seconds)


def _checkpoint_done(self, ev, info, call_seconds, pending):
    """Rank 0: the INFO line and the event of a checkpoint ``info`` (CheckpointInfo)."""
    flush = self._flush
    follows = flush.what if flush is not None and flush.step == info.step else None
    before = None
    if pending is not None:
        before = (max(0.0, call_seconds - info.seconds), f"background {pending[1]} of step {pending[0]}")
    if log.isEnabledFor(logging.INFO):
        log.info("%s", checkpoint_line(info.step, info.level, info.bytes, info.seconds, follows, before))
    if not ev.active:
        return
    try:
        interval = dict(self.policy.periods())
    except Exception:  # noqa: BLE001 - a policy that cannot say: recorded as unknown
        interval = None
    ev.emit("checkpoint", step=info.step, level=info.level, bytes=info.bytes, seconds=info.seconds,
            call_seconds=call_seconds, background=follows, policy=self.policy.kind, interval=interval)


def _after_error(self, ev, op, args, error, t0, pending):
    ev.epoch = self._epoch
    info = getattr(error, "info", None)
    if op == "checkpoint" and info is not None and ev.rank == 0:
        _checkpoint_done(self, ev, info, time.perf_counter() - t0, pending)     # taken, then a background error
    if ev.rank != 0:
        return
    step = None
    if op == "checkpoint" and args and not isinstance(args[0], bool):
        try:
            step = operator.index(args[0])
        except TypeError:
            pass
    ev.emit("failure", op=op, step=step, error=type(error).__name__,
            message=_clip(error), seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------- reading
_FIELDS = {        # kind: {field: accepted types}; a field absent or None is allowed where None is listed
    "start": {"policy": (str,), "levels": (list,), "mtbf": (dict, type(None)),
              "system_mtbf": (int, float, type(None))},
    "checkpoint": {"step": (int,), "level": (str,), "bytes": (int,), "seconds": (int, float),
                   "call_seconds": (int, float, type(None)), "interval": (dict, type(None))},
    "background": {"step": (int,), "level": (str,), "seconds": (int, float)},
    "restart": {"step": (int,), "source": (str,), "seconds": (int, float), "own": (int,), "rebuilt": (int,)},
    "fallback": {"step": (int, type(None)), "source": (str,), "reason": (str,)},
    "failure": {"op": (str,), "error": (str,), "message": (str,)},
}
_COMMON = {"v": (int,), "event": (str,), "t": (int, float), "run": (str,), "ranks": (int,)}


def parse_line(text, where):
    """One event from one line of text; EventsFormatError naming ``where`` (FILE:LINE) when the
    line is not an event of schema version 1. Events of kinds this version does not know are
    returned as they are (a later version may add kinds)."""
    try:
        event = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise EventsFormatError(f"{where}: not a JSON object ({e})") from None
    if not isinstance(event, dict):
        raise EventsFormatError(f"{where}: not a JSON object but {type(event).__name__}")
    v = event.get("v")
    if isinstance(v, int) and not isinstance(v, bool) and v > VERSION:
        raise EventsFormatError(f"{where}: an event of schema version {v}, newer than this hpcckpt reads "
                                f"({VERSION}): upgrade hpcckpt")
    for name, types in [*_COMMON.items(), *_FIELDS.get(event.get("event"), {}).items()]:
        value = event.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            kind = "missing" if name not in event else f"a {type(value).__name__}"
            raise EventsFormatError(f"{where}: field {name!r} is {kind}, expected "
                                    f"{' or '.join('null' if t is type(None) else t.__name__ for t in types)}"
                                    f"{'' if name in _COMMON else ' in a ' + repr(event['event']) + ' event'}")
    if v != VERSION:
        raise EventsFormatError(f"{where}: schema version {v}, expected {VERSION}")
    if event["event"] in ("checkpoint", "background") and event["level"] not in LEVELS:
        raise EventsFormatError(f"{where}: unknown level {event['level']!r}")
    if event["event"] == "restart" and event["source"] not in sources():
        raise EventsFormatError(f"{where}: unknown restart source {event['source']!r}")
    return event


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def read(paths, warn=None):
    """Local: the events of the files ``paths``, in file order. EventsFormatError (file and line)
    on a bad line — except a last line without its newline that does not parse (a job killed
    while writing it): it is skipped and ``warn(text)`` told. OSError when a file cannot be read."""
    events = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            where = f"{path}:{i}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise EventsFormatError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x})") from None
            try:
                events.append(parse_line(text, where))
            except EventsFormatError as e:
                if i == len(lines) and warn is not None:       # the last line, without its newline
                    warn(f"{e}: skipped (an incomplete last line: the job was killed while writing it?)")
                    continue
                raise
    return events
