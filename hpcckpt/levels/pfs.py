"""The pfs level: checkpoints as plain HDF5 under ``pfs_dir``, restartable on any rank count.

Layout (docs/PFS.md)::

    <pfs_dir>/<name>/step_<S>/node_<n>.h5     one file per node, laid out by the node's aggregator
                              checkpoint.h5   the master: global arrays as virtual datasets,
                                              /rank_<R> external links to every rank's group
                              COMMITTED.json  the index and commit marker, written last

``PfsStore`` is the level. Here: setting it up, its paths, listing, describing and retiring
steps, and ``close``; its save protocol (``begin``/``finish``) is ``PfsSave`` (pfs_save.py), its
read path (``restore``, ``verify``) ``PfsRestore`` (pfs_restore.py). What a step is written from
(``Item``) and the index entries built from it are in pfs_items.py; each rank's bytes go through
its ``NodeWriter`` thread (pfs_writer.py).

Retire, collective: rank 0 uncommits each step to remove (its marker first) and renames its
directory into ``<pfs_dir>/<name>/.trash/``; every aggregator then unlinks its own node file
there, and rank 0 the rest, in a background thread of their own (no MPI in it), so that a
checkpoint does not wait while the file system frees the blocks, and no rank removes the files
of every node. The next retire waits for these removals first (at most one retired step's
files are pending); ``close()`` waits for them and removes ``.trash``. What a crash leaves in
``.trash`` is removed by the next retire.

h5py from PyPI has no MPI, so nothing here needs parallel HDF5; the data never goes through the
HDF5 library on the write path (h5py lays out the files, ``os.pwrite`` fills them). Every method
is collective over the store's own duplicate of the communicator given (so it may run in a
background thread while the application computes).
"""
import logging
import os
import uuid

import numpy as np

from .. import manifest as mf, state as st, storage
from ..comm import Collective
from ..watchdog import watch
from ..errors import CheckpointWriteError, HpcCkptError
from . import hdf5_layout as lay
from . import pfs_check
from .pfs_index import MARKER, SPARE, TRASH, listing as _listing, max_index_bytes, read_index
from .pfs_restore import PfsRestore
from .pfs_save import PfsSave

log = logging.getLogger("hpcckpt")
__all__ = ["PfsStore", "listing", "remove_step_dir"]


def listing(root, name=None, max_bytes=None, skipped=None):
    """Local: {step: (epoch, ckpt_id)} of the committed steps of the job directory ``root``
    (``skipped``: see pfs_index.listing)."""
    return _listing(root, name, max_bytes, skipped)


