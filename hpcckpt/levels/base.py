"""``Level``: the one interface every checkpoint level implements (local, partner, xor, rs, pfs, and
any level a user registers), and the context a level is given.

Every checkpoint is first a local one: each rank writes its arrays into ``step_<S>/`` of its node
cache (levels/local.py) and commits its manifest there. A level adds what makes that step survive
more: copies or parity in other nodes' caches (a *redundant* level: partner, xor, rs), or a copy
somewhere else that it restores from directly (a *restoring* level: pfs), or nothing (local).

Call order, per checkpoint (save.py; each call collective, inside ``comm.Collective``, so any
rank's error is raised on every rank and the step is not committed at this level)::

    pending = level.prepare(step, ckpt_id, items, epoch, state_keys)   # if level.prepares()
        # the cache write (pipe=pending: the level may take the bytes as they are copied)
    redundant levels:  committed = level.protect(manifest, pending)     # then the manifest commit
    other levels:      the manifest commit; then level.protect(manifest, pending)
    level.retire(manifest, clear_others)                                # after protect
    # on an error between prepare and protect: level.discard(pending)   (local)

With ``background`` (``level.background()`` True) ``prepare`` is not called; ``ready()`` is,
in the caller's thread; then ``protect`` (then, for
a redundant level, the manifest commit at this level) and ``retire`` run in a background thread
on a communicator of their own (``LevelContext.comm``), reading the committed cache files, never
the application's arrays.

Per restart (restore.py)::

    level.offers(skipped)                             # rank 0, local: steps it restores directly
    level.recover(step, ckpt_id, data_ok)             # redundant: rebuild lost ranks into the caches
    level.restore(step, protected, state, layouts)    # restoring: fill the arrays from its copy

And the rest: ``pinned_steps()`` (cache steps it still needs beyond ``keep``), ``clear_earlier
(epoch)`` (``start = "fresh"``: remove earlier runs' copies of its own), ``close()`` (collective),
``abandon()`` (local, no MPI: after a process failure), ``comms()`` (the communicators it made,
revoked by abandon). Class-level, without MPI: ``settings`` (its own config keys, levels/options),
``placement_warnings(node_of, options, config)`` (what it cannot survive on this placement), and
its files (``files``, levels/files.py): ``hpcckpt list/verify/inspect`` and ``relocate`` ask the
level, they never parse its file names.

A level is one module: a subclass of ``Level`` decorated with ``registry.register``. Errors: raise
inside a method (``OSError`` for files, an ``HpcCkptError`` for the rest); inside a point-to-point
exchange, keep the rank in every round with ``comm.Deferred`` and raise after it.
"""
import abc
import dataclasses

FAILURES = ("process", "node", "system")   # the failures a level may survive, narrowest first (``survives``)


@dataclasses.dataclass
class LevelContext:
    """What a level works with (given to its constructor; nothing else of the Checkpointer).

    ``comm``: the library's communicator for this level (a duplicate of its own when its work may
    run in the background thread); ``cache``: the node cache (levels/local.LocalCache);
    ``topology``: the nodes (topology.Topology); ``config``: the Config; ``options``: this
    level's own settings (a dict, levels/options.py); ``lock(path, what)``: rank 0 locks a
    directory of the level's own for this job (released by close/abandon)."""
    comm: object
    cache: object
    topology: object
    config: object
    options: dict
    lock: object = None


