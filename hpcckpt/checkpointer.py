"""The Checkpointer: the save and restore protocols, step by step, in one place.

Save (``checkpoint``), collective:
  1. every rank passes the same step and level (one fixed-size reduction; rank 0's checkpoint id
     travels in it);
  2. each rank writes what it checkpoints — its protected arrays and the state dict it passed —
     into the step directory of its node cache, hashing while writing (no manifest yet: the step
     does not exist);
  3. all ranks agree that every rank wrote its data and that the replicated values are the same
     everywhere — otherwise every rank raises and the previous checkpoints are untouched;
  4. redundancy for the level: partner copies or xor/rs parity;
  5. each rank writes its manifest atomically (temp + fsync + rename): the commit; all agree;
  6. pfs: the committed cache step is flushed to HDF5, now or in the background;
  7. only then are this run's checkpoints beyond ``keep`` retired. Checkpoints of earlier runs
     (other epochs) or of other jobs are never removed, except with ``start = "fresh"``.
Restore (``restart``), collective:
  1. each rank lists the manifests it can read; rank 0 lists the pfs steps;
  2. only the newest epoch (the newest run) counts; its steps are tried newest first, each chosen
     by one fixed-size reduction;
  3. every rank checks that its protected arrays and state match and re-hashes its data; if any
     rank cannot verify, the redundancy level rebuilds it, else all fall back to the next
     candidate (nothing is touched yet);
  4. every rank fills its arrays and state; this run continues that epoch.
Every per-call message on the success path is a fixed-size reduction on the library's own
communicator (duplicated from the application's); per-rank details travel only on failure.
"""
import atexit
import dataclasses
import json
import logging
import os
import sys
import threading
import time
import uuid
import weakref

import numpy as np
from mpi4py import MPI

from . import dtype_check, events, faults, manifest as mf, slurm, state as st, watchdog
from .codecs import xxh3
from .codecs.checksum import digest
from .comm import (U64_MAX, Collective, Deferred, agree, explain, is_collective, is_different_calls,
                   is_process_failure, mark_collective, print_abort_notice, reduce_sum_max, signals_deferred,
                   was_agreed)
from .config import LEVELS, LOCAL_KEYS, Config
from .errors import (CheckpointWriteError, ConfigError, CorruptCheckpointError, HpcCkptError,
                     IncompatibleCheckpointError, LayoutChangedError, MismatchError, ProtectError)
from .levels.local import LocalCache
from .levels.registry import REDUNDANT, SPECS
from .levels.pfs import PfsStore, listing as pfs_listing, remove_step_dir
from .levels.pfs_items import Item, items_from_manifest
from .levels.pfs_index import committed_steps as pfs_committed, max_index_bytes
from .lock import DirLock
from .protected import Protected, dropped, dropped_message
from .relocate import relocate
from .topology import Topology, survivability_warnings

log = logging.getLogger("hpcckpt")
_LEVEL_CODE = {lv: i + 1 for i, lv in enumerate(LEVELS)}     # 0 means "none" in reductions


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


class _Background:
    """The background work of one committed step (its redundancy, its pfs flush): a thread, its
    error, its duration. ``redundant``: the step's redundancy is part of it (so the previous
    redundant step is not retired before it completes)."""

    def __init__(self, step, level, work, redundant):
        self.step, self.level, self.redundant = step, level, redundant
        self.error, self.seconds = None, None
        self.what = "pfs flush" if level == "pfs" else f"{level} redundancy"

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


