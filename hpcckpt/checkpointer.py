"""The Checkpointer: the save and restore protocols, step by step, in one place.

Save (``checkpoint``), collective:
  1. every rank passes the same step and level and protects the same array names;
  2. each rank writes its arrays into the step directory of its node cache, hashing while
     writing (no manifest yet: the step does not exist);
  3. all ranks agree that every rank wrote its data — otherwise every rank raises and the
     previous checkpoints are untouched;
  4. each rank writes its manifest atomically (temp + fsync + rename): the commit;
  5. all ranks agree that every rank committed;
  6. only then are checkpoints beyond ``keep`` (and leftovers of an abandoned run) retired.
Restore (``restart``), collective:
  1. each rank lists the manifests it can read;
  2. the candidates are the steps every rank committed with the same checkpoint id;
  3. newest first: every rank checks its arrays match and re-hashes its data; if any rank
     cannot verify, all fall back to the next candidate (the arrays are not touched yet);
  4. every rank fills its protected arrays in place; newer, unusable steps are removed.
"""
import dataclasses
import logging
import os
import time
import uuid

import numpy as np

from . import faults, manifest as mf
from .comm import Collective, agree
from .config import LEVELS, Config
from .errors import (CheckpointWriteError, HpcCkptError, IncompatibleCheckpointError, MismatchError,
                     ProtectError)
from .levels.local import LocalCache
from .topology import Topology

