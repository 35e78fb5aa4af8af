"""Test-only fault injection (local). Inactive unless the environment sets ``_HPCCKPT_FAULT``.

``_HPCCKPT_FAULT="PHASE:RANK[:STEP[:ACTION]]"`` — at PHASE, on RANK (or ``*``), at STEP (or ``*``),
ACTION is ``kill`` (SIGKILL this process, the default), ``error`` (raise ENOSPC, as a full disk
would), ``interrupt`` (raise KeyboardInterrupt, as SIGINT would), ``sigint`` (send this process
a real SIGINT: its Python handler runs when the interpreter next checks), ``exit`` (raise
SystemExit(5)) or ``sleep=SECONDS`` (sleep that long, then go on: a stalled rank, for the stall
watchdog; bare ``sleep`` is 5 s). Phases: ``write`` (half-way through the data), ``written`` (data written, before the
ranks agree), ``encode`` (partner/xor/rs: while storing partner copies or before the parity
rounds; also fires when a rebuild resends partner copies), ``background`` (with ``background``:
in the background thread, before the redundancy is written), ``commit`` (before this rank's manifest is written), ``committed`` (after it,
before the final agreement), ``retire`` (while removing an old checkpoint), ``rebuild`` (partner/xor/rs: on a rank being
rebuilt, before it writes what it receives), ``restore``
(half-way through filling the arrays), ``pfs-layout`` (pfs: on a node's aggregator, before it lays
out its node file), ``pfs-write`` (pfs: half-way through a rank's writes into its node file),
``pfs-written`` (pfs: once its node file's bytes are written), ``pfs-commit``, ``pfs-renamed``
(pfs, rank 0: before it renames the step into place; after the rename, before the marker), ``recover`` (hpcckpt.online: on worker RANK during an online
recovery, right after the shrink; a spare has no RANK), ``spare`` (hpcckpt.online: on the spare whose
original rank is RANK, as it starts waiting).

``_HPCCKPT_FAULT_ONCE=FILE`` makes the fault fire once: the first process that matches creates
FILE (exclusively) and fires; the others, and later matches (a spare that took the rank's
number and runs the step again), find FILE and go on.

``_HPCCKPT_LEVEL_FAULT="LEVEL:PHASE:RANK[:STEP[:ACTION]]"`` — faults through the Level interface
(as PyTorch DCP's ``FaultyStorageWriter``): ``wrap_level`` (called by ``Context.level`` on every
Level object it makes) returns, for level LEVEL (or ``*``: any) on RANK (or ``*``), a proxy that
hands every call and attribute to the wrapped level and fires ACTION (as above; default
``error``) at its method PHASE, at STEP (or ``*``; a call without a step, as ``offers``, matches
any). PHASE is a method of the interface (``PHASES``): the local ones (offers, discard,
pinned_steps, abandon) fire before the method runs; the collective ones (ready, prepare,
protect, retire, clear_earlier, recover, restore, close) fire ``kill``, ``sigint`` and ``sleep`` before it,
and ``error``, ``interrupt`` and ``exit`` once it has returned on this rank: the way a level that
keeps the interface's rule fails (a rank takes part in every message of an exchange and raises
after it, levels/base.py); raised before, the other ranks would wait for this one's messages.
The proxy has the phases the wrapped level's class defines and the faulted one: where the
protocol skips a phase that a level leaves to the interface's no-op, it calls the faulted one;
every rank gets the proxy (it fires on RANK only), so that every rank takes the same path.
``_HPCCKPT_FAULT_ONCE`` applies to it as well.
"""
import errno
import os
import signal
import time

from .levels.base import Level

_SPEC = os.environ.get("_HPCCKPT_FAULT", "")


def _parse(spec):
    if not spec:
        return None
    parts = spec.split(":") + ["*", "*", "kill"]
    return parts[0], parts[1], parts[2], parts[3] or "kill"


_PARSED = _parse(_SPEC)


def hit(phase, rank, step=None):
    """Trigger the configured fault if it matches (local)."""
    if _PARSED is None:
        return
    p, r, s, action = _PARSED
    if p != phase or (r != "*" and int(r) != rank) or (s != "*" and step is not None and int(s) != step):
        return
    _fire(phase, action)


