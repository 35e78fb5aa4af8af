"""``Context``: the state one Checkpointer's protocols share, explicit (save.py, restore.py,
background.py; the facade is checkpointer.py). Collective where a method says so, else local."""
import logging

from . import faults
from .comm import Collective, explain
from .levels import registry
from .levels.base import LevelContext
from .lock import DirLock

log = logging.getLogger("hpcckpt")


class Context:
    """What the save and restore protocols of one Checkpointer work with.

    ``comm`` is the library's duplicate of the application's communicator (``app_comm``, never
    used for a message of the library); ``levels`` holds the Level objects made so far (by
    ``level()``, collectively, on first use)."""

    def __init__(self, app_comm, comm, config, topology, cache, policy, threads, events):
        self.app_comm, self.comm, self.rank = app_comm, comm, comm.rank
        self.config, self.topology, self.cache, self.policy = config, topology, cache, policy
        self.threads = threads           # every rank has MPI_THREAD_MULTIPLE: background work may run
        self.events = events             # events.EventLog (set by the facade once it exists)
        self.arrays = {}                 # name -> protected.Protected, in protection order
        self.layouts = {}                # state key or array name -> state.Layout declared by layout()
        self.levels = {}                 # name -> Level
        self.bg_comm = None              # the duplicate the levels' background work talks on
        self.locks = []                  # DirLock: this rank's cache lock, rank 0's level directory locks
        self.flush = None                # background.Background of the newest step, or None
        self.epoch = None                # this run's lineage: known after restart() or the first checkpoint
        self.last_step = None
        self.committed = False           # this run committed a checkpoint
        self.clear_others = False        # start = "fresh": earlier runs' checkpoints go after the first commit
        self.stopping = False            # a stop was requested: a final checkpoint, then exit
        self.final_done = False
        self.warned = set()

    # ------------------------------------------------------------------ levels
    def level(self, name):
        """Collective (on first use of ``name``): the Level object of ``name``."""
        if name not in self.levels:
            cls = registry.level_class(name)
            level = cls(LevelContext(self.level_comm(), self.cache, self.topology, self.config,
                                     self.config.level_options(name), self.lock))
            self.levels[name] = faults.wrap_level(level, self.rank)     # test-only: _HPCCKPT_LEVEL_FAULT
        return self.levels[name]

    def level_comm(self):
        """Collective (first call with ``background``): the levels' communicator: with
        ``background`` the background thread's duplicate, so that the thread never shares one
        with the caller."""
        return self.background_comm() if self.config.background else self.comm

    def background_comm(self):
        """Collective (first call): the duplicate the background thread's agreements use."""
        if self.bg_comm is None:
            self.bg_comm = self.comm.Dup()
        return self.bg_comm

    def restoring_levels(self):
        """Collective (first call): the Level objects of every level that restores on its own."""
        return [self.level(name) for name in registry.restoring()]

    @property
    def final_level(self):
        """The level of the checkpoint before the job's end (a stop request, the end time): the
        most resilient level that keeps a copy of its own (node-local files do not outlive a job)."""
        return registry.restoring()[-1]

    def warn_placement(self, names):
        """Local (rank 0 logs): once per level, what it cannot survive on this placement."""
        new = [n for n in names if n not in self.warned]
        self.warned.update(new)
        if self.rank != 0:
            return
        for name in new:
            cls = registry.level_class(name)
            for text in cls.placement_warnings(self.topology.node_of, self.config.level_options(name), self.config):
                log.warning("%s", text)

    def lock(self, path, what):
        """Local (rank 0): lock ``path`` for this job (again when its directory was created
        anew: the lock of the same path is dropped first)."""
        for old in [lk for lk in self.locks if lk.path == path]:
            old.release()
            self.locks.remove(old)
        self.locks.append(DirLock(path, what, self.config.file_mode))

    def release_locks(self):
        for lock in self.locks:
            lock.release()
        self.locks = []

    # ------------------------------------------------------------------ lineage
    def scan_epochs(self, others=()):
        """Collective: the newest epoch any checkpoint of this job has (0: none), in the cache
        and in the levels that keep copies of their own (``others``: Found records of other
        ranks' manifests that relocate saw)."""
        levels = self.restoring_levels()
        with Collective(self.comm, "looking for earlier checkpoints") as c:
            epochs = [f.manifest.epoch for f in [*self.cache.scan(), *others] if f.manifest is not None]
            if self.rank == 0:
                epochs += [e for lv in levels for e, _ in lv.offers().values()]
            c.words = [max(epochs, default=0)]
        return c.result[0]

    def new_epoch(self):
        """Collective: the epoch of a run that did not restore a checkpoint (one past the newest)."""
        newest = self.scan_epochs()
        if newest and self.rank == 0:
            log.warning("checkpoints of an earlier run of job %r are in %s or its levels' directories: this run "
                        "starts afresh and does not remove them (restart() will only consider this run's "
                        "checkpoints); start = 'fresh' removes them", self.config.name, self.cache.root)
        return newest + 1

    def first_text(self, text):
        """Collective (failure paths): the text of the lowest rank that has one (None if none)."""
        return explain(self.comm, text, lambda texts: next((t for t in texts if t is not None), None))

    def owned_comms(self):
        """Local: the communicators the library made (its duplicates, the levels'); never the application's."""
        found = [self.comm, self.bg_comm] + [c for lv in self.levels.values() for c in lv.comms()]
        out, seen = [], set()
        for c in found:
            if c is not None and c is not self.app_comm and id(c) not in seen:
                seen.add(id(c))
                out.append(c)
        return out