log = logging.getLogger("hpcckpt")
AVAILABLE_LEVELS = ("local",)


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What one checkpoint did: bytes over all ranks, seconds of the slowest rank to commit."""
    step: int
    level: str
    bytes: int
    seconds: float

    @property
    def bandwidth(self):
        """Aggregate bytes per second."""
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


@dataclasses.dataclass
class _Protected:
    array: np.ndarray
    global_shape: tuple
    offset: tuple


class Checkpointer:
    """Protects NumPy arrays of an MPI application across failures.

    ``Checkpointer(comm, config=None, **overrides)`` is collective; use it as a context manager.
    """

    def __init__(self, comm, config=None, **overrides):
        self.comm = comm
        self._closed = False
        self._arrays = {}
        self._last_step = None
        self._due = None
        with Collective(comm, "Checkpointer configuration"):
            self.config = Config.load(config, **overrides)
            self.policy = self._make_policy()
        _setup_logging(self.config, comm.rank)
        self.topology = Topology.build(comm, self.config.ranks_per_node)
        self.cache = LocalCache(self.config, self.topology)
        with Collective(comm, "creating the cache directory") as c:
            self.cache.prepare()

    def _make_policy(self):
        from .policy import Policy
        cfg = self.config
        named = set(cfg.schedule or {}) | set(cfg.level_mtbf or {}) | {cfg.level}
        return Policy(kind=cfg.policy, mtbf=cfg.mtbf, level_mtbf=cfg.level_mtbf, schedule=cfg.schedule,
                      levels=tuple(lv for lv in LEVELS if lv in named), end_time=cfg.end_time,
                      exit_safety=cfg.exit_safety)

    # ------------------------------------------------------------------ context manager
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self._closed = True  # no collective calls while an exception unwinds: peers may be elsewhere
        return False

    def close(self):
        """Collective: wait for pending work, then release. Calling it twice is harmless."""
        if not self._closed:
            self.wait()
            self._closed = True

    def _check_open(self):
        if self._closed:
            raise HpcCkptError("this Checkpointer is closed")

    # ------------------------------------------------------------------ protect
    def protect(self, name, array, *, global_shape=None, offset=None):
        """Local: register ``array`` by reference under ``name``; restart() fills it in place.

        ``global_shape``/``offset`` place the array as a block of a global array (for the pfs
        level and restarts on another rank count); give both or neither.
        """
        self._check_open()
        mf.check_array_name(name)
        if name in self._arrays:
            raise ProtectError(f"array {name!r} is already protected; call unprotect({name!r}) first")
        if not isinstance(array, np.ndarray):
            raise ProtectError(f"array {name!r}: expected a NumPy ndarray, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise ProtectError(f"array {name!r} is not C-contiguous; protect a contiguous array "
                               "(np.ascontiguousarray makes a copy, which would not be filled in place)")
        if not array.flags.writeable:
            raise ProtectError(f"array {name!r} is read-only; restart() must be able to fill it in place")
        mf.check_dtype(array.dtype)
        if (global_shape is None) != (offset is None):
            raise ProtectError(f"array {name!r}: give both global_shape and offset, or neither")
        if global_shape is not None:
            global_shape = _int_tuple(global_shape, name, "global_shape")
            offset = _int_tuple(offset, name, "offset")
            mf.check_global_layout(array.shape, global_shape, offset,
                                   lambda msg: ProtectError(f"array {name!r}: {msg}"))
        self._arrays[name] = _Protected(array, global_shape, offset)

    def unprotect(self, name):
        """Local: stop protecting ``name``."""
        if self._arrays.pop(name, None) is None:
            raise ProtectError(f"array {name!r} is not protected")

    @property
    def protected(self):
        """Names of the protected arrays, in protection order."""
        return tuple(self._arrays)

    # ------------------------------------------------------------------ schedule
    def need_checkpoint(self, step):
        """Collective: the level due at ``step`` (decided on rank 0, the same on every rank), or None."""
        self._check_open()
        level = self.policy.decide(step) if self.comm.rank == 0 else None
        level = self.comm.bcast(level, root=0)
        self._due = (step, level)
        return level

    def should_exit(self):
        """Collective: True when the application should stop (wall-clock limit reached)."""
        self._check_open()
        return bool(self.comm.bcast(self.policy.should_exit() if self.comm.rank == 0 else None, root=0))

    # ------------------------------------------------------------------ save
    def checkpoint(self, step, level=None):
        """Collective: checkpoint the protected arrays as ``step``; return a CheckpointInfo."""
        self._check_open()
        t0 = time.perf_counter()
        if level is None:
            level = self._due[1] if self._due and self._due[0] == step and self._due[1] else self.config.level

        # 1. the same call on every rank
        with Collective(self.comm, f"checkpoint({step!r}, level={level!r})") as c:
            self._check_checkpoint_args(step, level)
            c.value = (step, level, tuple(self._arrays), uuid.uuid4().hex if self.comm.rank == 0 else None)
        _check_same(c.values, ("step", "level", "protected array names"))
        ckpt_id = c.values[0][3]

        try:
            manifest, values = self._write_and_commit(step, level, ckpt_id, t0)
        except HpcCkptError:
            self._discard(step)  # every rank raises; no rank keeps a piece of this step
            raise
        seconds = max(v[1] for v in values)
        info = CheckpointInfo(step, level, sum(v[0] for v in values), seconds)

        # 6. retire what the new checkpoint replaces (local; failures only warn)
        self._last_step = step
        self._retire(keep_upto=step)
        if self.comm.rank == 0:
            self.policy.record_checkpoint(level, seconds)
        return info

    def _write_and_commit(self, step, level, ckpt_id, t0):
        """Collective: steps 2-5 of the save protocol; returns this rank's manifest and every
        rank's (bytes, seconds)."""
        # 2-3. write this rank's data, then agree that every rank did
        with Collective(self.comm, f"writing checkpoint {step}"):
            try:
                manifest = self.cache.write(step, ckpt_id, level, self._array_list())
                faults.hit("written", self.comm.rank, step)
            except OSError as e:
                raise CheckpointWriteError(f"cannot write {e.filename or self.cache.root}: {e.strerror}") from e
        # 4-5. commit: every rank writes its manifest; agree that every rank did
        with Collective(self.comm, f"committing checkpoint {step}") as c:
            faults.hit("commit", self.comm.rank, step)
            try:
                self.cache.commit(manifest)
            except OSError as e:
                raise CheckpointWriteError(f"cannot write the manifest of step {step}: {e.strerror}") from e
            faults.hit("committed", self.comm.rank, step)
            c.value = (manifest.data_size, time.perf_counter() - t0)
        return manifest, c.values

    def _discard(self, step):
        """Local: remove this rank's part of a step that failed to commit (best effort)."""
        try:
            self.cache.retire(step)
        except OSError as e:
            log.warning("rank %d: could not clean up failed step %d: %s", self.comm.rank, step, e)

    def _check_checkpoint_args(self, step, level):
        if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
            raise HpcCkptError(f"step must be a non-negative integer, got {step!r}")
        if level not in LEVELS:
            raise HpcCkptError(f"unknown level {level!r}; levels are {', '.join(LEVELS)}")
        if level not in AVAILABLE_LEVELS:
            raise HpcCkptError(f"level {level!r} is not available in this version of hpcckpt "
                               f"(available: {', '.join(AVAILABLE_LEVELS)})")
        if not self._arrays:
            raise HpcCkptError("nothing to checkpoint: protect() at least one array first")
        if self._last_step is not None and step <= self._last_step:
            raise HpcCkptError(f"step {step} is not newer than the last checkpoint or restart step "
                               f"{self._last_step}; steps must increase")

    def _array_list(self):
        return [(name, p.array, p.global_shape, p.offset) for name, p in self._arrays.items()]

    def _retire(self, keep_upto):
        """Local: keep this rank's newest ``keep`` committed steps up to ``keep_upto``; remove the
        rest (older ones, uncommitted leftovers, and steps of an abandoned run after it)."""
        steps = self.cache.steps_on_disk()
        committed = [s for s in steps if s <= keep_upto and os.path.exists(self.cache.manifest_path(s))]
        kept = committed[-self.config.keep:]
        for step in steps:
            if step not in kept:
                try:
                    self.cache.retire(step)
                except OSError as e:
                    log.warning("rank %d: could not remove old checkpoint step %d: %s", self.comm.rank, step, e)

    # ------------------------------------------------------------------ restore
    def restart(self):
        """Collective: fill the protected arrays from the newest step every rank can restore.

        Returns that step, or None when there is none (the arrays are then untouched).
        """
        self._check_open()
        with Collective(self.comm, "restart: scanning checkpoints") as c:
            if not self._arrays:
                raise HpcCkptError("nothing to restore: protect() the arrays before restart()")
            found = self.cache.scan()
            c.value = {s: (m.ckpt_id if isinstance(m, mf.RankManifest) else m) for s, m in found.items()}
        candidates, problems = _candidates(c.values)
        newest_incompatible = max((s for s, (kind, _) in problems.items() if kind == "incompatible"), default=-1)
        if newest_incompatible > max(candidates, default=-1):
            raise IncompatibleCheckpointError(problems[newest_incompatible][1])
        for step, reason in sorted(problems.items(), reverse=True):
            if step > max(candidates, default=-1) and self.comm.rank == 0:
                log.warning("step %d cannot be restored: %s", step, reason[1])

        for step in candidates:
            manifest = found[step]
            with Collective(self.comm, f"restart from step {step}") as c:
                self._check_matches(manifest)
                try:
                    self.cache.verify(manifest)
                except HpcCkptError as e:
                    c.value = str(e)
            damaged = [(r, v) for r, v in enumerate(c.values) if v]
            if damaged:
                if self.comm.rank == 0:
                    log.warning("step %d cannot be restored (%s); falling back to an older checkpoint",
                                step, "; ".join(f"rank {r}: {v}" for r, v in damaged[:4]))
                continue
            with Collective(self.comm, f"restoring step {step}"):
                self.cache.read_into(manifest, {n: p.array for n, p in self._arrays.items()})
            self._last_step = step
            self._retire(keep_upto=step)
            if self.comm.rank == 0:
                log.info("restarted from step %d", step)
            self.policy.start()
            return step
        self.policy.start()
        return None

    def _check_matches(self, manifest):
        """Raise MismatchError unless the protected arrays match ``manifest`` exactly."""
        ours, theirs = set(self._arrays), {a.name for a in manifest.arrays}
        if ours != theirs:
            parts = []
            if theirs - ours:
                parts.append(f"the checkpoint has {sorted(theirs - ours)} which are not protected")
            if ours - theirs:
                parts.append(f"protected {sorted(ours - theirs)} are not in the checkpoint")
            raise MismatchError(f"step {manifest.step}: " + " and ".join(parts))
        for a in manifest.arrays:
            arr = self._arrays[a.name].array
            if tuple(arr.shape) != a.shape or arr.dtype.str != a.dtype:
                raise MismatchError(f"step {manifest.step}, array {a.name!r}: the checkpoint holds "
                                    f"shape {a.shape} {a.dtype}, the protected array is {tuple(arr.shape)} "
                                    f"{arr.dtype.str}")

    # ------------------------------------------------------------------ background work
    def wait(self):
        """Collective: return once pending background work is durable; raise its errors on all ranks."""
        self._check_open()
        agree(self.comm, None, None, "wait")