class Checkpointer:
    """Protects the state of an MPI application across failures.

    ``Checkpointer(comm, config=None, **overrides)`` is collective; use it as a context manager.

    ``_node_map`` (internal, for hpcckpt.online): with ``ranks_per_node = "auto"``, the rank ->
    node map to use instead of detecting one (one node index per rank, the same on every rank;
    numbered as ``Topology.build`` numbers them). An online job gives every Checkpointer it
    builds the map of its original placement, so that after a recovery a spare stands in for the
    lost rank's node: the manifests' placement still matches, survivors restore from their
    caches and the replacement is rebuilt from partner copies / parity. Ignored with an integer
    ``ranks_per_node`` (nothing is detected then).
    """

    def __init__(self, comm, config=None, *, _node_map=None, **overrides):
        self.comm = comm                 # the application's: never used for the library's messages
        self._closed = True
        self._locks = []
        # the same answer on every rank: raised on each, no hang
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL or comm.Is_inter():
            raise ConfigError(f"Checkpointer needs an intracommunicator (MPI.COMM_WORLD, or one made by Dup or "
                              f"Split), got {'MPI.COMM_NULL' if comm == MPI.COMM_NULL else repr(comm)}"
                              + (": an intercommunicator joins two groups that do not share one checkpoint"
                                 if isinstance(comm, MPI.Comm) and comm != MPI.COMM_NULL else ""))
        self._comm = comm.Dup()          # every message of the library goes on this one
        self._arrays = {}
        self._layouts = {}
        self._last_step = None
        self._due = None
        self._levels = {}
        self._warned = set()
        self._pfs = None
        self._flush = None               # the background work of the newest step (_Background) or None
        self._bg_comm = None             # the background thread's communicator (a Dup of _comm)
        self._epoch = None               # this run's lineage: known after restart() or the first checkpoint
        self._clear_others = False       # start = "fresh": remove earlier runs' checkpoints after our first commit
        self._committed = False
        self._stopping = False           # a stop was requested (signal or stop file): final pfs checkpoint, then exit
        self._final_done = False
        self._told_to_exit = False       # should_exit() has returned True once
        try:
            with Collective(self._comm, "Checkpointer configuration") as c:
                self.config = Config.load(config, **overrides)
                self.policy = self._make_policy()
                h = _settings_digest(self.config)
                c.words = [h, U64_MAX - h, 0 if _thread_multiple() else 1]
            if c.result[0] != U64_MAX - c.result[1]:
                self._settings_differ()
            self._threads = not c.result[2]     # every rank has MPI_THREAD_MULTIPLE: background work may run
            _setup_logging(self.config, comm.rank)
            watchdog.configure(self.config.stall_timeout, self.config.stall_action, comm.rank)
            if _node_map is not None and self.config.ranks_per_node == "auto":
                self.topology = Topology.given(self._comm, _node_map)     # pinned (hpcckpt.online)
            else:
                self.topology = Topology.build(self._comm, self.config.ranks_per_node)
            self.cache = LocalCache(self.config, self.topology)
            with Collective(self._comm, "creating the cache directory"):
                try:
                    self.cache.prepare()
                except OSError as e:
                    raise CheckpointWriteError(f"cannot create the cache directory {e.filename or self.cache.root}: "
                                               f"{e.strerror}") from e
                self._locks.append(DirLock(os.path.join(self.cache.root, f".lock.rank_{comm.rank:06d}"),
                                           f"job name {self.config.name!r} in {self.cache.root}", self.config.file_mode))
            self._closed = False
            _OPEN.add(self)
            _join_at_finalize()
            if self.config.abort_on_error:
                _install_excepthook()
            if comm.rank == 0:
                log.info("cache of rank 0: %s; pfs: %s", self.cache.root,
                         os.path.abspath(os.path.join(self.config.pfs_dir, self.config.name)))
            self._warn_survivability(self.policy_levels)
            self._setup_slurm()
            if comm.rank == 0:
                log.info("%s", self.policy.summary())
            self._events = events.EventLog(self.config.events_file, comm.rank, comm.size, self.config.name,
                                           self.config.file_mode, self.config.dir_mode)
            self._events.start(self)
        except BaseException as e:
            self._release_locks()       # a failed constructor never keeps the cache locked (online recovery reopens it)
            if is_process_failure(e):
                revoke(self._comm)      # ULFM: nobody stays blocked on our duplicate
            raise

    def _make_policy(self):
        from .policy import Policy
        cfg = self.config
        named = set(cfg.schedule or {}) | set(cfg.level_mtbf or {}) | {cfg.level}
        self.policy_levels = tuple(lv for lv in LEVELS if lv in named)
        # the checkpoint before the job's end is a pfs one whatever the schedule: node-local
        # files do not outlive the job (the job templates remove them; sites wipe $SLURM_TMPDIR)
        return Policy(kind=cfg.policy, mtbf=cfg.mtbf, level_mtbf=cfg.level_mtbf, schedule=cfg.schedule,
                      levels=self.policy_levels, exit_safety=cfg.exit_safety,
                      end_time=None if cfg.end_time is None else cfg.end_time - cfg.end_margin,
                      final_level="pfs")

    def _settings_differ(self):
        """Collective (failure path): name the settings that differ between ranks, raise everywhere."""
        mine = {k: v for k, v in self.config.as_dict().items() if k not in LOCAL_KEYS}

        def pick(everyone):
            for r, theirs in enumerate(everyone):
                if keys := sorted(k for k in mine if theirs.get(k) != mine.get(k)):
                    return (f"the configuration differs between ranks: rank {r} has "
                            + ", ".join(f"{k}={theirs[k]!r}" for k in keys[:4])
                            + " where rank 0 has " + ", ".join(f"{k}={mine[k]!r}" for k in keys[:4])
                            + "; every rank must use the same settings (they shape the messages between ranks)")
            return None
        text = explain(self._comm, mine, pick)
        self._comm.Free()
        raise mark_collective(ConfigError(text))

    def _setup_slurm(self):
        """Inside a SLURM job: stop signals only set a flag (default USR1, for --signal=B:USR1@T
        forwarded by the job script), and the job's end time feeds the wall-clock policy."""
        signals = self.config.stop_signals
        if signals == "auto":
            signals = ("SIGUSR1",) if slurm.in_slurm() else ()
        if signals and not slurm.install_stop_handler(signals):
            log.warning("rank %d: stop_signals %s are not handled: the Checkpointer was created outside the main "
                        "thread, and Python installs signal handlers only there (create it in the main thread, "
                        "or request the stop with the stop file: docs/SLURM.md)", self.comm.rank, list(signals))
        if self.config.end_time is None and slurm.in_slurm() and self.comm.rank == 0:
            end = slurm.job_end_time()
            if end is not None:
                self.policy.set_end_time(end - self.config.end_margin)
                log.info("job %s ends at %s%s", slurm.job_id(), time.ctime(end),
                         f"; the application by {time.ctime(end - self.config.end_margin)} (end_margin)"
                         if self.config.end_margin else "")

    def _warn_survivability(self, levels):
        """Rank 0, once per redundancy level: what it cannot survive with this placement."""
        new = [lv for lv in levels if lv in REDUNDANT and lv not in self._warned]
        self._warned.update(new)
        if new and self.comm.rank == 0:
            for text in survivability_warnings(self.topology.node_of, self.config.group_size, self.config.rs_parity,
                                               levels=new):
                log.warning("%s", text)

    # ------------------------------------------------------------------ context manager
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)
                                and not was_agreed(exc)):
            # leaving the block, or sys.exit(0) in it: close collectively. Ranks that leave it too
            # close with it; a rank making another hpcckpt call meanwhile gets a CollectiveError
            # naming both calls, and so does this one (never a hang). (A SystemExit that an
            # agreement already told the others about is an error of every rank: below.)
            self.close()
            return False
        # An exception is unwinding: no collective call, peers may be elsewhere.
        self._join_flush_unwinding()
        self._release_locks()
        self._closed = True
        self._abort_if_alone(exc)
        return False

    def _abort_if_alone(self, exc):
        """Local: with ``abort_on_error``, an exception of this rank alone (not one every rank
        agreed on; not sys.exit(0)) aborts the job, so that no other rank waits for this one."""
        if self.config.abort_on_error and _should_abort(exc) and self.comm.size > 1:
            print_abort_notice(exc, self.comm.rank)
            self.comm.Abort(_exit_code(exc))

    @events.recorded("close")
    def close(self):
        """Collective: wait for pending work, then release. Calling it twice is harmless."""
        if not self._closed and MPI.Is_finalized():      # no MPI call is possible: release what is local
            self._closed = True
            self.cache.close()
            self._release_locks()
            if self.topology.rank == 0:
                log.warning("close() after MPI.Finalize(): any background work was completed when MPI was "
                            "finalized; close the Checkpointer (or leave its with block) before finalizing MPI")
        if not self._closed:
            try:
                self._wait("close()")
            except BaseException as e:
                # after the agreement (retiring what the background work replaced), or before it:
                # raised on this rank alone, e.g. SystemExit from a signal handler, which no
                # excepthook sees; the other ranks have left close() or wait in it
                self._abort_if_alone(e)
                raise
            finally:
                for level in self._levels.values():
                    level.close()
                if self._bg_comm is not None:
                    self._bg_comm.Free()
                if self._pfs is not None:
                    self._pfs.close()
                self.cache.close()
                self.cache.remove_spares()
                self._release_locks()
                self._comm.Free()
                self._closed = True

    def abandon(self, timeout=10.0, revoke_comms=True):
        """Local: give this Checkpointer up after a process failure, without any communication.

        Its communicators may hold a failed process: each one it duplicated or split is revoked
        where the MPI can (ULFM), so that no peer stays blocked on it, and dropped without
        ``Free`` (a collective call). ``revoke_comms=False`` (after an error every rank agreed
        on: a peer may still be finishing that agreement) only drops them. A background thread
        is given ``timeout`` seconds to end (its communicator revoked, its next call fails) and
        is then left behind (not a daemon: the interpreter waits for it at exit).
        The lock files are released, so that a new Checkpointer of the same job can open the
        cache again. The files on disk are not touched. Harmless twice, and after close()."""
        if getattr(self, "_abandoned", False):
            return
        self._abandoned = True
        for c in self._owned_comms() if revoke_comms else ():
            revoke(c)
        if self._flush is not None:
            self._flush.thread.join(timeout)
            self._flush = None
        for level in self._levels.values():
            closer = getattr(level, "abandon", None)
            if closer is not None:
                closer()
        self._levels = {}
        self._pfs = None
        self.cache.close()
        self._release_locks()
        self._closed = True

    def _owned_comms(self):
        """The communicators this Checkpointer (its levels, its pfs store) created: its Dup, the
        background Dup, the levels' splits. Never the application's."""
        found, seen = [], set()
        for obj in [self, *self._levels.values(), self._pfs]:
            if obj is None:
                continue
            for value in vars(obj).values():
                if isinstance(value, MPI.Comm) and value != MPI.COMM_NULL and value is not self.comm \
                        and id(value) not in seen:
                    seen.add(id(value))
                    found.append(value)
        return found

    def _release_locks(self):
        for lock in self._locks:
            lock.release()
        self._locks = []

    def _check_open(self):
        if self._closed:
            raise HpcCkptError("this Checkpointer is closed")
        if MPI.Is_finalized():
            raise HpcCkptError("MPI is finalized: call the Checkpointer's methods and close() before MPI.Finalize()")

    # ------------------------------------------------------------------ what to protect
    def protect(self, name, array, *, global_shape=None, offset=None, layout=None):
        """Local: register ``array`` by reference under ``name``; restart() fills it in place.

        For code whose buffers never move; state that is rebound, grows or is not an array goes
        in the ``state`` dict of checkpoint()/restart() instead (docs/PORTING.md).
        ``global_shape``/``offset`` place the array as a block of a global array (the same as
        ``layout=hpcckpt.Block(global_shape, offset)``), for the pfs level's restarts on
        another rank count; ``layout`` may also be hpcckpt.ROWS, REPLICATED or ROOT.
        """
        self._check_open()
        mf.check_array_name(name)
        if name == st.STATE_ENTRY:
            raise ProtectError(f"array name {name!r} is reserved by hpcckpt")
        if name in self._arrays:
            raise ProtectError(f"array {name!r} is already protected; call unprotect({name!r}) first")
        if not isinstance(array, np.ndarray):
            raise ProtectError(f"array {name!r}: expected a NumPy ndarray, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise ProtectError(f"array {name!r} is not C-contiguous; protect a contiguous array "
                               "(np.ascontiguousarray makes a copy, which would not be filled in place)")
        if not array.flags.writeable:
            raise ProtectError(f"array {name!r} is read-only; restart() must be able to fill it in place")
        try:
            mf.check_array(array)
        except ProtectError as e:
            raise ProtectError(f"array {name!r}: {e}") from None
        if (global_shape is None) != (offset is None):
            raise ProtectError(f"array {name!r}: give both global_shape and offset, or neither")
        if global_shape is not None:
            if layout is not None:
                raise ProtectError(f"array {name!r}: give global_shape/offset or layout, not both")
            try:
                layout = st.Block(global_shape, offset)
            except ProtectError as e:
                raise ProtectError(f"array {name!r}: {e}") from None
        layout = st.PER_RANK if layout is None else st.as_layout(layout)
        _check_layout(name, array, layout, self.comm.rank)
        self._arrays[name] = Protected(array, layout)

    def unprotect(self, name):
        """Local: stop protecting ``name``."""
        self._check_open()
        if self._arrays.pop(name, None) is None:
            raise ProtectError(f"array {name!r} is not protected")

    def layout(self, name, layout):
        """Local: declare how the top-level name ``name`` of the state dict is spread over the
        ranks: hpcckpt.PER_RANK (default), ROWS, REPLICATED, ROOT or Block(global_shape, offset).
        Declare again to change it (a block's offset after a redistribution, for instance)."""
        self._check_open()
        if not isinstance(name, str) or not st.KEY_RE.match(name):
            raise ProtectError(f"layout: {name!r} is not a state key")
        self._layouts[name] = st.as_layout(layout)

    @property
    def protected(self):
        """Names of the protected arrays, in protection order."""
        return tuple(self._arrays)

    # ------------------------------------------------------------------ schedule
    def need_checkpoint(self, step):
        """Collective: the level due at ``step`` (decided on rank 0, the same on every rank), or None."""
        self._check_open()
        with Collective(self._comm, f"need_checkpoint({step!r})") as c:
            step = _check_step(step)
            due = _LEVEL_CODE.get(self.policy.decide(step), 0) if self.comm.rank == 0 else 0
            c.words = [due, 1 if slurm.stop_requested() else 0, step, U64_MAX - step]
        code, stop, hi, lo = c.result
        if hi != U64_MAX - lo:
            raise mark_collective(HpcCkptError(
                f"the ranks disagree on need_checkpoint(step): steps {U64_MAX - lo}..{hi}; every rank must make "
                "the same call"))
        level = LEVELS[code - 1] if code else None
        if stop and not self._stopping:
            self._stopping = True           # every rank sees this at the same step
            if self.comm.rank == 0:
                log.warning("stop requested (%s): taking a final pfs checkpoint at step %s",
                            slurm.stop_reason() or "another rank", step)
        if self._stopping and not self._final_done:
            level = "pfs"
        self._due = (step, level)
        return level

    def should_exit(self):
        """Collective: True when the application should stop (a stop request's final checkpoint
        is taken, or the job's end time is near). The first time, rank 0 writes a line to the
        file CKPT_STOPPED_FILE names, if any (docs/SLURM.md)."""
        self._check_open()
        with Collective(self._comm, "should_exit()") as c:
            c.words = [1 if self.comm.rank == 0 and self.policy.should_exit() else 0]
        end_time, stop = bool(c.result[0]), self._stopping and self._final_done
        if (end_time or stop) and not self._told_to_exit:
            self._told_to_exit = True
            if self.comm.rank == 0:
                self._report_stopped("a stop request" if stop else "the job's end time")
        return end_time or stop

    def _report_stopped(self, why):
        """Local (rank 0): the line for CKPT_STOPPED_FILE; a failure to write it only warns."""
        if self._final_done or self.policy.final_taken:
            text = f"stopped for {why}: final pfs checkpoint of step {self._last_step}"
        else:
            text = (f"stopped for {why} without a final checkpoint: "
                    + ("none was taken" if self._last_step is None else f"the newest is step {self._last_step}"))
        try:
            path = slurm.report_stopped(text)
        except OSError as e:
            log.warning("could not write %s (%s): %s", slurm.STOPPED_FILE_ENV, e, text)
        else:
            if path:
                log.info("%s (written to %s)", text, path)

    # ------------------------------------------------------------------ save
    @events.recorded("checkpoint")
    def checkpoint(self, step, state=None, level=None):
        """Collective: checkpoint the protected arrays and the ``state`` dict (what it holds now)
        as ``step``; return a CheckpointInfo.

        With ``background`` (partner, xor, rs, pfs) or ``async_flush`` (pfs) it returns once the
        local level is committed; the rest runs in a background thread, and the next call waits
        for it. If that background work failed, this checkpoint is still taken, and then its error
        is raised (a CheckpointWriteError whose ``info`` is this checkpoint's info)."""
        self._check_open()
        if isinstance(state, str) and level is None:     # checkpoint(step, "pfs"): the level, as before state dicts
            state, level = None, state
        flush_error = self._finish_flush(raise_error=False)
        t0 = time.perf_counter()
        if level is None:
            level = self._due[1] if self._due and self._due[0] == step and self._due[1] else self.config.level

        # 1. the same call on every rank; rank 0's checkpoint id comes with it
        with Collective(self._comm, f"checkpoint({step!r}, level={level!r})") as c:
            step = self._check_checkpoint_args(step, level, state)
            if stale := dropped(self._arrays):      # the application rebound a protected name
                raise ProtectError(dropped_message(step, stale))
            ident = uuid.uuid4().int if self.comm.rank == 0 else 0
            code = _LEVEL_CODE[level]
            names = _digest_int(sorted(self._arrays))      # protect() names: the same on every rank
            c.words = [step, U64_MAX - step, code, U64_MAX - code, ident >> 64, ident & U64_MAX,
                       names, U64_MAX - names]
        hi, lo, code_hi, code_lo, id_hi, id_lo, names_hi, names_lo = c.result
        if hi != U64_MAX - lo or code_hi != U64_MAX - code_lo:
            raise mark_collective(HpcCkptError(
                f"the ranks disagree on checkpoint(step, level): steps {U64_MAX - lo}..{hi}, levels "
                f"{LEVELS[U64_MAX - code_lo - 1]!r}..{LEVELS[code_hi - 1]!r}; every rank must make the same call"))
        if names_hi != U64_MAX - names_lo:
            self._names_differ()
        ckpt_id = f"{(id_hi << 64) | id_lo:032x}"
        if self._epoch is None:
            self._epoch = self._new_epoch()

        spec = SPECS[level]
        threads = (spec.redundant and self.config.background
                   or spec.flush and (self.config.async_flush or self.config.background)) and self._threads_ok()
        later_redundancy = spec.redundant and self.config.background and threads
        # a sync pfs step with pfs_direct_io: the pfs files are laid out first, filled while the cache copy is made
        early_flush = spec.flush and not threads and self.config.direct_io
        pending = None
        try:
            manifest, nbytes, seconds, pending = self._write_and_commit(step, level, ckpt_id, state, t0,
                                                                        encode=not later_redundancy,
                                                                        early_flush=early_flush)
        except HpcCkptError:
            self._discard(step, ckpt_id)  # every rank raises; no rank keeps a piece of this step
            self._report_lost_flush(flush_error)
            raise
        self._last_step = step
        if self._clear_others and not self._committed:
            self._clear_earlier_pfs()
        self._committed = True

        # 6. the rest in the background (redundancy, then its level's marker; the pfs flush), or
        #    the pfs flush now
        if threads:
            self._start_background(manifest, later_redundancy, spec.flush)
        elif spec.flush:
            try:
                self._flush_to_pfs(manifest, pending)
            except HpcCkptError:
                self._report_lost_flush(flush_error)
                raise
            seconds = reduce_sum_max(self._comm, 0, time.perf_counter() - t0)[1]
        info = CheckpointInfo(step, level, nbytes, seconds)

        if self._stopping and SPECS[level].flush:
            self.wait()                     # the final checkpoint must be durable before exiting
            self._final_done = True
        # 7. retire what the new checkpoint replaces (local; failures only warn)
        self._retire(keep_upto=step)
        if self.comm.rank == 0 and level in self.policy.measured_levels:
            self.policy.record_checkpoint(level, seconds)   # rank 0 only: must not raise alone
        if flush_error is not None:
            err = CheckpointWriteError(f"{flush_error} — step {step} was checkpointed ({level}) all the same")
            err.info = info
            raise mark_collective(err) from flush_error
        return info

    def _names_differ(self):
        """Collective (failure path): name the protected arrays that differ between ranks."""
        def pick(everyone):
            r, theirs = next((r, v) for r, v in enumerate(everyone) if v != everyone[0])
            return (f"the ranks disagree on the protected array names: rank 0 has {everyone[0][:8]}, rank {r} has "
                    f"{theirs[:8]}; every rank must protect the same names (values that exist on some ranks only "
                    "go in the state dict)")
        raise mark_collective(HpcCkptError(explain(self._comm, sorted(self._arrays), pick)))

    def _write_and_commit(self, step, level, ckpt_id, state, t0, encode=True, early_flush=False):
        """Collective: steps 2-5 of the save protocol; returns this rank's manifest, the bytes
        over all ranks, the seconds of the slowest rank and the pfs step begun (or None).
        ``encode`` False (background): the manifest is committed as a local checkpoint; the
        background work commits it at its level once the redundancy is complete. ``early_flush``
        (a sync pfs step): the pfs step is begun first and given the data as the cache write
        copies it (_flush_to_pfs finishes it); an error here abandons it."""
        items = pending = None
        if early_flush:
            with Collective(self._comm, f"checkpoint {step}: the arrays and state"):
                items, replicated_items = self._items(state)
            pending = self._pfs_store().begin(step, ckpt_id, [Item(n, a, layout, None) for n, a, layout in items],
                                              epoch=self._epoch, state_keys=self._state_keys_of(state))
        try:
            # 2-3. write this rank's data, then agree that every rank did (and that replicated
            # values are equal everywhere: the min and max of their digest, in the same reduction)
            with Collective(self._comm, f"writing checkpoint {step}") as c:
                if pending is not None:
                    pending.check()         # the pfs node file could not be laid out: nothing is written
                if items is None:
                    items, replicated_items = self._items(state)
                try:
                    manifest = self.cache.write(step, ckpt_id, level, self._epoch, items, pipe=pending)
                    faults.hit("written", self.comm.rank, step)
                except OSError as e:
                    raise CheckpointWriteError(f"cannot write {e.filename or self.cache.root}: {e.strerror}") from e
                replicated = _replicated_digests(manifest, replicated_items, items)
                h = _digest_int(replicated)
                c.words = [h, U64_MAX - h]
            if c.result[0] != U64_MAX - c.result[1]:
                self._replicated_differ(replicated, step)
            if not self._committed and ("pfs" in self.policy_levels or self.config.end_time is not None):
                dtype_check.check(self._comm, dtype_check.described(items, self.comm.rank), f"checkpoint {step}")
            return self._redundancy_and_commit(step, level, manifest, t0, encode) + (pending,)
        except BaseException:
            if pending is not None:
                self._pfs.abandon(pending)
            raise

    def _redundancy_and_commit(self, step, level, manifest, t0, encode):
        """Collective: steps 4-5 of the save protocol (_write_and_commit)."""
        # 4. redundancy across nodes: partner copies or parity (collective, errors agreed)
        committed = manifest
        if SPECS[level].redundant:
            self._warn_survivability((level,))
            if encode:
                with Collective(self._comm, f"encoding checkpoint {step} ({level})"):
                    committed = self._encode(self._level(level), manifest)
            else:
                committed = dataclasses.replace(manifest, level="local")
        # 5. commit: every rank writes its manifest; agree that every rank did
        with Collective(self._comm, f"committing checkpoint {step}"):
            try:
                faults.hit("commit", self.comm.rank, step)
                self.cache.commit(committed)
            except OSError as e:
                raise CheckpointWriteError(f"cannot write the manifest of step {step}: {e.strerror}") from e
            faults.hit("committed", self.comm.rank, step)
        nbytes, seconds = reduce_sum_max(self._comm, manifest.data_size, time.perf_counter() - t0)
        return manifest, nbytes, seconds

    def _encode(self, redundancy, manifest, error=None):
        """Local part of a collective encode: this rank's redundancy of ``manifest``'s step; returns
        the manifest to commit at the level (it may name an incremental base).
        ``error``: a local failure that came before (raised once the exchange is done)."""
        try:
            with signals_deferred():            # an interrupt mid-exchange would strand the peers
                committed = redundancy.encode(manifest.step, manifest)
            if error is not None:
                raise error
            return manifest if committed is None else committed
        except OSError as e:
            raise CheckpointWriteError(f"cannot write the {manifest.level} redundancy of step {manifest.step}: "
                                       f"{e.strerror}" + (f" ({e.filename})" if e.filename else "")) from e

    def _items(self, state):
        """Local: what this rank checkpoints: [(name, array, Layout)], and the encoded state
        items whose layout is replicated (for the cross-rank check)."""
        items = [(name, p.array, self._layouts.get(name, p.layout)) for name, p in self._arrays.items()]
        replicated = {}
        if state is not None:
            flat = st.flatten(state)
            for path, array, top in flat.arrays:
                layout = self._layouts.get(top, st.PER_RANK)
                if layout.kind in ("block", "rows") and path != top:
                    raise ProtectError(f"state[{top!r}]: a {layout.kind} layout needs an array, not a dict of arrays")
                _check_layout(path, array, layout, self.comm.rank)
                items.append((path, array, layout))
            layouts = {}
            for key in state:
                layout = self._layouts.get(key, st.PER_RANK)
                if layout.kind in ("block", "rows") and not isinstance(state[key], np.ndarray):
                    raise ProtectError(f"state[{key!r}]: a {layout.kind} layout needs an array, not a "
                                       f"{type(state[key]).__name__} (declare REPLICATED, ROOT or no layout for it)")
                if layout.kind != "rank":
                    layouts[key] = layout.to_json()
                if layout.kind == "root" and self.comm.rank != 0:
                    raise ProtectError(f"state[{key!r}] is declared ROOT (rank 0 only) but rank {self.comm.rank} "
                                       "holds it")
                if layout.kind == "replicated":
                    replicated[key] = flat.document["items"][key]
            flat.document["layouts"] = layouts
            items.append((st.STATE_ENTRY, st.document_array(flat.document), st.PER_RANK))
        names = [n for n, _, _ in items]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ProtectError(f"the names {dup} are both protected and in the state dict")
        if not items:
            raise ProtectError("nothing to checkpoint: protect() an array or pass a non-empty state dict")
        return items, replicated

    def _replicated_differ(self, replicated, step):
        """Collective (failure path): name a replicated value that differs, raise everywhere."""
        def pick(everyone):
            for r, theirs in enumerate(everyone):
                keys = sorted(k.removeprefix("state.")          # the user's key, as for an array
                              for k in set(theirs) | set(replicated) if theirs.get(k) != replicated.get(k))
                if keys:
                    return (f"checkpoint {step}: the value(s) {keys[:8]} are declared REPLICATED but rank {r} "
                            "holds other values than rank 0 (or lacks them); replicated values must be the same "
                            "on every rank")
            return None
        raise mark_collective(ProtectError(explain(self._comm, replicated, pick)))

    def _discard(self, step, ckpt_id):
        """Local: remove this rank's part of a step that failed to commit (best effort) — never a
        committed manifest of another attempt, run or job that the failed write did not replace."""
        found = self.cache.examine(step)
        if found is not None and (found.manifest is None or found.manifest.ckpt_id != ckpt_id):
            return
        try:
            self.cache.retire(step)
        except OSError as e:
            log.warning("rank %d: could not clean up failed step %d: %s", self.comm.rank, step, e)

    def _check_checkpoint_args(self, step, level, state):
        """Local: raise on a bad call; return the step as a Python int."""
        step = _check_step(step)
        if level not in LEVELS:
            raise HpcCkptError(f"unknown level {level!r}; levels are {', '.join(LEVELS)}")
        if state is not None and not isinstance(state, dict):
            raise ProtectError(f"state must be a dict, got {type(state).__name__}")
        if not self._arrays and not state:
            raise ProtectError("nothing to checkpoint: protect() an array or pass a non-empty state dict")
        if self._last_step is not None and step <= self._last_step:
            raise HpcCkptError(f"step {step} is not newer than the last checkpoint or restart step "
                               f"{self._last_step}; steps must increase")
        return step

    def _threads_ok(self):
        """Local: True when background work may run in a thread (the same on every rank); rank 0
        warns once when it may not."""
        if not self._threads and self.comm.rank == 0 and "threads" not in self._warned:
            self._warned.add("threads")
            log.warning("background work (async_flush, background) needs MPI_THREAD_MULTIPLE on every rank; "
                        "working synchronously")
        return self._threads

    def _report_lost_flush(self, flush_error):
        if flush_error is not None and self.comm.rank == 0:
            log.error("%s", flush_error)

    def _retire(self, keep_upto):
        """Local: keep this run's newest ``keep`` committed steps up to ``keep_upto``, and the newest
        of each redundancy level (partner, xor, rs: local steps taken since must not push out the
        step a node loss needs); remove the rest of this run's (older ones, and newer ones of an
        abandoned attempt) and uncommitted leftovers. Other runs' and other jobs' checkpoints
        stay, unless start = "fresh"."""
        if self._flush is not None and self._flush.redundant:
            return       # the previous redundant step stays until the new one is complete
        clear = self._clear_others and self._committed
        ours, remove, bases, newest_of = [], [], {}, {}
        for step in self.cache.steps_on_disk():
            found = self.cache.examine(step)
            if found is None:
                remove.append(step)                       # data without a manifest: not a checkpoint
            elif found.state == "ok" and found.manifest.epoch == self._epoch:
                ours.append(step)
                if found.manifest.base is not None:
                    bases[step] = found.manifest.base[0]
                if step <= keep_upto and found.manifest.level in REDUNDANT:
                    newest_of[found.manifest.level] = step     # ascending: the newest one wins
            elif clear:
                remove.append(step)
        kept = [s for s in ours if s <= keep_upto][-self.config.keep:] + list(newest_of.values())
        # an incremental step's base stays while the step is kept (beyond keep), and so does the
        # base of a level's next incremental step
        kept += [bases[s] for s in kept if s in bases]
        kept += [b for lv in self._levels.values() for b in lv.pinned_steps()]
        if self._flush is not None:
            kept.append(self._flush.step)                 # its files are being read by the background work
        remove += [s for s in ours if s not in kept]
        for step in sorted(set(remove) - set(kept)):
            try:
                self.cache.retire(step)
            except OSError as e:
                log.warning("rank %d: could not remove old checkpoint step %d: %s", self.comm.rank, step, e)

    # ------------------------------------------------------------------ lineage
    def _scan_epochs(self, others=()):
        """Collective: the newest epoch any checkpoint of this job has (0: none), cache and pfs
        (and ``others``: Found records of other ranks' manifests that relocate saw)."""
        with Collective(self._comm, "looking for earlier checkpoints") as c:
            epochs = [f.manifest.epoch for f in [*self.cache.scan(), *others] if f.manifest is not None]
            if self.comm.rank == 0:
                epochs += [e for e, _ in self._pfs_listing().values()]
            c.words = [max(epochs, default=0)]
        return c.result[0]

    def _new_epoch(self):
        """Collective: the epoch of a run that did not restore a checkpoint (one past the newest)."""
        newest = self._scan_epochs()
        if newest and self.comm.rank == 0:
            log.warning("checkpoints of an earlier run of job %r are in %s%s: this run starts afresh and does "
                        "not remove them (restart() will only consider this run's checkpoints); "
                        "start = 'fresh' removes them", self.config.name, self.cache.root,
                        f" or {self.config.pfs_dir}" if self._pfs is not None else "")
        return newest + 1

    # ------------------------------------------------------------------ restore
    @events.recorded("restart")
    def restart(self, state=None):
        """Collective: fill the protected arrays and the ``state`` dict from the newest checkpoint
        every rank can restore; return its step, or None (nothing is then touched).

        ``state`` must hold the same keys as the checkpointed dict: arrays of the same shape and
        dtype are filled in place, other entries are replaced (docs/PORTING.md)."""
        step = self._restart(state)
        self._preload_kernel()
        return step

    def _preload_kernel(self):
        """Local: when a protected array will need the copy-and-checksum kernel, load Numba and
        the kernel in a background thread (xxh3.preload) while the application computes towards
        its first checkpoint (after restart(), so as not to slow the restart down)."""
        if self.config.write_method == "mmap" and any(p.array.nbytes >= xxh3.FUSED_MIN_BYTES
                                                       for p in self._arrays.values()):
            xxh3.preload()

    def _restart(self, state):
        """Collective: restart() without the kernel's preload."""
        self._check_open()
        self._finish_flush(raise_error=True)
        other_layout = self._relocate()
        if self.config.start == "fresh":
            self._epoch = self._scan_epochs(other_layout) + 1
            self._clear_others = True
            if self.comm.rank == 0:
                log.info("start = 'fresh': not restarting; earlier checkpoints of %r are removed after this "
                         "run's first checkpoint", self.config.name)
            self.policy.start()
            return None
        with Collective(self._comm, "restart: scanning checkpoints") as c:
            if not self._arrays and state is None:
                raise HpcCkptError("nothing to restore: protect() arrays or pass a state dict to restart()")
            if state is not None and not isinstance(state, dict):
                raise MismatchError(f"restart: state must be a dict, got {type(state).__name__}")
            both = st.overlapping(state, self._arrays) if state is not None else []
            if both:
                raise ProtectError(f"restart: the names {both[:8]} are both protected and in the state dict")
            found = self.cache.scan()
            ok = {f.step: f for f in found if f.state == "ok"}
            incompatible = [f for f in found if f.state == "incompatible"] + other_layout
            damaged = [f for f in found if f.state == "damaged"]
            skipped = []
            pfs = self._pfs_listing(skipped) if self.comm.rank == 0 else {}     # {step: (epoch, ckpt_id)}
            for pfs_step, reason in skipped[-4:]:
                log.warning("pfs step %d cannot be used: %s", pfs_step, reason)
            keys = [f.key for f in ok.values()] + [mf.order_key(e, s) for s, (e, _) in pfs.items()]
            # this job's steps written on another rank count or placement (a relaunch on fewer
            # nodes) give way to an older step this layout restores; another job's or a newer
            # format's stop the restart when they are the newest
            other_layout = [f for f in incompatible if f.manifest is not None and f.manifest.name == self.config.name]
            foreign = [f for f in incompatible if f not in other_layout]
            epochs = [mf.split_key(k)[0] for k in keys] + [f.manifest.epoch for f in incompatible if f.manifest]
            inc_key = max((f.key or 0 for f in foreign), default=0)
            layout_key = max((f.key for f in other_layout), default=0)
            unknown = max((f.step + 1 for f in foreign if f.key is None), default=0)   # a newer format
            c.words = [max(epochs, default=0), inc_key, 1 if foreign else 0, 1 if damaged else 0, unknown, layout_key]
        newest_epoch, inc_key, any_incompatible, any_damaged, unknown, layout_key = c.result
        if unknown:     # of an unknown epoch: taken as this job's newest, so that it stops the restart
            inc_key = max(inc_key, mf.order_key(max(newest_epoch, 1), unknown - 1))
        if any_damaged:
            self._warn_first(damaged[0].reason if damaged else None, "a rank manifest cannot be read")
        candidates = sorted((k for k in keys if mf.split_key(k)[0] == newest_epoch), reverse=True)
        first = True
        while True:
            # the next candidate: the newest key any rank (or the pfs listing) has, one reduction
            with Collective(self._comm, "restart: choosing a checkpoint") as c:
                c.words = [candidates[0] if candidates else 0]
            key = c.result[0]
            if first and any_incompatible and (inc_key > key or key == 0):
                self._raise_incompatible(incompatible, inc_key)
            first = False
            if key == 0:
                break
            candidates = [k for k in candidates if k < key]
            step = mf.split_key(key)[1]
            try:
                restored = self._try_cache(step, key, ok.get(step), state)
            except LayoutChangedError:      # agreed: the pfs level can place the blocks declared now
                if not self._try_pfs(step, key, pfs, state):
                    raise
                restored = True
            if not restored:
                restored = self._try_pfs(step, key, pfs, state)
            if restored:
                self._epoch, self._last_step = newest_epoch, step
                if layout_key > key:
                    self._report_other_layout(other_layout, layout_key, step)
                    self.cache.abandoned_after = step
                self._retire(keep_upto=step)
                self.policy.start()
                return step
        if layout_key:      # nothing this layout can restore: not a silent start from nothing
            self._raise_incompatible(other_layout, layout_key)
        self._epoch = newest_epoch + 1
        if self.comm.rank == 0:
            if newest_epoch:
                log.warning("no checkpoint can be restored; the arrays and state are left as they are")
            else:
                log.info("no checkpoint to restart from (nothing committed in %s%s)", self.cache.root,
                         f" or {self._pfs.root}" if self._pfs is not None else "")
        self.policy.start()
        return None

    def _relocate(self):
        """Collective: move node-cache files that a relaunch left on other hosts than their ranks'
        (relocate.py), before anything looks at the caches: also with start = "fresh", whose
        newest-epoch scan and removal of earlier runs' checkpoints see each rank's own files only.
        A failed move is agreed and warned about; each host keeps what it holds. Returns the
        manifests of another layout it saw (relocate)."""
        try:
            return relocate(self._comm, self.config, self.topology, self.cache.root)
        except HpcCkptError as e:
            if is_different_calls(e):
                raise
            if self.comm.rank == 0:
                log.warning("restart: moving node-cache files to the hosts of their ranks failed (%s); restarting "
                            "from what each host holds", e)
            return []

    def _report_other_layout(self, other_layout, layout_key, step):
        """Collective: warn that the newest steps in the node caches are of another rank count or
        placement, and that the restart took ``step``, an older one this job can restore."""
        text = self._first_text(next((f.reason for f in other_layout if f.key == layout_key), None))
        if self.comm.rank == 0:
            log.warning("the newest checkpoint in the node caches is of another rank count or placement (%s); "
                        "restarted from step %d, the newest this job can restore. Their files stay, except a step "
                        "of the same number as one this run checkpoints, which is replaced", text, step)

    def _raise_incompatible(self, incompatible, inc_key):
        """Collective: raise IncompatibleCheckpointError with the reason of a rank that has it."""
        mine = next((f.reason for f in incompatible if (f.key or 0) == inc_key), None)
        mine = mine or next((f.reason for f in incompatible if f.key is None), None)
        text = self._first_text(mine)
        raise mark_collective(IncompatibleCheckpointError(text))

    def _first_text(self, text):
        """Collective (failure paths): the text of the lowest rank that has one (None if none)."""
        return explain(self._comm, text, lambda texts: next((t for t in texts if t is not None), None))

    def _warn_first(self, text, what):
        text = self._first_text(text)
        if self.comm.rank == 0:
            log.warning("%s: %s", what, text)

    def _try_cache(self, step, key, found, state):
        """Collective: restore ``step`` (epoch key ``key``) from the node caches; False when some
        rank cannot, even after a rebuild (nothing touched then)."""
        have = found is not None and found.key == key
        with Collective(self._comm, f"restart: step {step}") as c:
            c.words = [U64_MAX - self.comm.rank if have else 0]
        if not c.result[0]:
            return False
        root = U64_MAX - c.result[0]
        ckpt_id, level = self._comm.bcast((found.manifest.ckpt_id, found.manifest.level) if self.comm.rank == root
                                          else None, root=root)
        manifest = found.manifest if have and found.manifest.ckpt_id == ckpt_id else None
        return self._restore_step(step, ckpt_id, level, manifest, state)

    def _restore_step(self, step, ckpt_id, level, manifest, state):
        """Collective: verify ``step`` on every rank, rebuild lost ranks from redundancy when the
        level has it, then fill. False (nothing touched) when it cannot be restored."""
        # 1. every rank re-hashes its own data and plans its restore (MismatchError: agreed, raised)
        with Collective(self._comm, f"restart from step {step}") as c:
            reason, manifest, plan = self._verify_local(step, manifest, ckpt_id, state)
            c.words = [1 if reason else 0]
        data_ok = None
        if c.result[0]:
            if not SPECS[level].redundant:
                self._warn_fallback(step, reason)
                return False
            # 2. rebuild what is lost from partner copies or parity
            data_ok = self._comm.allgather(reason is None)       # failure path only
            try:
                with Collective(self._comm, f"rebuilding step {step} from the {level} level") as c:
                    with signals_deferred():
                        c.words = [0 if self._level(level).recover(step, ckpt_id, data_ok) else 1]
            except HpcCkptError as e:
                if self.comm.rank == 0:
                    log.warning("step %d: the %s rebuild failed (%s); falling back", step, level, e)
                    self._events.fallback(step, level, f"the {level} rebuild failed: {e}")
                return False
            if c.result[0]:
                self._warn_fallback(step, reason, f"the {level} level cannot rebuild it")
                return False
            with Collective(self._comm, f"restart from step {step} after the rebuild") as c:
                if not data_ok[self.comm.rank]:
                    reason, manifest, plan = self._verify_local(step, None, ckpt_id, state)
                c.words = [1 if reason else 0]
            if c.result[0]:
                self._warn_fallback(step, reason, "the rebuilt data does not verify")
                return False
            if self.comm.rank == 0:
                log.warning("step %d: rebuilt rank(s) %s from the %s level", step,
                            [r for r, ok in enumerate(data_ok) if not ok][:16], level)
        # 3. fill the protected arrays in place, then the state dict
        self._events.restored(step, level, data_ok)
        with Collective(self._comm, f"restoring step {step}"):
            self.cache.read_into(manifest, [(n, p.array) for n, p in self._arrays.items()] + plan.reads)
            plan.apply()
        return True

    def _verify_local(self, step, manifest, ckpt_id, state):
        """Local: (None, manifest, plan) when this rank's part of ``step`` verifies, else (reason,
        manifest, None). Raises MismatchError when the arrays or state differ from the checkpoint."""
        if manifest is None:
            manifest = self.cache.read_manifest(step, quiet=True)
            if manifest is None:
                found = self.cache.examine(step)      # failure path: say why, when the manifest is there
                return (found.reason if found is not None and found.state != "ok" and found.reason else
                        f"no readable manifest ({self.cache.manifest_path(step)})"), None, None
        if manifest.ckpt_id != ckpt_id:
            return f"its manifest belongs to another attempt (checkpoint {manifest.ckpt_id})", manifest, None
        self._check_protected(manifest)
        self._check_blocks(manifest)
        try:
            self.cache.verify(manifest)
            doc = self._read_document(manifest)
        except HpcCkptError as e:
            return str(e), manifest, None
        return None, manifest, self._plan(manifest, doc, state)

    def _read_document(self, manifest):
        entry = manifest.array(st.STATE_ENTRY)
        if entry is None:
            return None
        buf = np.empty(entry.shape, np.dtype(entry.dtype))
        self.cache.read_into(manifest, [(st.STATE_ENTRY, buf)])
        return st.parse_document(buf.tobytes(), self.cache.data_path(manifest.step))

    def _plan(self, manifest, doc, state):
        """Local: the restore plan of the state dict (MismatchError when it does not fit)."""
        where = f"step {manifest.step}"
        if doc is None:
            if state:
                raise MismatchError(f"{where}: the checkpoint holds no state dict, but restart() was given one "
                                    f"with {sorted(state)[:8]}")
            return st.Plan([], [])
        if state is None:
            raise MismatchError(f"{where}: the checkpoint holds a state dict with {sorted(doc['items'])[:8]}: "
                                "pass restart(state=...)")
        shapes = {a.name: (a.shape, a.dtype) for a in manifest.arrays}
        refs = {n for enc in doc["items"].values() for n in st.array_refs(enc)}
        if not refs <= set(shapes):
            raise CorruptCheckpointError(f"{where}: the state document refers to arrays that are not in it")
        orphans = sorted(set(shapes) - refs - set(self._arrays) - {st.STATE_ENTRY})
        if orphans:
            raise MismatchError(f"{where}: the checkpoint has {orphans[:8]} which are not protected")
        return st.plan_restore(state, doc["items"], shapes, where)

    def _check_protected(self, manifest):
        """Raise MismatchError unless the protected arrays match ``manifest`` (local). Arrays of
        the checkpoint that are not protected must belong to its state dict (checked in _plan)."""
        theirs = {a.name for a in manifest.arrays}
        has_state = st.STATE_ENTRY in theirs
        missing = sorted(theirs - set(self._arrays)) if not has_state else []
        extra = sorted(set(self._arrays) - theirs)
        if missing or extra:
            raise st.key_mismatch(f"step {manifest.step}", missing and f"the checkpoint has {missing} which are not "
                                  "protected", extra and f"protected {extra} are not in the checkpoint")
        for a in manifest.arrays:
            if a.name not in self._arrays:
                continue
            arr = self._arrays[a.name].array
            if tuple(arr.shape) != a.shape or arr.dtype.str != a.dtype:
                raise MismatchError(f"step {manifest.step}, array {a.name!r}: the checkpoint holds "
                                    f"shape {a.shape} {a.dtype}, the protected array is {tuple(arr.shape)} "
                                    f"{arr.dtype.str}")

    def _check_blocks(self, manifest):
        """Local: raise LayoutChangedError when an array this rank declares as a Block now (its
        global shape or offset) is another block than ``manifest`` holds: the node cache can only
        give each rank back the block it wrote."""
        for a in manifest.arrays:
            protected = self._arrays.get(a.name)
            declared = self._layouts.get(a.name, protected.layout if protected is not None else None)
            if declared is None or declared.kind != "block" or a.layout != "block":
                continue
            if (declared.global_shape, declared.offset) != (a.global_shape, a.global_offset):
                raise LayoutChangedError(
                    f"step {manifest.step}, array {a.name!r}: rank {self.comm.rank} declares the block at offset "
                    f"{declared.offset} of global shape {declared.global_shape}, the node cache holds its block at "
                    f"offset {a.global_offset} of {a.global_shape}; only the pfs level restores another "
                    "decomposition, and it has no copy of this step (declare the blocks of the checkpoint, or "
                    "restart from a step checkpointed at level 'pfs')")

    def _warn_fallback(self, step, reason, why=None):
        """Collective (failure path): rank 0 logs why step ``step`` cannot be restored."""
        def pick(reasons):
            bad = [(r, v) for r, v in enumerate(reasons) if v]
            more = f" (and {len(bad) - 4} more ranks)" if len(bad) > 4 else ""
            return "; ".join(f"rank {r}: {v}" for r, v in bad[:4]) + more + (f"; {why}" if why else "")
        text = explain(self._comm, reason, pick)
        if self.comm.rank == 0:
            self._events.fallback(step, "cache", text)
            log.warning("step %d cannot be restored from the node caches (%s); falling back to its pfs copy, if "
                        "there is one, else to an older checkpoint", step, text)

    def _try_pfs(self, step, key, listing, state):
        """Collective: restore ``step`` from the pfs level if it has this epoch's step."""
        with Collective(self._comm, f"restart: pfs step {step}") as c:
            c.words = [1 if self.comm.rank == 0 and step in listing
                       and mf.order_key(listing[step][0], step) == key else 0]
        if not c.result[0]:
            return False
        try:
            self._pfs_store().restore(step, [(n, p.array, self._layouts.get(n, p.layout))
                                             for n, p in self._arrays.items()], state, self._layouts)
        except CorruptCheckpointError as e:
            if self.comm.rank == 0:
                log.warning("pfs step %d cannot be restored (%s); falling back to an older checkpoint", step, e)
                self._events.fallback(step, "pfs", str(e))
            return False
        if self.comm.rank == 0:
            log.info("restored step %d from pfs", step)
        self._events.restored(step, "pfs", from_pfs=True)
        return True

    def _redundancy_comm(self):
        """Collective (first call): the communicator of the redundancy levels: with ``background``
        a duplicate of its own, so that the background thread never shares one with the caller."""
        if not self.config.background:
            return self._comm
        if self._bg_comm is None:
            self._bg_comm = self._comm.Dup()
        return self._bg_comm

    def _level(self, level):
        """The redundancy object of a redundant level (created on first use, collectively)."""
        if level not in self._levels:
            self._levels[level] = SPECS[level].make(self.cache, self._redundancy_comm(), self.topology, self.config)
        return self._levels[level]

    # ------------------------------------------------------------------ background work
    @events.recorded("wait")
    def wait(self):
        """Collective: return once pending background work is durable; raise its errors on all ranks."""
        self._check_open()
        self._wait("wait()")

    def _wait(self, what):
        """Collective: wait(), also for close(): an agreement even with nothing to wait for, so
        that ranks making different calls find out (comm.agree)."""
        if self._flush is None:
            agree(self._comm, None, what)
        self._finish_flush(raise_error=True)

    def _finish_flush(self, raise_error):
        """Collective: join the background flush; agree on its outcome. Its error (agreed, the
        same on every rank) is raised, or returned when ``raise_error`` is False."""
        if self._flush is None:
            return None
        flush, self._flush = self._flush, None
        error = flush.join()
        micros = int((flush.seconds or 0.0) * 1e6)
        try:      # the slowest rank's background time, in the same reduction
            micros, = agree(self._comm, error, f"background {flush.what} of step {flush.step}", [micros])
        except HpcCkptError as e:
            if raise_error:
                raise
            return e
        if self.comm.rank == 0:
            self.policy.record_background(flush.level, micros / 1e6)
            log.info("the %s of step %d took %.3f s in the background", flush.what, flush.step, micros / 1e6)
            self._events.background(flush.step, flush.level, flush.what, micros / 1e6)
        if self._last_step is not None:
            self._retire(keep_upto=self._last_step)
        return None

    def _join_flush_unwinding(self):
        """Local, while an exception unwinds: let a running flush end (its thread talks only to
        the other ranks' flush threads), and say how it ended."""
        if self._flush is None:
            return
        flush, self._flush = self._flush, None
        error = flush.join()
        if error is not None:
            log.warning("rank %d: the background %s of step %d failed while an exception was unwinding: %s",
                        self.comm.rank, flush.what, flush.step, error)
        elif self.comm.rank == 0:
            log.warning("the background %s of step %d completed while an exception was unwinding",
                        flush.what, flush.step)

    # ------------------------------------------------------------------ the pfs level
    def _pfs_store(self):
        """Collective: the PfsStore (created, and its directory locked, on first use)."""
        if self._pfs is None:
            store = PfsStore(self.config, self._comm, self.topology)
            with Collective(self._comm, f"locking {store.root}"):
                if self.comm.rank == 0:
                    self._lock_pfs(store.root)
            store.relock = self._lock_pfs
            self._pfs = store        # only once locked: a failed lock is tried again at the next use
        return self._pfs

    def _lock_pfs(self, root):
        """Local (rank 0): lock the pfs job directory ``root`` (again, when it was removed and
        created again: the lock of the removed directory is dropped)."""
        path = os.path.join(root, ".lock")
        for old in [lk for lk in self._locks if lk.path == path]:
            old.release()
            self._locks.remove(old)
        self._locks.append(DirLock(path, f"job name {self.config.name!r} in {root}", self.config.file_mode))

    def _pfs_listing(self, skipped=None):
        """Local (rank 0): {step: (epoch, ckpt_id)} of this job's committed pfs steps ({} when
        pfs_dir has none); reads the directory without creating anything. ``skipped``: a list
        that receives (step, reason) for each committed step whose index cannot be used."""
        return pfs_listing(os.path.join(self.config.pfs_dir, self.config.name), self.config.name,
                           max_index_bytes(self.comm.size), skipped)

    def _flush_to_pfs(self, manifest, pending=None):
        """Collective: write the committed cache step of ``manifest`` to the pfs level (finish
        ``pending``, the pfs step begun by the cache write, if given), then keep this run's
        newest ``keep``."""
        store = self._pfs_store()
        if pending is None:
            items = items_from_manifest(manifest, self.cache.mapped_arrays(manifest))
            store.save(manifest.step, manifest.ckpt_id, items, epoch=manifest.epoch,
                       state_keys=self._state_keys(manifest))
        else:        # the cache file is mapped only if the cache write left bytes to write
            mapped = self.cache.mapped_arrays(manifest) if pending.incomplete() else None
            items = items_from_manifest(manifest, mapped)
            store.finish(pending, items)
        del items
        store.retire(self.config.keep, manifest.epoch, keep_upto=manifest.step,
                     clear_others=self._clear_others and self._committed)

    def _state_keys_of(self, state):
        """Local: {state key: layout kind} of a state dict ({} without one), as _state_keys."""
        return {} if state is None else {k: self._layouts.get(k, st.PER_RANK).kind for k in state}

    def _state_keys(self, manifest):
        """Local: {state key: layout kind} of a committed step's state dict ({} without one)."""
        doc = self._read_document(manifest)
        if doc is None:
            return {}
        layouts = doc.get("layouts", {})
        return {k: layouts.get(k, {}).get("kind", "rank") for k in doc["items"]}

    def _clear_earlier_pfs(self):
        """Collective, once (start = "fresh", after this run's first commit): rank 0 removes the
        pfs checkpoints of earlier runs; the cache's go at the next retire, on every rank."""
        with Collective(self._comm, "removing the pfs checkpoints of earlier runs"):
            if self.comm.rank == 0:
                root = os.path.join(self.config.pfs_dir, self.config.name)
                for step in pfs_committed(root) if os.path.isdir(root) else []:
                    listed = self._pfs_listing().get(step)
                    if listed is None or listed[0] != self._epoch:
                        remove_step_dir(os.path.join(root, mf.step_dir_name(step)))

    def _start_background(self, manifest, redundancy, flush):
        """Collective: the rest of a committed step in a background thread: its redundancy
        (``redundancy``), then its level's marker (the manifest committed at its level), and its
        pfs flush (``flush``). The thread reads the node-local files, never the live arrays, and
        talks MPI only on the library's background communicators (the redundancy levels' own
        duplicate, the PfsStore's)."""
        step, level = manifest.step, manifest.level
        coder = self._level(level) if redundancy else None    # collective: created here, not in the thread
        if flush:
            self._pfs_store()

        def work():
            if redundancy:
                with Collective(self._bg_comm, f"encoding checkpoint {step} ({level}) in the background"):
                    hook = Deferred()      # test hook: kill/ENOSPC; the exchange still runs on every rank
                    hook.run(faults.hit, "background", self.comm.rank, step)
                    committed = self._encode(coder, manifest, hook.error)
                with Collective(self._bg_comm, f"committing the {level} level of checkpoint {step}"):
                    self.cache.commit(committed)
            if flush:
                self._flush_to_pfs(manifest)
        self._flush = _Background(step, level, work, redundancy)

    def scavenge(self):
        """Collective: copy the newest restorable cache checkpoint to pfs unless pfs has it already.

        For the end of a job (``hpcckpt scavenge``); needs no protected arrays. Returns the step
        copied, or None when there was nothing newer than pfs to copy.
        """
        self._check_open()
        error = self._finish_flush(raise_error=False)
        if error is not None and self.comm.rank == 0:
            log.warning("%s; scavenge copies the newest cache checkpoint instead", error)
        with Collective(self._comm, "scavenge: scanning checkpoints") as c:
            found = self.cache.scan()
            ok = {f.step: f for f in found if f.state == "ok"}
            c.words = [max((f.key for f in ok.values()), default=0)]
        key = c.result[0]
        if not key:      # an empty cache is nothing to copy; checkpoints it cannot use are an error
            with Collective(self._comm, "scavenge: nothing restorable") as c:
                why = self.cache.why_unusable(found)
                if why:
                    raise IncompatibleCheckpointError(
                        f"scavenge: nothing to copy for job {self.config.name!r} on {self.comm.size} ranks, but {why}: "
                        "run it with the application's name, number of ranks, placement and configuration")
            return None
        self._pfs_store()             # collective: created (and locked) on every rank
        with Collective(self._comm, "scavenge: listing pfs") as c:
            on_pfs = self._pfs_listing() if self.comm.rank == 0 else {}
            step = mf.split_key(key)[1]
            c.words = [1 if step in on_pfs and mf.order_key(on_pfs[step][0], step) >= key else 0]
        if c.result[0]:
            return None
        found = ok.get(step)
        with Collective(self._comm, f"scavenge: verifying step {step}") as c:
            manifest = found.manifest if found is not None and found.key == key else None
            bad = manifest is None
            if manifest is not None:
                try:
                    self.cache.verify(manifest)
                except HpcCkptError:
                    bad = True
            h = _digest_int(manifest.ckpt_id) if not bad else 0
            c.words = [1 if bad else 0, h, U64_MAX - h]
        if c.result[0] or c.result[1] != U64_MAX - c.result[2]:
            if self.comm.rank == 0:
                log.warning("scavenge: step %d cannot be verified on every rank; nothing copied", step)
            return None
        self._epoch = mf.split_key(key)[0]
        self._flush_to_pfs(manifest)
        return step


