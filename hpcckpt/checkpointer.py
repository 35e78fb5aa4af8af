"""``Checkpointer``: the public facade. It checks each call, keeps the state of one job's
checkpointing in a ``Context`` (context.py) and hands the work to the protocols: the save protocol
(save.py), the restore protocol (restore.py), the background work (background.py). The levels are
behind one interface (levels/base.py). Process-wide hooks (the excepthook that aborts the job,
MPI_Finalize joining background work) are in process_hooks.py.

Every per-call message on the success path is a fixed-size reduction on the library's own
communicator (duplicated from the application's); per-rank details travel only on failure.
"""
import logging
import os
import time

import numpy as np
from mpi4py import MPI

from . import background, events, manifest as mf, process_hooks as hooks, restore, save, slurm, state as st, watchdog
from .codecs import xxh3
from .comm import (U64_MAX, Collective, agree, explain, is_process_failure, mark_collective, print_abort_notice,
                   was_agreed)
from .config import LOCAL_KEYS, Config
from .context import Context
from .errors import CheckpointWriteError, ConfigError, HpcCkptError, ProtectError
from .levels import registry
from .levels.local import LocalCache
from .lock import DirLock
from .protected import Protected
from .save import CheckpointInfo
from .topology import Topology

__all__ = ["Checkpointer", "CheckpointInfo"]
log = logging.getLogger("hpcckpt")
revoke = hooks.revoke


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
        self._ctx = None
        # the same answer on every rank: raised on each, no hang
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL or comm.Is_inter():
            raise ConfigError(f"Checkpointer needs an intracommunicator (MPI.COMM_WORLD, or one made by Dup or "
                              f"Split), got {'MPI.COMM_NULL' if comm == MPI.COMM_NULL else repr(comm)}"
                              + (": an intercommunicator joins two groups that do not share one checkpoint"
                                 if isinstance(comm, MPI.Comm) and comm != MPI.COMM_NULL else ""))
        self._comm = comm.Dup()          # every message of the library goes on this one
        self._told_to_exit = False       # should_exit() has returned True once
        self._due = None                 # (step, level) need_checkpoint() decided
        locks = []
        try:
            with Collective(self._comm, "Checkpointer configuration") as c:
                self.config = Config.load(config, **overrides)
                self.policy = self._make_policy()
                h = hooks.settings_digest(self.config)
                c.words = [h, U64_MAX - h, 0 if hooks.thread_multiple() else 1]
            if c.result[0] != U64_MAX - c.result[1]:
                self._settings_differ()
            hooks.setup_logging(self.config, comm.rank)
            watchdog.configure(self.config.stall_timeout, self.config.stall_action, comm.rank)
            if _node_map is not None and self.config.ranks_per_node == "auto":
                self.topology = Topology.given(self._comm, _node_map)     # pinned (hpcckpt.online)
            else:
                self.topology = Topology.build(self._comm, self.config.ranks_per_node)
            self.cache = LocalCache(self.config, self.topology,
                                    spares=1 + sum(registry.level_class(lv).redundant for lv in self.policy.levels))
            with Collective(self._comm, "creating the cache directory"):
                try:
                    self.cache.prepare()
                except OSError as e:
                    raise CheckpointWriteError(f"cannot create the cache directory {e.filename or self.cache.root}: "
                                               f"{e.strerror}") from e
                locks.append(DirLock(os.path.join(self.cache.root, f".lock.rank_{comm.rank:06d}"),
                                     f"job name {self.config.name!r} in {self.cache.root}", self.config.file_mode))
            self._ctx = ctx = Context(comm, self._comm, self.config, self.topology, self.cache, self.policy,
                                      not c.result[2], None)
            ctx.locks = locks
            self._closed = False
            hooks.opened(self)
            if self.config.abort_on_error:
                hooks.install_excepthook()
            if comm.rank == 0:
                log.info("cache of rank 0: %s; pfs: %s", self.cache.root,
                         os.path.abspath(os.path.join(self.config.pfs_dir, self.config.name)))
            ctx.warn_placement(self.policy.levels)
            self._setup_slurm()
            if comm.rank == 0:
                log.info("%s", self.policy.summary())
            ctx.events = self._events = events.EventLog(self.config.events_file, comm.rank, comm.size,
                                                        self.config.name, self.config.file_mode, self.config.dir_mode)
            self._events.start(self)
        except BaseException as e:
            for lock in locks:          # a failed constructor never keeps the cache locked (online recovery reopens it)
                lock.release()
            if self._ctx is not None:
                self._ctx.release_locks()
            if is_process_failure(e):
                revoke(self._comm)      # ULFM: nobody stays blocked on our duplicate
            raise

    def _make_policy(self):
        from .policy import Policy
        cfg = self.config
        named = set(cfg.schedule or {}) | set(cfg.level_mtbf or {}) | {cfg.level}
        levels = tuple(lv for lv in registry.LEVELS if lv in named)
        # the checkpoint before the job's end is taken at the most resilient level that keeps
        # its own copy, whatever the schedule: node-local files do not outlive the job (the
        # job templates remove them; sites wipe $SLURM_TMPDIR)
        return Policy(kind=cfg.policy, mtbf=cfg.mtbf, level_mtbf=cfg.level_mtbf, schedule=cfg.schedule,
                      levels=levels, exit_safety=cfg.exit_safety,
                      end_time=None if cfg.end_time is None else cfg.end_time - cfg.end_margin,
                      final_level=registry.restoring()[-1])

    # what the event log reads (events.recorded)
    @property
    def _epoch(self):
        return self._ctx.epoch

    @property
    def _flush(self):
        return self._ctx.flush

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
        background.join_unwinding(self._ctx)
        self._ctx.release_locks()
        self._closed = True
        self._abort_if_alone(exc)
        return False

    def _abort_if_alone(self, exc):
        """Local: with ``abort_on_error``, an exception of this rank alone (not one every rank
        agreed on; not sys.exit(0)) aborts the job, so that no other rank waits for this one."""
        if self.config.abort_on_error and hooks.should_abort(exc) and self.comm.size > 1:
            print_abort_notice(exc, self.comm.rank)
            self.comm.Abort(hooks.exit_code(exc))

    @events.recorded("close")
    def close(self):
        """Collective: wait for pending work, then release. Calling it twice is harmless."""
        if not self._closed and MPI.Is_finalized():      # no MPI call is possible: release what is local
            self._closed = True
            self.cache.close()
            self._ctx.release_locks()
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
                ctx = self._ctx
                for level in ctx.levels.values():
                    level.close()
                if ctx.bg_comm is not None:
                    ctx.bg_comm.Free()
                self.cache.close()
                self.cache.remove_spares()
                ctx.release_locks()
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
        ctx = self._ctx
        for c in ctx.owned_comms() if revoke_comms else ():
            if c != MPI.COMM_NULL:
                revoke(c)
        if ctx.flush is not None:
            ctx.flush.thread.join(timeout)
            ctx.flush = None
        for level in ctx.levels.values():
            level.abandon()
        ctx.levels = {}
        self.cache.close()
        ctx.release_locks()
        self._closed = True

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
        if name in self._ctx.arrays:
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
        save.check_layout(name, array, layout, self.comm.rank)
        self._ctx.arrays[name] = Protected(array, layout)

    def unprotect(self, name):
        """Local: stop protecting ``name``."""
        self._check_open()
        if self._ctx.arrays.pop(name, None) is None:
            raise ProtectError(f"array {name!r} is not protected")

    def layout(self, name, layout):
        """Local: declare how the top-level name ``name`` of the state dict is spread over the
        ranks: hpcckpt.PER_RANK (default), ROWS, REPLICATED, ROOT or Block(global_shape, offset).
        Declare again to change it (a block's offset after a redistribution, for instance)."""
        self._check_open()
        if not isinstance(name, str) or not st.KEY_RE.match(name):
            raise ProtectError(f"layout: {name!r} is not a state key")
        self._ctx.layouts[name] = st.as_layout(layout)

    @property
    def protected(self):
        """Names of the protected arrays, in protection order."""
        return tuple(self._ctx.arrays)

    # ------------------------------------------------------------------ schedule
    def need_checkpoint(self, step):
        """Collective: the level due at ``step`` (decided on rank 0, the same on every rank), or None."""
        self._check_open()
        with Collective(self._comm, f"need_checkpoint({step!r})") as c:
            step = save.check_step(step)
            due = save.level_code(self.policy.decide(step)) if self.comm.rank == 0 else 0
            c.words = [due, 1 if slurm.stop_requested() else 0, step, U64_MAX - step]
        code, stop, hi, lo = c.result
        if hi != U64_MAX - lo:
            raise mark_collective(HpcCkptError(
                f"the ranks disagree on need_checkpoint(step): steps {U64_MAX - lo}..{hi}; every rank must make "
                "the same call"))
        level = registry.LEVELS[code - 1] if code else None
        ctx = self._ctx
        if stop and not ctx.stopping:
            ctx.stopping = True             # every rank sees this at the same step
            if self.comm.rank == 0:
                log.warning("stop requested (%s): taking a final %s checkpoint at step %s",
                            slurm.stop_reason() or "another rank", ctx.final_level, step)
        if ctx.stopping and not ctx.final_done:
            level = ctx.final_level
        self._due = (step, level)
        return level

    def should_exit(self):
        """Collective: True when the application should stop (a stop request's final checkpoint
        is taken, or the job's end time is near). The first time, rank 0 writes a line to the
        file CKPT_STOPPED_FILE names, if any (docs/SLURM.md)."""
        self._check_open()
        with Collective(self._comm, "should_exit()") as c:
            c.words = [1 if self.comm.rank == 0 and self.policy.should_exit() else 0]
        end_time, stop = bool(c.result[0]), self._ctx.stopping and self._ctx.final_done
        if (end_time or stop) and not self._told_to_exit:
            self._told_to_exit = True
            if self.comm.rank == 0:
                self._report_stopped("a stop request" if stop else "the job's end time")
        return end_time or stop

    def _report_stopped(self, why):
        """Local (rank 0): the line for CKPT_STOPPED_FILE; a failure to write it only warns."""
        ctx = self._ctx
        if ctx.final_done or self.policy.final_taken:
            text = f"stopped for {why}: final {ctx.final_level} checkpoint of step {ctx.last_step}"
        else:
            text = (f"stopped for {why} without a final checkpoint: "
                    + ("none was taken" if ctx.last_step is None else f"the newest is step {ctx.last_step}"))
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
        if isinstance(state, str) and level is None:     # checkpoint(step, level): the level, as before state dicts
            state, level = None, state
        if level is None:
            level = self._due[1] if self._due and self._due[0] == step and self._due[1] else self.config.level
        return save.checkpoint(self._ctx, step, state, level)

    @events.recorded("restart")
    def restart(self, state=None):
        """Collective: fill the protected arrays and the ``state`` dict from the newest checkpoint
        every rank can restore; return its step, or None (nothing is then touched).

        ``state`` must hold the same keys as the checkpointed dict: arrays of the same shape and
        dtype are filled in place, other entries are replaced (docs/PORTING.md)."""
        self._check_open()
        background.finish(self._ctx, raise_error=True, retire=save.retire)
        step = restore.restart(self._ctx, state, save.retire)
        self._preload_kernel()
        return step

    def _preload_kernel(self):
        """Local: when a protected array will need the copy-and-checksum kernel, load Numba and
        the kernel in a background thread (xxh3.preload) while the application computes towards
        its first checkpoint (after restart(), so as not to slow the restart down)."""
        if self.config.write_method == "mmap" and any(p.array.nbytes >= xxh3.FUSED_MIN_BYTES
                                                       for p in self._ctx.arrays.values()):
            xxh3.preload()

    @events.recorded("wait")
    def wait(self):
        """Collective: return once pending background work is durable; raise its errors on all ranks."""
        self._check_open()
        self._wait("wait()")

    def _wait(self, what):
        """Collective: wait(), also for close(): an agreement even with nothing to wait for, so
        that ranks making different calls find out (comm.agree)."""
        if self._ctx.flush is None:
            agree(self._comm, None, what)
        background.finish(self._ctx, raise_error=True, retire=save.retire)

    def scavenge(self):
        """Collective: copy the newest restorable cache checkpoint to the most resilient level that
        keeps its own copy (pfs) unless it has it already.

        For the end of a job (``hpcckpt scavenge``); needs no protected arrays. Returns the step
        copied, or None when there was nothing newer to copy.
        """
        self._check_open()
        return save.scavenge(self._ctx)