def _fire(phase, action):
    """Local: do ``action`` at ``phase`` (once only with ``_HPCCKPT_FAULT_ONCE``)."""
    once = os.environ.get("_HPCCKPT_FAULT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
    if action == "error":
        raise OSError(errno.ENOSPC, "No space left on device (injected fault)", phase)
    if action == "interrupt":
        raise KeyboardInterrupt(f"injected at {phase}")
    if action == "exit":
        raise SystemExit(5)
    if action == "sleep" or action.startswith("sleep="):
        time.sleep(float(action.partition("=")[2] or 5))
        return
    if action == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        return
    os.kill(os.getpid(), signal.SIGKILL)


class HalfWay:
    """A callable for storage loops: fires ``hit(phase)`` once after ``after_calls`` calls."""

    def __init__(self, phase, rank, step, after_calls=1):
        self.phase, self.rank, self.step, self.left = phase, rank, step, after_calls

    def __call__(self):
        self.left -= 1
        if self.left == 0:
            hit(self.phase, self.rank, self.step)


def active():
    return _PARSED is not None


# ---------------------------------------------------------------------- faults through the Level interface
LEVEL_ENV = "_HPCCKPT_LEVEL_FAULT"
# the phases: methods of levels/base.Level: (where the call's step is: argument 0, its manifest's, or none;
# whether the method is collective)
PHASES = {"ready": (None, True), "prepare": ("arg", True), "protect": ("manifest", True),
          "retire": ("manifest", True), "clear_earlier": (None, True), "recover": ("arg", True),
          "restore": ("arg", True), "close": (None, True),
          "offers": (None, False), "discard": (None, False), "pinned_steps": (None, False), "abandon": (None, False)}
RAISING = ("error", "interrupt", "exit")    # fired after a collective phase has run on this rank


def _parse_level(spec):
    """(level, phase, rank, step, action) of a ``_HPCCKPT_LEVEL_FAULT`` value; ValueError if malformed."""
    parts = spec.split(":")
    if not 3 <= len(parts) <= 5 or parts[1] not in PHASES:
        raise ValueError(f"{LEVEL_ENV}={spec!r}: expected LEVEL:PHASE:RANK[:STEP[:ACTION]], PHASE one of "
                         f"{', '.join(PHASES)}")
    level, phase, rank, step, action = parts + [""] * (5 - len(parts))
    return level, phase, rank, step or "*", action or "error"


def wrap_level(level, rank):
    """Local, test-only: ``level`` itself, or the FaultyLevel proxy around it when
    ``_HPCCKPT_LEVEL_FAULT`` names this level (on every rank; it fires on the rank named)."""
    spec = os.environ.get(LEVEL_ENV, "")
    if not spec:
        return level
    name, phase, r, step, action = _parse_level(spec)
    if name not in ("*", level.name):
        return level
    here = r == "*" or int(r) == rank     # every rank gets the proxy: the protocol sees the same level everywhere
    return _proxy_class(type(level), phase)(level, phase if here else None, None if step == "*" else int(step), action)


class FaultyLevel(Level):
    """A Level that hands every call to the wrapped one, firing a fault at one phase. Made by
    ``_proxy_class``: it has the phases the wrapped level's class has of its own, and the faulted
    one (the protocol skips a phase that is the interface's no-op)."""

    def __init__(self, level, phase, step, action):
        object.__setattr__(self, "_level", level)
        object.__setattr__(self, "_fault", (phase, step, action))

    def __getattr__(self, attr):        # what the interface does not name (ctx, sent, store, ...)
        if attr in ("_level", "_fault"):
            raise AttributeError(attr)
        return getattr(self._level, attr)

    def __setattr__(self, attr, value):
        setattr(self._level, attr, value)

    def background(self):
        return self._level.background()

    def prepares(self):
        return self._level.prepares()

    def comms(self):
        return self._level.comms()

    def placement_warnings(self, node_of, options, config):
        return self._level.placement_warnings(node_of, options, config)

    def __repr__(self):
        return f"FaultyLevel({self._level!r}, {':'.join(map(str, self._fault))})"


def _phase(method):
    where, collective = PHASES[method]

    def call(self, *args, **kwargs):
        phase, at, action = self._fault
        fire = False
        if method == phase:
            first = args[0] if args else next(iter(kwargs.values()), None)
            step = None if where is None or first is None else first.step if where == "manifest" else first
            fire = at is None or step is None or step == at
        after = fire and collective and action in RAISING
        if fire and not after:
            _fire(f"{self.name}.{method}", action)
        out = getattr(self._level, method)(*args, **kwargs)
        if after:
            _fire(f"{self.name}.{method}", action)
        return out
    call.__name__ = call.__qualname__ = method
    return call


for _attr in [a for a, v in vars(Level).items() if not a.startswith("_") and not callable(v)
              and not isinstance(v, (classmethod, staticmethod, property))]:
    # the class attributes of the interface (name, order, redundant, restores, settings, files, ...): the level's
    setattr(FaultyLevel, _attr, property(lambda self, a=_attr: getattr(self._level, a)))

_classes = {}


def _proxy_class(cls, phase):
    """The FaultyLevel subclass for a level of class ``cls`` faulted at ``phase``."""
    key = (cls, phase)
    if key not in _classes:
        own = [m for m in PHASES if m == phase or getattr(cls, m) is not getattr(Level, m)]
        _classes[key] = type(f"Faulty{cls.__name__}", (FaultyLevel,), {m: _phase(m) for m in own})
    return _classes[key]