# ---------------------------------------------------------------------- helpers (local)
def _check_layout(name, array, layout, rank):
    if layout.kind == "block":
        mf.check_global_layout(array.shape, layout.global_shape, layout.offset,
                               lambda msg: ProtectError(f"array {name!r}: {msg}"))
    elif layout.kind == "rows" and array.ndim == 0:
        raise ProtectError(f"array {name!r}: a ROWS layout needs an array of at least one dimension")
    elif layout.kind == "root" and rank != 0:
        raise ProtectError(f"{name!r} is declared ROOT (rank 0 only) but rank {rank} holds it")


def _replicated_digests(manifest, replicated_items, items):
    """{name: text} for this rank's replicated values: arrays by shape, dtype and checksum (of
    their values' bytes: st.value_bytes, where padding makes it differ from the file's), state
    values by their encoding. ``items``: _items' [(name, array, Layout)]."""
    out = {a.name: f"{a.dtype}{list(a.shape)}:{a.checksum}" for a in manifest.arrays if a.layout == "replicated"}
    for name, array, layout in items:
        if layout.kind == "replicated" and name in out and st.has_padding(array.dtype):
            out[name] = f"{array.dtype.str}{list(array.shape)}:{digest(st.value_bytes(array))}"
    out.update({f"state.{k}": json.dumps(v, sort_keys=True) for k, v in replicated_items.items()})
    return out


