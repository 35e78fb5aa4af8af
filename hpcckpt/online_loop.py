"""The runtime of an online job (hpcckpt.online.run): each process's loop as a worker (the
Checkpointer, restart, the application's steps) or as a spare (waiting), the setup (worker
communicator, pinned node map) and the recovery after a process failure: revoke, shrink, learn
who is left (online_decision.decide), split the new worker communicator, agree. Collective over
the world (spares included) unless a method says otherwise.
"""
import logging
import time

import numpy as np

from . import errors, faults
from .errors import CollectiveError, HpcCkptError, OnlineRecoveryError
from .online import Outcome, Recovery
from .online_decision import decide
from .online_exit import FINALIZE_TIMEOUT, ExitAtDeadline, bound_finalize

log = logging.getLogger("hpcckpt")

TAG_DONE = 0x0D0E          # worker 0 -> each spare: the job is over
POLL = 0.01                # seconds between two tests of a pending request
MESSAGE_BYTES = 1024       # the broadcast text of an exception that ends an online job


class OnlineLoop:
    """One process of an online job, a worker or a spare; ``run()`` (collective over the world)
    returns its Outcome."""

    def __init__(self, comm, init, step, nsteps, spares, config, overrides, timeout, on_recovery):
        from mpi4py import MPI
        self.MPI = MPI
        self.init, self.step, self.nsteps = init, step, nsteps
        self.config, self.overrides, self.timeout, self.on_recovery = config, dict(overrides), timeout, on_recovery
        if not log.handlers:                    # spares never open a Checkpointer: they log too
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(f"hpcckpt[world rank {comm.rank}] %(levelname)s: %(message)s"))
            log.addHandler(handler)
            log.propagate = False
        bound_finalize(min(timeout, FINALIZE_TIMEOUT))    # any process may see a failure, or a peer of it
        self.world = comm.Dup()                 # the library's own: all live processes, spares included
        self.world.Set_errhandler(MPI.ERRORS_RETURN)
        self.me = comm.rank                     # this process's rank in the original communicator
        self.nworkers = comm.size - spares
        self.logical = self.me if self.me < self.nworkers else -1     # worker number, -1: a spare
        self.workers = MPI.COMM_NULL
        self.node_map = None
        self.numbers = [n if n < self.nworkers else -1 for n in range(comm.size)]   # world rank -> worker number
        self.ckpt = None
        self.state = None
        self.committed = False                  # this run has committed or restored a checkpoint
        self.recoveries = []
        self.cause = None                       # what started the recovery in progress (text)
        self.pending = None                     # the Recovery in progress (its seconds: the detection time)
        self.raised = None                      # an exception (not a process failure) this process raised
        self._setup()

    # ------------------------------------------------------------------ the roles
    def run(self):
        fresh = True
        while True:
            try:
                if self.logical >= 0:
                    self._work(fresh)
                    self._finish()
                    return Outcome(True, self.workers, self.state, self.recoveries, self._spares_left())
                if self._wait_as_spare():
                    self.world.Free()
                    return Outcome(False, None, None, self.recoveries, self._spares_left())
            except (Exception, SystemExit) as e:  # noqa: BLE001 - process failures are recovered, the rest ends the job
                self.cause = _short(e)
                t0 = time.perf_counter()
                if _recoverable(e):
                    log.warning("world rank %d: %s (a process failed, or another one ended the job); recovering "
                                "online", self.me, self.cause)
                else:
                    self.raised = e         # not a process failure: the job ends on every process (_recover)
                    log.warning("world rank %d raised %s; ending the online job on every process (an exception "
                                "is not a process failure: it is not recovered)", self.me, self.cause)
                self._recover(t0)
                fresh = False

    def _split(self, parent):
        """Collective over ``parent``: the worker communicator, ordered by worker number
        (COMM_NULL on spares)."""
        MPI = self.MPI
        w = parent.Split(0 if self.logical >= 0 else MPI.UNDEFINED, max(self.logical, 0))
        if w != MPI.COMM_NULL:
            w.Set_errhandler(MPI.ERRORS_RETURN)
        return w

    def _setup(self):
        """Collective over the world (spares included): the worker communicator and the node map,
        then an agreement (ULFM's: a process lost before it contributed is seen by every process
        alike), so that every process knows that every other one finished the setup. When a
        process was lost during it, the survivors recover as from any failure (spares take the
        lost worker numbers; a loss of spares only is not counted as a recovery) and set up again."""
        MPI = self.MPI
        t0 = time.perf_counter()
        first = True
        while True:
            deadline = time.monotonic() + self.timeout
            ok = 1
            try:
                if first:                           # after a recovery: split by _recover
                    self.workers = self._split(self.world)
                self.node_map = self._node_map()
                faults.hit("setup", self.me)        # tests: a process dies before the setup's agreement
            except MPI.Exception as e:
                if not _recoverable(e):
                    raise
                self.cause, ok = _short(e), 0
            flag = np.array([ok], np.int32)
            try:
                self._bounded(lambda: (None, self.world.Iagree(flag)), deadline, "setting up (agreement)")
                ok = int(flag[0])
            except MPI.Exception as e:
                if not _recoverable(e):
                    raise
                self.cause, ok = self.cause or _short(e), 0
            if ok:
                return
            log.warning("a process failure while the online job was setting up (world rank %d: %s); "
                        "recovering", self.me, self.cause)
            self.node_map, first = None, False
            self._recover(t0)
            if self.pending is not None and not self.pending.lost:   # spares only: nothing for the workers to redo
                self.pending = None

    def _node_map(self):
        """Collective over the world (spares included): the workers' rank -> node map as
        ``ranks_per_node = "auto"`` detects it at the start, pinned for the whole job. Every
        Checkpointer of the job gets it (``_node_map``): after a recovery a spare stands in for
        the node of the rank it replaces, wherever it really runs, so the placement the
        checkpoints were written with still holds (docs/ONLINE.md). With an integer
        ranks_per_node the Checkpointer ignores it."""
        from .topology import Topology, renumbered
        world_map = Topology.build(self.world, "auto").node_of
        node_of_number = {n: world_map[r] for r, n in enumerate(self.numbers) if n >= 0}
        return renumbered([node_of_number[n] for n in range(self.nworkers)])

    def _work(self, fresh):
        """Collective over the workers: (re)open the Checkpointer, restart, run the steps."""
        from .checkpointer import Checkpointer
        overrides = dict(self.overrides)
        if not fresh and self.committed:
            overrides["start"] = "resume"     # this run's checkpoints: a start = "fresh" run resumes them
        if self.state is None:
            self.state = self.init(self.workers)
        self.ckpt = Checkpointer(self.workers, self.config, _node_map=self.node_map, **overrides)
        first = self.ckpt.restart(self.state)
        if first is None and not fresh:
            self.state = self.init(self.workers)          # nothing to restore: from the start
        if first is not None:
            self.committed = True
        if self.pending is not None:
            r, self.pending = self.pending, None
            r.restarted_from, r.seconds, r.restored_at = first, time.perf_counter() - r.seconds, time.time()
            self.recoveries.append(r)
            if self.on_recovery is not None:
                self.on_recovery(r)
        for i in range(0 if first is None else first + 1, self.nsteps):
            self.step(self.workers, self.state, i)
            level = self.ckpt.need_checkpoint(i)
            if level:
                self.ckpt.checkpoint(i, self.state, level=level)
                self.committed = True
        self.ckpt.close()
        self.ckpt = None

    def _finish(self):
        """Collective over the workers: the job is over; worker 0 tells each spare left."""
        self.workers.Barrier()
        if self.logical == 0:
            for r in range(self.world.size):
                if self.numbers[r] < 0:
                    try:
                        self.world.Send(np.zeros(1, np.int64), dest=r, tag=TAG_DONE)
                    except self.MPI.Exception as e:
                        if e.Get_error_class() != self.MPI.ERR_PROC_FAILED:
                            raise
                        log.warning("online: spare (world rank %d) is gone; the job ends without it", r)

    def _wait_as_spare(self):
        """Local (polling): True when the workers said the job is over; raises the MPI error of
        a process failure (or of the revoked world) when a spare is needed. The failure of
        another spare only is acknowledged and the wait goes on: the workers never see it."""
        MPI = self.MPI
        buf = np.zeros(1, np.int64)
        req = self.world.Irecv(buf, source=MPI.ANY_SOURCE, tag=TAG_DONE)
        faults.hit("spare", self.me)            # tests: a spare dies while it waits (RANK: its original rank)
        while True:
            try:
                while not req.Test():
                    time.sleep(POLL)
                return True
            except MPI.Exception as e:
                if e.Get_error_class() != MPI.ERR_PROC_FAILED_PENDING or not self._only_spares_failed():
                    raise
                self.world.Ack_failed()
                log.warning("online: a spare process failed; this spare goes on waiting")

    def _only_spares_failed(self):
        """Local: whether every process this one knows to have failed in the world was a spare."""
        failed = self.world.Get_failed()
        try:
            ranks = self.MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), self.world.Get_group())
        finally:
            failed.Free()
        return bool(ranks) and all(self.numbers[r] < 0 for r in ranks)

    def _spares_left(self):
        return self.world.size - self.nworkers if self.world != self.MPI.COMM_NULL else 0

    # ------------------------------------------------------------------ recovery
    def _recover(self, t0):
        """Collective over the survivors (after revocation): a new world and worker communicator
        of the original size, spares in the lost numbers. Raises OnlineRecoveryError on every
        survivor when it cannot."""
        from .checkpointer import revoke
        MPI = self.MPI
        if self.ckpt is not None:      # an error agreed on every worker: peers may still be in that agreement
            self.ckpt.abandon(revoke_comms=self.raised is None or not _is_collective(self.raised))
            self.ckpt = None
        if self.workers != MPI.COMM_NULL:
            revoke(self.workers)
        revoke(self.world)
        deadline = time.monotonic() + self.timeout
        old = self.world
        self.world_size_before = old.size
        attempts = 0
        while True:
            attempts += 1
            with ExitAtDeadline(deadline, f"online recovery: shrinking the world did not complete within "
                                          f"recovery_timeout = {self.timeout:g} s (world rank {self.me}); ending this "
                                          f"process: the job cannot go on online"):
                world = old.Shrink()   # blocking: the request of Open MPI 5.0's Ishrink fails (MPI_ERR_INTERN)
            faults.hit("recover", self.logical)     # tests: a failure during the recovery
            world.Set_errhandler(MPI.ERRORS_RETURN)
            ok, decision = 1, None
            try:
                mine = np.array([self.logical, self.me, 1 if self.committed else 0, 0 if self.raised is None else 1],
                                np.int64)
                table = np.empty((world.size, 4), np.int64)
                self._bounded(lambda: (None, world.Iallgather(mine, table)), deadline, "learning who is left")
                decision = self._decide(table)
                if decision[0] is None:
                    new_logical = self.logical if self.logical >= 0 else decision[1].get(self.me, -1)
                    saved = self.logical
                    self.logical = new_logical
                    try:
                        workers = self._split(world)
                    finally:
                        self.logical = saved
            except MPI.Exception:
                ok = 0
                revoke(world)
            flag = np.array([ok], np.int32)
            try:
                self._bounded(lambda: (None, world.Iagree(flag)), deadline, "agreeing on the recovery")
                ok = int(flag[0])
            except MPI.Exception:
                ok = 0
            if not ok:
                revoke(world)
                old = world
                log.warning("a failure during the recovery (world rank %d): shrinking again", self.me)
                continue
            break
        error, assign, committed = decision
        if any(table[:, 3]):
            raise self._raised_everywhere(world, table, error, deadline)
        if error is not None:
            raise _collective(OnlineRecoveryError(error))
        if self.logical < 0:
            self.logical = assign.get(self.me, -1)
        self.world, self.workers, self.committed = world, workers, committed
        self.numbers = [int(lg) if lg >= 0 else assign.get(int(me), -1) for lg, me, _, _ in table]
        rec = Recovery(tuple(sorted(assign.values())), tuple(sorted(assign)), None, t0, attempts)
        prev = self.pending
        if prev is not None and prev.lost and self.logical >= 0:
            # a failure before the previous recovery restored the state (during its restart): one
            # recovery, which names every loss and spare of both
            rec = Recovery(tuple(sorted(set(prev.lost) | set(rec.lost))),
                           tuple(sorted(set(prev.replaced_by) | set(rec.replaced_by))), None, prev.seconds,
                           prev.attempts + attempts)
        self.pending = rec if self.logical >= 0 else None        # a spare left waiting reports nothing
        if self.logical == 0 and rec.lost:
            log.warning("online recovery: worker rank(s) %s lost, taken by spare(s) %s (world ranks); %d spare(s) "
                        "left; %d attempt(s); restarting from the newest checkpoint", list(rec.lost),
                        list(rec.replaced_by), self._spares_left(), rec.attempts)
        elif self.logical == 0:
            log.warning("online recovery: only spare processes were lost; %d spare(s) left; %d attempt(s)",
                        self._spares_left(), attempts)

    def _raised_everywhere(self, world, table, error, deadline):
        """Collective over the survivors (``world``: the shrunk world, ``table`` its rows): some
        process raised an exception. The first one's class and text are broadcast (a fixed-size
        buffer, failure path only) and the error every process raises is returned, as
        ``comm.agree`` chooses it: that HpcCkptError subclass, or CollectiveError for anything
        else, raised from this process's own exception. A process whose exception was agreed
        already (hpcckpt's, on every worker) or was SystemExit raises its own."""
        root = int(np.flatnonzero(table[:, 3])[0])
        buf = np.zeros(MESSAGE_BYTES, np.uint8)
        if world.rank == root:
            kind = type(self.raised).__name__ if isinstance(self.raised, HpcCkptError) else ""
            text = f"{kind}\n{_short(self.raised, MESSAGE_BYTES // 4)}".encode()[:MESSAGE_BYTES]
            buf[:len(text)] = np.frombuffer(text, np.uint8)
        try:
            self._bounded(lambda: (None, world.Ibcast(buf, root=root)), deadline, "telling every process the error")
            kind, _, message = buf.tobytes().rstrip(b"\0").decode(errors="replace").partition("\n")
        except (self.MPI.Exception, OnlineRecoveryError):
            kind, message = "", "(its message was lost with another failure)"
        if self.raised is not None and (_is_collective(self.raised) or isinstance(self.raised, SystemExit)):
            return self.raised
        text = (f"{error}: {message}. The job ends on every process; relaunch it once the cause is mended (it "
                f"restarts from the newest checkpoint)")
        cls = errors.ALL.get(kind, CollectiveError)
        number = int(table[root, 0])
        err = CollectiveError(text, {number: message}) if cls is CollectiveError else cls(text)
        err.__cause__ = self.raised
        return _collective(err)

    def _decide(self, table):
        return decide(table, self.nworkers, self.world_size_before, self.cause)

    def _bounded(self, start, deadline, what):
        """Local polling of a nonblocking MPI call until ``deadline``: ``start()`` returns
        (result, request); returns the result. OnlineRecoveryError when time is up."""
        out = start()
        result, req = out if isinstance(out, tuple) else (None, out)
        while not req.Test():
            if time.monotonic() > deadline:
                raise _collective(OnlineRecoveryError(
                    f"online recovery: {what} did not complete within recovery_timeout = {self.timeout:g} s "
                    f"(world rank {self.me}); the job cannot go on online"))
            time.sleep(POLL)
        return result


def _recoverable(exc):
    """Local: an MPI error that may come from a failed process (hpcckpt.comm.is_process_failure:
    ULFM's classes, and MPI_ERR_OTHER, which Open MPI 5.0 returns on some ranks for the same
    failure; a recovery that then finds nobody lost raises OnlineRecoveryError: an MPI error
    without a failure is never retried)."""
    from .comm import is_process_failure
    return is_process_failure(exc)


def _is_collective(exc):
    from .comm import is_collective
    return is_collective(exc)


def _collective(exc):
    from .comm import mark_collective
    return mark_collective(exc)


def _short(exc, limit=200):
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < limit else text[:limit] + "…"
