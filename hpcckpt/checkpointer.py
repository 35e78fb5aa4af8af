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
import threading
import time
import uuid

import numpy as np

from . import faults, manifest as mf, slurm
from .comm import Collective, agree
from .config import LEVELS, Config
from .errors import (CheckpointWriteError, CorruptCheckpointError, HpcCkptError, IncompatibleCheckpointError,
                     MismatchError, ProtectError)
from .levels.local import LocalCache
from .levels.partner import PartnerLevel
from .levels.pfs import PfsStore
from .topology import Topology, survivability_warnings

log = logging.getLogger("hpcckpt")
AVAILABLE_LEVELS = ("local", "partner", "xor", "rs", "pfs")
REDUNDANT_LEVELS = ("partner", "xor", "rs")


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
        self._levels = {}
        self._warned = False
        self._pfs = None
        self._flush = None        # the background pfs flush: (step, thread, result dict)
        self._stopping = False    # a stop was requested (signal or stop file): final pfs checkpoint, then exit
        self._final_done = False
        with Collective(comm, "Checkpointer configuration"):
            self.config = Config.load(config, **overrides)
            self.policy = self._make_policy()
        _setup_logging(self.config, comm.rank)
        self.topology = Topology.build(comm, self.config.ranks_per_node)
        self.cache = LocalCache(self.config, self.topology)
        with Collective(comm, "creating the cache directory"):
            self.cache.prepare()
        if set(self.policy_levels) & set(REDUNDANT_LEVELS):
            self._warn_survivability()
        self._setup_slurm()

    def _make_policy(self):
        from .policy import Policy
        cfg = self.config
        named = set(cfg.schedule or {}) | set(cfg.level_mtbf or {}) | {cfg.level}
        self.policy_levels = tuple(lv for lv in LEVELS if lv in named)
        return Policy(kind=cfg.policy, mtbf=cfg.mtbf, level_mtbf=cfg.level_mtbf, schedule=cfg.schedule,
                      levels=self.policy_levels, end_time=cfg.end_time, exit_safety=cfg.exit_safety)

    def _setup_slurm(self):
        """Inside a SLURM job: stop signals only set a flag (default USR1, for --signal=B:USR1@T
        forwarded by the job script), and the job's end time feeds the wall-clock policy."""
        signals = self.config.stop_signals
        if signals == "auto":
            signals = ("SIGUSR1",) if slurm.in_slurm() else ()
        if signals:
            slurm.install_stop_handler(signals)
        if self.config.end_time is None and slurm.in_slurm() and self.comm.rank == 0:
            end = slurm.job_end_time()
            if end is not None:
                self.policy.set_end_time(end)
                log.info("job %s ends at %s", slurm.job_id(), time.ctime(end))

    def _warn_survivability(self):
        """Rank 0, once: say what the redundancy levels cannot survive with this placement."""
        if not self._warned and self.comm.rank == 0:
            for text in survivability_warnings(self.topology.node_of, self.config.group_size, self.config.rs_parity):
                log.warning("%s", text)
        self._warned = True

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
            if self._pfs is not None:
                self._pfs.close()
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
        with Collective(self.comm, f"need_checkpoint({step!r})") as c:
            c.value = (self.policy.decide(step) if self.comm.rank == 0 else None, slurm.stop_requested())
        level = c.values[0][0]
        if any(v[1] for v in c.values) and not self._stopping:
            self._stopping = True           # every rank sees this at the same step
            if self.comm.rank == 0:
                log.warning("stop requested (%s): taking a final pfs checkpoint at step %s",
                            slurm.stop_reason() or "another rank", step)
        if self._stopping and not self._final_done:
            level = "pfs"
        self._due = (step, level)
        return level

    def should_exit(self):
        """Collective: True when the application should stop (wall-clock limit reached)."""
        self._check_open()
        with Collective(self.comm, "should_exit()") as c:
            c.value = self.policy.should_exit() if self.comm.rank == 0 else None
        return bool(c.values[0]) or (self._stopping and self._final_done)

    # ------------------------------------------------------------------ save
    def checkpoint(self, step, level=None):
        """Collective: checkpoint the protected arrays as ``step``; return a CheckpointInfo."""
        self._check_open()
        self.wait()               # a background flush must be done (and its error raised) first
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

        # 5b. pfs: flush the committed step to the parallel file system (now or in the background)
        self._last_step = step
        if level == "pfs":
            if self.config.async_flush and _threads_ok():
                self._start_flush(step, ckpt_id, manifest)
            else:
                self._flush_to_pfs(step, ckpt_id, self._array_list())
                seconds = max(seconds, self.comm.allreduce(time.perf_counter() - t0, op=_max_op()))
        info = CheckpointInfo(step, level, sum(v[0] for v in values), seconds)

        if self._stopping and level == "pfs":
            self.wait()                     # the final checkpoint must be durable before exiting
            self._final_done = True
        # 6. retire what the new checkpoint replaces (local; failures only warn)
        self._retire(keep_upto=step)
        if self.comm.rank == 0 and level in self.policy_levels:
            self.policy.record_checkpoint(level, seconds)   # rank 0 only: must not raise alone
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
        # 3b. redundancy across nodes: partner copies or parity (collective, errors agreed)
        if level in REDUNDANT_LEVELS:
            self._warn_survivability()
            with Collective(self.comm, f"encoding checkpoint {step} ({level})"):
                try:
                    self._level(level).encode(step, manifest)
                except OSError as e:
                    raise CheckpointWriteError(f"cannot write the {level} redundancy of step {step}: "
                                               f"{e.strerror} ({e.filename})") from e
        # 4-5. commit: every rank writes its manifest; agree that every rank did
        with Collective(self.comm, f"committing checkpoint {step}") as c:
            try:
                faults.hit("commit", self.comm.rank, step)
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
        if self._flush is not None:
            kept.append(self._flush[0])   # its files are being read by the background flush
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
            c.value = {s: ((m.ckpt_id, m.level) if isinstance(m, mf.RankManifest) else m) for s, m in found.items()}
        candidates, problems = _candidates(c.values)
        store = self._pfs_store(create=False)
        pfs_steps = store.steps() if store is not None else []
        newest = max([s for s, _, _ in candidates] + pfs_steps, default=-1)
        newest_incompatible = max((s for s, (kind, _) in problems.items() if kind == "incompatible"), default=-1)
        if newest_incompatible > newest:
            raise IncompatibleCheckpointError(problems[newest_incompatible][1])
        for step, reason in sorted(problems.items(), reverse=True):
            if step > newest and self.comm.rank == 0:
                log.warning("step %d cannot be restored: %s", step, reason[1])

        cached = {s: (ckpt_id, level) for s, ckpt_id, level in candidates}
        for step in sorted(set(cached) | set(pfs_steps), reverse=True):
            # the cheapest level first: the node-local cache (rebuilt if needed), then pfs
            restored = step in cached and self._restore_step(step, *cached[step], found.get(step))
            if not restored and step in pfs_steps:
                restored = self._restore_from_pfs(step)
            if restored:
                self._last_step = step
                self._retire(keep_upto=step)
                if self.comm.rank == 0:
                    log.info("restarted from step %d", step)
                self.policy.start()
                return step
        if self.comm.rank == 0:
            if cached or pfs_steps or problems:
                log.warning("no checkpoint can be restored; the arrays are left as they are")
            else:
                log.info("no checkpoint to restart from (nothing committed in %s%s)", self.config.cache_dir,
                         f" or {self.config.pfs_dir}" if self.config.pfs_dir else "")
        self.policy.start()
        return None

    def _restore_step(self, step, ckpt_id, level, manifest):
        """Collective: verify ``step`` on every rank, rebuild lost ranks from redundancy when the
        level has it, then fill the arrays. False (arrays untouched) when it cannot be restored."""
        manifest = manifest if isinstance(manifest, mf.RankManifest) else None
        # 1. every rank re-hashes its own data (protected arrays are checked against the manifest)
        with Collective(self.comm, f"restart from step {step}") as c:
            c.value = self._verify_local(step, manifest)
        problems = [(r, v) for r, v in enumerate(c.values) if v]
        if problems:
            # 2. rebuild what is lost from partner copies or parity
            if level not in REDUNDANT_LEVELS:
                self._warn_fallback(step, problems)
                return False
            data_ok = [v is None for v in c.values]
            with Collective(self.comm, f"rebuilding step {step} from the {level} level") as c:
                c.value = self._level(level).recover(step, ckpt_id, data_ok)
            if not all(c.values):
                self._warn_fallback(step, problems, f"the {level} level cannot rebuild it")
                return False
            with Collective(self.comm, f"restart from step {step} after the rebuild") as c:
                manifest = self.cache.read_manifest(step, quiet=True)
                # the survivors' data files were verified above and the rebuild does not touch them
                c.value = None if data_ok[self.comm.rank] else self._verify_local(step, manifest)
            again = [(r, v) for r, v in enumerate(c.values) if v]
            if again:
                self._warn_fallback(step, again, "the rebuilt data does not verify")
                return False
            if self.comm.rank == 0:
                log.warning("step %d: rebuilt rank(s) %s from the %s level", step, [r for r, _ in problems], level)
        # 3. fill the protected arrays in place
        with Collective(self.comm, f"restoring step {step}"):
            self.cache.read_into(manifest, {n: p.array for n, p in self._arrays.items()})
        return True

    def _restore_from_pfs(self, step):
        """Collective: fill the arrays from pfs step ``step``; False (untouched) when it is damaged."""
        try:
            self._pfs.restore(step, self._array_list())
        except CorruptCheckpointError as e:
            if self.comm.rank == 0:
                log.warning("pfs step %d cannot be restored (%s); falling back to an older checkpoint", step, e)
            return False
        if self.comm.rank == 0:
            log.info("restored step %d from pfs", step)
        return True

    def _verify_local(self, step, manifest):
        """Local: None when this rank's part of ``step`` verifies, else the reason.
        Raises MismatchError when the protected arrays differ from the checkpoint."""
        if manifest is None:
            manifest = self.cache.read_manifest(step, quiet=True)
            if manifest is None:
                return "no readable manifest"
        self._check_matches(manifest)
        try:
            self.cache.verify(manifest)
        except HpcCkptError as e:
            return str(e)
        return None

    def _warn_fallback(self, step, problems, why=None):
        if self.comm.rank == 0:
            log.warning("step %d cannot be restored (%s%s); falling back to an older checkpoint", step,
                        "; ".join(f"rank {r}: {v}" for r, v in problems[:4]), f"; {why}" if why else "")

    def _level(self, level):
        """The redundancy level object (created on first use; creation may be collective)."""
        if level not in self._levels:
            if level == "partner":
                self._levels[level] = PartnerLevel(self.cache, self.comm, self.topology)
            else:   # imported here: Numba loads only in jobs that use xor or rs
                from .levels.encoded import EncodedLevel
                parity = 1 if level == "xor" else self.config.rs_parity
                self._levels[level] = EncodedLevel(self.cache, self.comm, self.topology, level, parity)
        return self._levels[level]

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
        if self._flush is None:
            return
        step, thread, result = self._flush
        thread.join()
        self._flush = None
        agree(self.comm, result.get("error"), None, f"background pfs flush of step {step}")
        if self.comm.rank == 0 and "seconds" in result:
            log.info("pfs flush of step %d took %.3f s in the background", step, result["seconds"])
        self._retire(keep_upto=self._last_step)

    # ------------------------------------------------------------------ the pfs level
    def _pfs_store(self, create=True):
        """Collective: the PfsStore (None when ``create`` is False and pfs_dir has no checkpoints)."""
        if self._pfs is None:
            if not create:
                root = os.path.join(self.config.pfs_dir, self.config.name)
                if not self.comm.bcast(os.path.isdir(root) if self.comm.rank == 0 else None, root=0):
                    return None
            self._pfs = PfsStore(self.config, self.comm, self.topology)
        return self._pfs

    def _flush_to_pfs(self, step, ckpt_id, arrays):
        """Collective: write ``arrays`` to the pfs level as ``step``, then keep the newest ``keep``."""
        store = self._pfs_store()
        store.save(step, ckpt_id, arrays)
        store.retire(self.config.keep)

    def _start_flush(self, step, ckpt_id, manifest):
        """Collective: flush the staged cache files of ``step`` to pfs in a background thread.

        The thread reads the committed node-local files (memory-mapped), never the live arrays,
        and talks MPI only on the PfsStore's own duplicated communicators.
        """
        self._pfs_store()          # collective: create it here, not in the thread
        arrays = self.cache.mapped_arrays(manifest)
        result = {}

        def run():
            t = time.perf_counter()
            try:
                self._flush_to_pfs(step, ckpt_id, arrays)
            except Exception as e:  # surfaced collectively by wait()
                result["error"] = e
            result["seconds"] = time.perf_counter() - t
        thread = threading.Thread(target=run, name=f"hpcckpt-flush-{step}", daemon=True)
        self._flush = (step, thread, result)
        thread.start()

    def scavenge(self):
        """Collective: copy the newest restorable cache checkpoint to pfs unless pfs has it already.

        For the end of a job (``hpcckpt scavenge``); needs no protected arrays. Returns the step
        copied, or None when there was nothing newer than pfs to copy.
        """
        self._check_open()
        with Collective(self.comm, "scavenge: scanning checkpoints") as c:
            found = self.cache.scan()
            c.value = {s: ((m.ckpt_id, m.level) if isinstance(m, mf.RankManifest) else m) for s, m in found.items()}
        candidates, _ = _candidates(c.values)
        store = self._pfs_store()
        on_pfs = set(store.steps())
        for step, ckpt_id, level in candidates:
            if step in on_pfs:
                return None
            with Collective(self.comm, f"scavenge: verifying step {step}") as c:
                m = found.get(step)
                m = m if isinstance(m, mf.RankManifest) else self.cache.read_manifest(step, quiet=True)
                c.value = "no readable manifest" if m is None else None
                if m is not None:
                    try:
                        self.cache.verify(m)
                    except HpcCkptError as e:
                        c.value = str(e)
            if any(c.values):
                continue
            self._flush_to_pfs(step, ckpt_id, self.cache.mapped_arrays(m))
            return step
        return None


def _candidates(per_rank):
    """Newest first: (step, ckpt_id, level) for steps some rank committed, every manifest of them
    naming the same checkpoint; and {step: (kind, reason)} for steps that cannot be candidates."""
    steps = set().union(*[set(d) for d in per_rank])
    candidates, problems = [], {}
    for step in steps:
        values = [d.get(step) for d in per_rank]
        incompatible = [(r, v) for r, v in enumerate(values) if v is not None and v[0] == "incompatible"]
        good = {v for v in values if v is not None and v[0] not in ("incompatible", "damaged")}
        if incompatible:
            r, v = incompatible[0]
            problems[step] = ("incompatible", f"rank {r}: {v[1]}")
        elif len(good) > 1:
            problems[step] = ("mixed", "ranks hold pieces of different runs")
        elif not good:
            problems[step] = ("damaged", "no rank has a readable manifest")
        else:
            (ckpt_id, level), = good
            candidates.append((step, ckpt_id, level))
    return sorted(candidates, reverse=True), problems


def _threads_ok():
    from mpi4py import MPI
    if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
        return True
    log.warning("async_flush needs MPI_THREAD_MULTIPLE; flushing synchronously")
    return False


def _max_op():
    from mpi4py import MPI
    return MPI.MAX


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