def _candidates(per_rank):
    """Steps every rank committed with the same id (newest first), and {step: (kind, reason)}."""
    size = len(per_rank)
    steps = set().union(*[set(d) for d in per_rank])
    candidates, problems = [], {}
    for step in steps:
        values = [d.get(step) for d in per_rank]
        bad = [(r, v) for r, v in enumerate(values) if isinstance(v, tuple)]
        if bad:
            kind = "incompatible" if any(v[0] == "incompatible" for _, v in bad) else "damaged"
            r, v = next((r, v) for r, v in bad if v[0] == kind)
            problems[step] = (kind, f"rank {r}: {v[1]}")
        elif any(v is None for v in values):
            missing = [r for r, v in enumerate(values) if v is None]
            problems[step] = ("missing", f"not committed on rank(s) {missing[:8]} of {size}")
        elif len(set(values)) > 1:
            problems[step] = ("mixed", "ranks hold pieces of different runs")
        else:
            candidates.append(step)
    return sorted(candidates, reverse=True), problems


def _check_same(values, what):
    first = values[0][:len(what)]
    for rank, v in enumerate(values):
        for name, a, b in zip(what, first, v):
            if a != b:
                raise HpcCkptError(f"the ranks disagree on the {name}: rank 0 has {a!r}, rank {rank} has {b!r}; "
                                   "every rank must make the same collective call")


def _int_tuple(value, name, what):
    try:
        t = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ProtectError(f"array {name!r}: {what} must be a sequence of integers, got {value!r}") from None
    if any(v < 0 for v in t):
        raise ProtectError(f"array {name!r}: {what} must not be negative, got {value!r}")
    return t


def _setup_logging(cfg, rank):
    log.setLevel(cfg.log_level.upper())
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"hpcckpt[rank {rank}] %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