class PfsStore(PfsSave, PfsRestore):
    """HDF5 checkpoints of one job under ``<pfs_dir>/<name>``. ``PfsStore(cfg, comm, topology)``
    is collective. Saving is PfsSave's (pfs_save.py), reading back PfsRestore's (pfs_restore.py)."""

    def __init__(self, cfg, comm, topology):
        self.cfg = cfg
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.rank, self.comm.size
        with Collective(self.comm, "setting up the pfs level"):
            node_of = tuple(int(n) for n in topology.node_of)
            if len(node_of) != self.size or topology.rank != self.rank:
                raise HpcCkptError(f"the topology describes {len(node_of)} ranks (rank {topology.rank}), "
                                   f"the communicator has {self.size} (rank {self.rank})")
            if sorted(set(node_of)) != list(range(max(node_of) + 1)):
                raise HpcCkptError(f"node indices must be 0..n-1, got {sorted(set(node_of))[:8]}")
        self.node_of = node_of
        self.node = node_of[self.rank]
        self.node_ranks = [r for r, n in enumerate(node_of) if n == self.node]
        self.node_comm = self.comm.Split(self.node, self.rank)   # node_comm rank 0 = aggregator
        self.is_aggregator = self.node_comm.rank == 0
        self.root = os.path.abspath(os.path.join(cfg.pfs_dir, cfg.name))
        self.chunk = int(cfg.io_chunk)
        self._bounce = None       # NodeWriter's aligned buffer for direct writes of arrays' bytes (kept: touched once)
        self.max_index = max_index_bytes(self.size)
        self.trash = os.path.join(self.root, TRASH)
        self._deleter = storage.Deleter("hpcckpt-pfs-remove")
        # the aggregator's: (device, inode) of the node files it wrote -> their metadata extents
        # and checksum, so that a retired one is checked before HDF5 reopens it as the spare
        self._written = {}
        self.relock = None      # callable(root): lock the directory again after _recreate_root
        with Collective(self.comm, f"creating {self.root}"):
            if self.rank == 0:
                try:
                    storage.makedirs(self.root, cfg.dir_mode)
                except OSError as e:
                    raise CheckpointWriteError(f"cannot use the pfs directory {e.filename or self.root}: "
                                               f"{e.strerror}") from e

    def _recreate_root(self):
        """Local (rank 0): the job's pfs directory was removed while the job ran (a purge of the
        scratch file system): create it again, have it locked again (``relock``, set by the
        Checkpointer), and say that the earlier pfs steps are gone."""
        try:
            storage.makedirs(self.root, self.cfg.dir_mode)
            if self.relock is not None:
                self.relock(self.root)
        except OSError as e:
            raise CheckpointWriteError(f"cannot create the pfs directory {e.filename or self.root} again: "
                                       f"{e.strerror}") from e
        log.warning("the pfs directory %s was removed while the job ran (a purge of the file system?): created "
                    "again; the pfs checkpoints written before are gone", self.root)

    def close(self):
        """Collective: finish the removals of retired steps, then free the store's
        communicators. Calling it twice is harmless."""
        if self.comm is not None:
            self._deleter.wait()
            if self.is_aggregator and storage.is_own_dir(os.path.dirname(self._spare_path())):
                storage.remove_file(self._spare_path())
            with watch("the other ranks in closing the pfs level (MPI_Barrier)"):
                self.comm.Barrier()             # every node's removals are done: .trash is empty
            if self.rank == 0:
                storage.remove_tree(self.trash)
                storage.remove_tree(os.path.join(self.root, SPARE))
            self.node_comm.Free()
            self.comm.Free()
            self.comm = self.node_comm = None

    # ------------------------------------------------------------------ paths
    def step_dir(self, step):
        return os.path.join(self.root, mf.step_dir_name(step))

    def _tmp_dir(self, step, ckpt_id):
        return os.path.join(self.root, f"{mf.step_dir_name(step)}.tmp-{ckpt_id}")

    def _spare_path(self):
        return os.path.join(self.root, SPARE, lay.node_file(self.node))

    # ------------------------------------------------------------------ listing
    def steps(self):
        """Collective: the committed steps of this job, ascending (listed on rank 0)."""
        with Collective(self.comm, f"listing {self.root}"):
            steps = sorted(self.listing()) if self.rank == 0 else None
        return self.comm.bcast(steps, root=0)

    def listing(self):
        """Local: {step: (epoch, ckpt_id)} of this job's readable committed steps."""
        return _listing(self.root, self.cfg.name, self.max_index)

    def describe(self, step):
        """Collective: what step ``step`` holds (read on rank 0): a dict with ``world_size``,
        ``ckpt_id``, ``name``, ``epoch``, ``created``, ``node_of`` and ``arrays`` {name: {dtype,
        layout, has_global, global_shape, shapes (per writer rank; None where a rank holds none),
        shape (global shape, or this rank's block)}}."""
        index = self._load(step)
        arrays = {}
        for e in index.arrays:
            shapes = [None if b is None else b.shape for b in e.blocks]
            if e.global_shape is not None:
                shape = e.global_shape
            else:
                shape = shapes[self.rank] if self.rank < index.world_size else None
            arrays[e.name] = {"dtype": e.dtype, "layout": e.layout, "has_global": e.global_shape is not None,
                              "global_shape": e.global_shape, "shapes": shapes, "shape": shape}
        return {"step": index.step, "name": index.name, "world_size": index.world_size, "ckpt_id": index.ckpt_id,
                "epoch": index.epoch, "created": index.created, "node_of": index.node_of, "arrays": arrays}

    def _load(self, step, with_document=False):
        """Collective: the validated index of a committed step (read on rank 0) and, when asked,
        rank 0's state document (verified)."""
        with Collective(self.comm, f"reading pfs step {step}"):
            found = None
            if self.rank == 0:
                if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
                    raise HpcCkptError(f"step must be a non-negative integer, got {step!r}")
                index = read_index(self.step_dir(int(step)), self.cfg.name, self.max_index, int(step))
                doc = None
                e = index.entry(st.STATE_ENTRY)
                if with_document and e is not None and e.blocks[0] is not None:
                    reader = pfs_check.BlockReader(self.step_dir(index.step), index, self.chunk)
                    try:
                        data = reader.read_verified(index.arrays.index(e), 0)
                    finally:
                        reader.close()
                    doc = st.parse_document(data.tobytes(), f"pfs step {step}, rank 0")
                found = (index, doc)
        found = self.comm.bcast(found, root=0)
        return found if with_document else found[0]

    # ------------------------------------------------------------------ retire
    def retire(self, keep, epoch=None, keep_upto=None, clear_others=False):
        """Collective: keep the newest ``keep`` committed steps of run ``epoch`` (None: of every
        run) up to ``keep_upto``; delete that run's others (older ones, and newer ones of an
        abandoned attempt) and leftovers (uncommitted or temporary step directories). Other
        runs' steps and steps whose index cannot be read stay, unless ``clear_others``. Done by
        rank 0."""
        self._deleter.wait()                    # the previous retire's removals (normally done long ago)
        retired = None
        with Collective(self.comm, f"retiring old pfs checkpoints in {self.root}"):
            if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 1:
                raise HpcCkptError(f"keep must be a positive integer, got {keep!r}")
            if self.rank == 0:
                retired = []
                for name in sorted(os.listdir(self.trash)) if storage.is_own_dir(self.trash) else []:
                    self._deleter.remove(os.path.join(self.trash, name))   # left by a crash
                readable = self.listing()
                ours = sorted(s for s, (e, _) in readable.items() if epoch is None or e == epoch)
                kept = set([s for s in ours if keep_upto is None or s <= keep_upto][-int(keep):])
                committed = set(_committed(self.root))
                for name in sorted(os.listdir(self.root)):
                    step = mf.parse_step_dir_name(name)
                    leftover = step is None and name.startswith("step_") and ".tmp-" in name
                    if step is not None:
                        if step in kept:
                            continue
                        if step in committed and step not in ours and not clear_others:
                            continue          # another run's, or an index we cannot read: not ours to delete
                    elif not leftover:
                        continue
                    trashed = self._to_trash(os.path.join(self.root, name))
                    if trashed is not None:
                        retired.append(trashed)
        # each aggregator removes its node's file, rank 0 the rest (background threads)
        retired = self.comm.bcast(retired, root=0)
        spare = self._spare_path() if self.cfg.reuse_files and self.is_aggregator and retired else None
        if spare is not None:
            storage.own_dir(os.path.dirname(spare), self.cfg.dir_mode)
        for path in retired:
            if self.is_aggregator:      # the first becomes this node's spare (reuse_files), if it has none
                self._deleter.remove(os.path.join(path, lay.node_file(self.node)), spare=spare)
            if self.rank == 0:
                self._deleter.remove(path, keep=lay.NODE_FILE_RE)

    def _to_trash(self, path):
        """Local (rank 0): uncommit the step directory ``path`` (its marker first) and move it
        into ``.trash``; return its new path (None: a planted link, removed, or gone)."""
        if os.path.islink(path):
            storage.remove_file(path)
            return None
        storage.remove_file(os.path.join(path, MARKER))
        storage.own_dir(self.trash, self.cfg.dir_mode)
        trashed = os.path.join(self.trash, f"{os.path.basename(path)}-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(path, trashed)
        except FileNotFoundError:
            return None
        return trashed

    def _remove_tree(self, path):
        storage.remove_tree(path)


def remove_step_dir(path):
    """Local: uncommit a step directory (its marker first), then remove it; a planted link is
    removed itself, never what it points at."""
    if os.path.islink(path):
        storage.remove_file(path)
        return
    storage.remove_file(os.path.join(path, MARKER))
    storage.remove_tree(path)


def _committed(root):
    from .pfs_index import committed_steps
    return committed_steps(root)