def _digest_int(values):
    return int(digest(json.dumps(values, sort_keys=True).encode()), 16)


def _settings_digest(cfg):
    """An int digest of every setting that must be the same on all ranks (all but LOCAL_KEYS)."""
    values = {k: v for k, v in cfg.as_dict().items() if k not in LOCAL_KEYS}
    return _digest_int(json.loads(json.dumps(values, sort_keys=True, default=str)))


def revoke(comm):
    """Local: revoke ``comm`` (ULFM) so that every pending and future call on it fails everywhere;
    nothing where the MPI cannot (no ULFM) or the communicator is already unusable."""
    try:
        comm.Revoke()
    except Exception:  # noqa: BLE001 - NotImplementedError (no ULFM), MPI.Exception (already broken)
        pass


def _check_step(step):
    """Local: ``step`` as a Python int; HpcCkptError unless it is an integer from 0 to MAX_STEP."""
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or not 0 <= step <= mf.MAX_STEP:
        raise HpcCkptError(f"step must be an integer from 0 to {mf.MAX_STEP}, got {step!r}")
    return int(step)


def _thread_multiple():
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def _should_abort(exc):
    """An exception on one rank that the others cannot know about: anything but an error
    hpcckpt raised on every rank, and sys.exit(0)."""
    if is_collective(exc):
        return False
    if isinstance(exc, SystemExit):
        return exc.code not in (None, 0)
    return True


def _exit_code(exc):
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
            flush = None if ck._closed else ck._flush
            if flush is not None:
                flush.thread.join()
    keyval = MPI.Comm.Create_keyval(delete_fn=joined)
    MPI.COMM_SELF.Set_attr(keyval, True)
    _FINALIZE_KEYVAL.append(keyval)


def _install_excepthook():
    """Once per process: an uncaught exception on one rank prints its traceback and aborts the
    MPI job (as ``python -m mpi4py`` does), so the other ranks do not wait forever."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if (not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.size == 1
                or not _should_abort(exc)):
            previous(exc_type, exc, tb)
            return
        print_abort_notice(exc, MPI.COMM_WORLD.rank)
        MPI.COMM_WORLD.Abort(_exit_code(exc))
    sys.excepthook = hook


def _setup_logging(cfg, rank):
    log.setLevel(cfg.log_level.upper())
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"hpcckpt[rank {rank}] %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
