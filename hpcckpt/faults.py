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
"""
import errno
import os
import signal
import time

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


def wrap_level(level, rank):
    """Test-only: the Level object itself (the level-fault wrapper is not written yet)."""
    return level