class Level(abc.ABC):
    """One checkpoint level. Subclasses set ``name`` and ``order`` and register themselves."""

    name = None           # the registry name: config `level`, schedules, manifests
    order = None          # resilience order, cheapest first (local 10, partner 20, xor 30, rs 40, pfs 50)
    redundant = False     # protect() adds copies/parity in other nodes' caches; recover() rebuilds from them
    restores = False      # keeps a copy of its own: offers() and restore() (pfs)
    any_rank_count = False    # restore() places blocks on another rank count (needs equal dtypes on all ranks)
    settings = {}         # {key: options.Setting}: this level's own config keys ([<name>] in the TOML file)
    survives = "process"  # the widest failure (FAILURES) a step at this level survives: the failure model
                          # of the interval policy and the simulator (the cheapest level surviving each)
    keeps = "copies"      # what a redundant level keeps in other nodes' caches, in a word (log lines)
    files = None          # files.LevelFiles: its files, for the catalog, verify and relocate (no MPI)

    def __init__(self, ctx):
        """Collective: set up the level (sub-communicators, directories) for one Checkpointer."""
        self.ctx = ctx

    # ------------------------------------------------------------------ per checkpoint
    def background(self):
        """Local, the same on every rank: whether protect() runs in the background thread."""
        return False

    def ready(self):
        """Collective, in the caller's thread, before protect() starts in the background thread:
        set up what the level makes on first use (the pfs store and its directory lock), so
        that the thread never makes a communicator."""

    def prepares(self):
        """Local, the same on every rank: whether prepare() is to be called (then the arrays to
        write are agreed on before it, in an agreement of their own)."""
        return False

    def prepare(self, step, ckpt_id, items, epoch, state_keys):
        """Collective, before the cache write of a step at this level, when prepares() (never
        with background): returns a pipe that the cache write feeds (``pipe.write(i, final)``, levels/local.py), or
        None. ``items``: [(name, array, Layout)]; ``state_keys``: {state key: layout kind}."""
        return None

    def protect(self, manifest, pending=None):
        """Collective: make the committed step of ``manifest`` (this rank's) survive what this
        level survives. A redundant level returns the manifest to commit at its level (it may
        name an incremental base; None means ``manifest``); the others return None."""
        return None

    def retire(self, manifest, clear_others=False):
        """Collective, after protect(): retire this level's own copies beyond ``keep`` (the cache
        steps are retired by the save protocol). ``clear_others``: start = "fresh"."""

    def discard(self, pending):
        """Local: give up what prepare() began (the step failed before protect)."""

    def clear_earlier(self, epoch):
        """Collective, once (start = "fresh", after this run's first commit): remove the copies
        of earlier runs (epochs other than ``epoch``) that this level keeps outside the cache."""

    # ------------------------------------------------------------------ per restart
    def offers(self, skipped=None):
        """Local (rank 0): {step: (epoch, ckpt_id)} of the steps this level restores directly
        (``restores``); ``skipped`` receives (step, reason) for steps it cannot use."""
        return {}

    def recover(self, step, ckpt_id, data_ok):
        """Collective (redundant levels): rebuild, into their caches, the ranks r with
        ``data_ok[r]`` False, verify and commit them. True on every rank when every lost rank was
        rebuilt; False on every rank when the losses exceed the level."""
        return False

    def restore(self, step, protected, state, layouts):
        """Collective (restoring levels): fill ``protected`` ([(name, array, Layout)]) and the
        ``state`` dict from this level's copy of ``step``; CorruptCheckpointError when the copy
        cannot be used (the restart falls back)."""
        raise NotImplementedError(f"the {self.name} level does not restore directly")

    # ------------------------------------------------------------------ the rest
    def pinned_steps(self):
        """Local: cache steps this level still needs beyond ``keep`` (an incremental base)."""
        return ()

    def comms(self):
        """Local: the communicators this level created (revoked by abandon(), never ``Free``d there)."""
        return ()

    def close(self):
        """Collective: wait for the level's work and free what it holds. Harmless twice."""

    def abandon(self):
        """Local, without MPI: drop what the level holds after a process failure."""

    @classmethod
    def placement_warnings(cls, node_of, options, config):
        """Local, pure: plain-language warnings about what this level cannot survive when rank r
        runs on node ``node_of[r]`` (rank 0 logs them once); ``options``: its settings
        (``config.level_options(name)``). Here: a redundant level on one node (then a subclass
        adds nothing more)."""
        if cls.redundant and max(node_of) == 0:
            return [f"all ranks are on one node: the {cls.name} level cannot survive the loss of that node "
                    "(set ranks_per_node, or run on several nodes)"]
        return []
