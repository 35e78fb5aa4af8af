"""Online recovery: a job that loses ranks (or whole nodes) goes on without being relaunched.

``hpcckpt.online.run(comm, init, step, nsteps, spares=S, config=..., **overrides)`` (collective
over ``comm``, usually MPI.COMM_WORLD) splits the processes into ``comm.size - S`` workers and
``S`` spares (Fenix's model: spares are started with the job and wait). The workers run the
application's loop::

    state = init(workers)                      # local: this rank's state at step 0 (a dict)
    for i in range(first, nsteps):
        step(workers, state, i)                # the application's step: collective on workers
        level = ckpt.need_checkpoint(i)        # the Checkpointer's policy (config: schedule, ...)
        if level:
            ckpt.checkpoint(i, state, level=level)

When a process fails (ULFM reports ``MPI.ERR_PROC_FAILED`` / ``ERR_REVOKED`` in any call of any
rank, the application's or hpcckpt's), every process that sees it revokes the communicators
(so that no other process stays blocked), abandons its Checkpointer locally, and all the
survivors, spares included, shrink the world, learn from one allgather who is gone, and give
each lost worker number to a spare (``Split`` with key = that number): the new worker
communicator has the original size and order. A new Checkpointer on it restarts every rank from
the newest checkpoint (survivors from their node cache; a spare that took rank r's number reads
rank r's node cache, or is rebuilt from partner copies / parity when that node is lost or the
spare runs on another host; the pfs only when no cheaper level has it), and the loop resumes at
the next step. The rank -> node map is the one detected at the start, pinned for the whole job
(a spare stands in for the node of the rank it replaces; docs/ONLINE.md). An agreement (ULFM
``Agree``) confirms each recovery; a failure during one starts it again. The setup (worker
communicator, node map) ends with an agreement too: a process lost before it is recovered from
like any other (spares take lost worker numbers; the job starts at step 0).

An exception that is not a process failure (the application's, or an hpcckpt error every
worker raised) is not recovered: the process revokes like for a failure, and in the survivors'
allgather it says that it raised; then every process, spares included, raises that error
(``CollectiveError`` naming it, or its hpcckpt class) and the job ends (docs/ONLINE.md).

Every wait is bounded: the shrink, the allgather and the agreement of a recovery, and the
setup's agreement, are polled until ``recovery_timeout``; spares poll their receive. When the
failures outnumber the spares, every survivor raises OnlineRecoveryError (nothing is restored:
never wrong data).

Needs an MPI with ULFM: Open MPI 5 launched with ``mpirun --with-ft ulfm --mca pml ob1 --mca btl
tcp,self`` (``hpcckpt.mpi_launch``: ``command(n, argv, fault_tolerant=True)``); anything else is
refused up front with ULFMUnsupportedError. docs/ONLINE.md tells the whole model.
"""
import dataclasses
import logging
import os
import time

import numpy as np

from . import errors, faults
from .errors import CollectiveError, HpcCkptError, OnlineRecoveryError, ULFMUnsupportedError

log = logging.getLogger("hpcckpt")

TAG_DONE = 0x0D0E          # worker 0 -> each spare: the job is over
POLL = 0.01                # seconds between two tests of a pending request
MESSAGE_BYTES = 1024       # the broadcast text of an exception that ends an online job
FINALIZE_TIMEOUT = 5.0     # seconds MPI_Finalize gets at exit once a failure was seen (see _bound_finalize)


@dataclasses.dataclass
class Recovery:
    """One online recovery, as the workers that took part in it know it (a spare knows the
    recoveries from the one that made it a worker on). A failure before a recovery's restart
    completed (during its restore) makes it one recovery that names both losses."""
    lost: tuple            # the worker numbers (ranks of the worker communicator) that were lost
    replaced_by: tuple     # the world ranks (of the original communicator) of the spares that took them
    restarted_from: object  # the step restored (None: no checkpoint yet, the state from init)
    seconds: float         # from this process's detection to the restored state
    attempts: int          # shrink/agree rounds it took (more than 1: a failure during the recovery)
    restored_at: float = None   # time.time() when this process had its state restored


@dataclasses.dataclass
class Outcome:
    """What ``run`` returns on every process that is left at the end."""
    worker: bool           # False: a spare that was never needed (``state`` and ``comm`` are None)
    comm: object           # the final worker communicator (the application may use it, then Free it)
    state: dict            # this worker's state after the last step
    recoveries: list       # [Recovery] this process took part in as a worker, oldest first
    spares_left: int


def check_support(comm=None):
    """Local: raise ULFMUnsupportedError unless this MPI and this launch can recover online."""
    from mpi4py import MPI
    from .comm import FAILURE_CLASSES
    version = MPI.Get_library_version()
    if "Open MPI" in version:
        flag = os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower()
        if flag in ("1", "true", "yes", "on") and MPI.ERR_PROC_FAILED in FAILURE_CLASSES:
            return
        raise ULFMUnsupportedError(
            "online recovery needs Open MPI's fault tolerance switched on at launch: mpirun --with-ft ulfm "
            "--mca pml ob1 --mca btl tcp,self ... (hpcckpt.mpi_launch: command(n, argv, fault_tolerant=True)); "
            "this job was started without it (OMPI_MCA_mpi_ft_enable is not set)")
    from .mpi_launch import ulfm_refusal
    title = version.split(",")[0].split("\n")[0].strip() or "this MPI"
    raise ULFMUnsupportedError(ulfm_refusal(title))


