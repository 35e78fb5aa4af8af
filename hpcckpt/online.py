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

This module is the public API (``run``, ``Recovery``, ``Outcome``, ``check_support``); the
runtime (the workers' loop, the spares' wait, the recovery) is online_loop.py, the pure decision
of a recovery online_decision.py, and the deadlines that end a hanging process online_exit.py.
"""
import dataclasses
import os

from .errors import HpcCkptError, ULFMUnsupportedError
from .online_exit import FINALIZE


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
    from .online_loop import OnlineLoop
    try:
        return OnlineLoop(comm, init, step, int(nsteps), int(spares), config, overrides, float(recovery_timeout),
                          on_recovery).run()
    except BaseException:
        FINALIZE["status"] = 1
        raise