def run(comm, init, step, nsteps, *, spares=1, config=None, recovery_timeout=60.0, on_recovery=None,
        **overrides):
    """Collective over ``comm``: run ``step(workers, state, i)`` for i in [first, nsteps) on
    ``comm.size - spares`` workers, checkpointing as the Checkpointer's policy says, recovering
    online from failed processes. Returns an Outcome on every process left at the end.

    ``init(workers)`` (local) returns this worker's state dict at step 0 (NumPy arrays and small
    values, as ``Checkpointer.checkpoint(state=...)`` takes); it is also called on a spare that
    becomes rank r (a template of the right shapes, filled by the restart). ``config`` and
    ``overrides`` are the Checkpointer's. ``on_recovery(Recovery)`` (local) is called on every
    worker after each recovery. Raises ULFMUnsupportedError (before any communication) without
    ULFM, OnlineRecoveryError on every survivor when the job cannot go on, and on every process
    the error that ends the job when ``init``, ``step`` or ``on_recovery`` raised on some worker
    (CollectiveError naming it, or its class when it is an HpcCkptError)."""
    check_support(comm)
    if not callable(init) or not callable(step):
        raise TypeError("online.run(comm, init, step, nsteps, ...): init and step must be callables")
    if int(spares) < 0 or int(spares) >= comm.size:
        raise HpcCkptError(f"spares = {spares}: needs 0 <= spares < the {comm.size} processes")
    try:
        return _Loop(comm, init, step, int(nsteps), int(spares), config, overrides, float(recovery_timeout),
                     on_recovery).run()
    except BaseException:
        _FINALIZE["status"] = 1
        raise


def decide(table, nworkers, size_before, cause=None):
    """Pure, the same on every survivor (each has the same table): the outcome of a recovery.

    ``table`` rows are (worker number or -1 for a spare, original rank, has-a-checkpoint,
    raised-an-exception) of every process left; ``nworkers`` the workers the job needs;
    ``size_before`` the processes before the failure. Returns (error text or None, {spare's
    original rank: worker number it takes}, whether this run has a checkpoint). Lost numbers go
    in increasing order to the spares in increasing order of their original rank; a process that
    raised ends the job (an error naming the first one, nothing assigned)."""
    present = {int(lg) for lg, _, _, _ in table if lg >= 0}
    missing = sorted(set(range(nworkers)) - present)
    spare_ranks = sorted(int(me) for lg, me, _, _ in table if lg < 0)
    committed = bool(max((int(c) for _, _, c, _ in table), default=0))
    raised = [(int(lg), int(me)) for lg, me, _, r in table if r]
    if raised:
        lg, me = raised[0]
        who = f"worker {lg} (world rank {me})" if lg >= 0 else f"spare process (world rank {me})"
        more = f" and {len(raised) - 1} more process{'es' if len(raised) > 2 else ''}" if len(raised) > 1 else ""
        return (f"{who}{more} raised an exception, which online recovery does not retry (it replaces "
                f"failed processes only)", {}, committed)
    if len(table) == size_before and not missing:
        return (f"an MPI error ({cause}) but no process failed: not a failure online recovery "
                f"can repair", {}, committed)
    if len(missing) > len(spare_ranks):
        return (f"{len(missing)} of the {nworkers} worker ranks are lost (numbers "
                f"{', '.join(map(str, missing[:16]))}) and only {len(spare_ranks)} spare process"
                f"{'es are' if len(spare_ranks) != 1 else ' is'} left: the job cannot go on online. "
                f"Relaunch it (it restarts from the newest checkpoint), with more spares "
                f"(online.run(..., spares=S)) to survive this", {}, committed)
    return None, dict(zip(spare_ranks, missing)), committed


class _Loop:
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
        _bound_finalize(min(timeout, FINALIZE_TIMEOUT))    # any process may see a failure, or a peer of it
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
            with _Watchdog(deadline, f"online recovery: shrinking the world did not complete within "
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


class _Watchdog:
    """``with _Watchdog(deadline, message):`` a blocking MPI call that cannot be polled: past
    ``deadline`` (time.monotonic) a timer thread prints ``message`` to stderr and ends this
    process with exit status 3 (no MPI call from the thread)."""

    def __init__(self, deadline, message):
        import threading
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire, args=(message,))
        self.timer.daemon = True

    @staticmethod
    def _fire(message):
        os.write(2, f"hpcckpt: {message}\n".encode())
        os._exit(3)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        return False


_FINALIZE = {"registered": False, "status": 0}


def _bound_finalize(timeout):
    """Local, once per process of an online job: MPI_Finalize is called at exit from an atexit
    handler, with ``timeout`` seconds to complete (a process that saw no failure itself may share
    the job with one that did). Open MPI 5.0.11's MPI_Finalize sometimes
    never returns in a job that lost a process (ompi_mpi_finalize spins); past the bound this
    process flushes its output and ends with the status it was ending with (0, or 1 when
    online.run raised)."""
    if _FINALIZE["registered"]:
        return
    _FINALIZE["registered"] = True
    import atexit
    atexit.register(_finalize_within, timeout)


def _finalize_within(timeout):
    import sys
    import threading
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return

    def give_up():
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(_FINALIZE["status"])
    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    try:     # through ctypes, which releases the GIL (mpi4py's Finalize keeps it: the timer could not run)
        import ctypes
        ctypes.CDLL(_libmpi()).MPI_Finalize()
    except OSError:
        MPI.Finalize()
    timer.cancel()


def _libmpi():
    """The file name of the MPI library mpi4py is linked against (already loaded in this process)."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libmpi.so" in path:
                return path
    raise OSError("libmpi not found among the loaded libraries")


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
