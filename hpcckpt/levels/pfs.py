"""The pfs level: checkpoints as plain HDF5 under ``pfs_dir``, restartable on any rank count.

Layout (docs/PFS.md)::

    <pfs_dir>/<name>/step_<S>/node_<n>.h5     one file per node, laid out by the node's aggregator
                              checkpoint.h5   the master: global arrays as virtual datasets,
                                              /rank_<R> external links to every rank's group
                              COMMITTED.json  the index and commit marker, written last

Save (a flush of a committed cache step), collective: every rank describes the arrays it writes
(names, layouts, shapes and the checksums the cache computed while writing them — nothing is
hashed again); the descriptions are gathered to the node's aggregator and to rank 0 (never to
every rank); rank 0 checks them and builds the index; rank 0 creates ``step_<S>.tmp-<ckpt_id>``;
each aggregator creates its node file with contiguous, pre-allocated datasets and sends the
node's ranks their offsets; every rank's NodeWriter writes its raw bytes there (direct I/O where
it can); the aggregator fsyncs; rank 0 writes the master; all agree; rank 0 renames the
directory into place and writes COMMITTED.json atomically. A crash at any point leaves the
previous committed step untouched and the new one unlisted. Replicated and root arrays are
written once, by rank 0. ``save`` is ``begin`` (up to the layout) then ``finish``; a sync pfs
checkpoint calls ``begin`` before the cache write, which hands the writer the bytes as it copies
them, and ``finish`` once the cache step is committed (docs/PFS.md, "Protocol").

Restore, collective: rank 0 reads and checks the index (and rank 0's state document); every
rank plans what it reads — its own blocks on the same rank count, a box of each global array
(block and rows layouts) on any rank count, rank 0's block of replicated and root values — and
checks that its arrays and state fit (MismatchError / IncompatibleCheckpointError, naming the
values); the blocks read are verified against their checksums (each by one reader); only then
is anything filled.

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
import dataclasses
import logging
import os
import shutil
import time
import uuid

import numpy as np

from .. import faults, manifest as mf, state as st, storage
from ..codecs.checksum import new_hasher
from ..comm import Collective
from ..watchdog import watch
from ..errors import (CheckpointWriteError, CorruptCheckpointError, HpcCkptError, IncompatibleCheckpointError,
                      MismatchError, ProtectError)
from . import hdf5_layout as lay
from . import pfs_check, pfs_files as files
from .pfs_index import (GLOBAL_LAYOUTS, MARKER, MASTER, SPARE, TRASH, SHARED_LAYOUTS, Block, Entry, Index, id_ok,
                        listing as _listing, max_index_bytes, read_index)

WRITE_PIECE = 8 << 20
"""Bytes per pwrite of the node files (at least ``io_chunk``). With ``pfs_direct_io`` the
4 KiB-aligned part of each array goes to the device straight from the cache's mapping (O_DIRECT);
the rest goes through the page cache, and the kernel starts writing each such piece right after
it (storage.start_writeback), so that the final fsync has less left to do (docs/PFS.md, "The
flush protocol")."""

log = logging.getLogger("hpcckpt")
__all__ = ["PfsStore", "Item", "items_from_arrays", "items_from_manifest", "listing", "remove_step_dir", "MARKER",
           "MASTER"]


@dataclasses.dataclass(frozen=True)
class Item:
    """One array to write: its name, data, layout (hpcckpt.state.Layout) and XXH3-64 checksum."""
    name: str
    array: np.ndarray
    layout: st.Layout
    checksum: str


def items_from_manifest(manifest, mapped):
    """Items of a committed cache step: ``mapped`` are its arrays (LocalCache.mapped_arrays;
    None: the items carry no data, for a PendingStep given all of it already)."""
    arrays = {name: a for name, a, _, _ in mapped or ()}
    return [Item(a.name, arrays.get(a.name), st.Layout(a.layout, a.global_shape, a.global_offset), a.checksum)
            for a in manifest.arrays]


def items_from_arrays(arrays):
    """Items of live arrays, hashed here: ``arrays`` is a list of (name, ndarray, global_shape
    or None, offset or None) — for code that drives the store directly."""
    out = []
    for name, array, gshape, goffset in arrays:
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ProtectError(f"array {name!r}: expected a C-contiguous NumPy array")
        hasher = new_hasher()
        hasher.update(storage.byte_view(array))
        layout = st.PER_RANK if gshape is None else st.Block(gshape, goffset)
        out.append(Item(name, array, layout, hasher.hexdigest()))
    return out


def listing(root, name=None, max_bytes=None, skipped=None):
    """Local: {step: (epoch, ckpt_id)} of the committed steps of the job directory ``root``
    (``skipped``: see pfs_index.listing)."""
    return _listing(root, name, max_bytes, skipped)


class PfsStore:
    """HDF5 checkpoints of one job under ``<pfs_dir>/<name>``. ``PfsStore(cfg, comm, topology)``
    is collective."""

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

    # ------------------------------------------------------------------ save
    def save(self, step, ckpt_id, items, *, epoch=1, state_keys=None):
        """Collective: write ``items`` (this rank's Items) as committed step ``step`` of run
        ``epoch``; return the bytes this rank wrote. ``state_keys``: {state key: layout kind}."""
        return self.finish(self.begin(step, ckpt_id, items, epoch=epoch, state_keys=state_keys), items)

    def begin(self, step, ckpt_id, items, *, epoch=1, state_keys=None):
        """Collective: the first half of save(): check every rank's ``items`` and build the index
        (rank 0, which creates the temporary step directory in the same agreement), lay out the
        node files; returns the PendingStep. Items may come without checksums (None): then their
        bytes may be handed to ``PendingStep.write`` while the cache write hashes them, and
        finish() gets the checksums.

        A node file that cannot be laid out is not agreed on here, so that no rank waits for the
        slowest node's file before its bytes go out: the error is the PendingStep's, raised in
        the next agreement (the cache write's, by ``PendingStep.check()``, when it hands the bytes
        over; else finish()'s first, once every rank has made finish()'s collective calls: the
        other ranks of the node do not know of it), and the node's ranks write nothing meanwhile."""
        try:
            meta, error = self._describe_items(step, ckpt_id, items), None
        except BaseException as e:  # noqa: BLE001 - raised in the agreement below, after the gathers
            meta, error = None, e
        node_meta = self.node_comm.gather(meta, root=0)
        everyone = self.comm.gather((meta, state_keys or {}), root=0)
        mine = [it for it in items if it.layout.kind not in SHARED_LAYOUTS or self.rank == 0]
        pending = PendingStep(step, self._tmp_dir(step, ckpt_id), None, sum(it.array.nbytes for it in mine),
                              all(it.checksum is not None for it in items))
        node_index = None
        try:
            with Collective(self.comm, f"pfs checkpoint of step {step}: checking the arrays of every rank"):
                if error is not None:
                    raise error
                if self.rank == 0 and all(m is not None for m, _ in everyone):   # else a rank raised
                    pending.index = self._build_index(step, ckpt_id, epoch, [m for m, _ in everyone],
                                                      [k for _, k in everyone])
                    self._create_tmp_dir(pending.tmp)
                if self.is_aggregator and all(m is not None for m in node_meta):
                    metas = [None] * self.size
                    for r, m in zip(self.node_ranks, node_meta):
                        metas[r] = m
                    node_index = self._index(step, ckpt_id, epoch, _entries(metas, self.size, partial=True), {})
        except HpcCkptError:
            self.abandon(pending)
            raise
        del everyone, node_meta
        path = os.path.join(pending.tmp, lay.node_file(self.node))
        offsets = None
        if self.is_aggregator:
            try:
                offsets = self._lay_out_node_file(path, node_index)
            except BaseException as e:  # noqa: BLE001 - PendingStep.check() raises it in the next agreement
                pending.error = e
        with watch("this node's aggregator laying out its pfs node file (MPI_Bcast on the node's communicator)"):
            offsets = self.node_comm.bcast(offsets, root=0)   # None: the aggregator failed; nothing to write
        if self.is_aggregator and offsets is not None:
            pending.data_ranges = [(off, node_index.entry(name).nbytes(r)) for (r, name), off in offsets.items()
                                   if off is not None]
        piece = max(self.chunk, WRITE_PIECE)
        pieces = sum(-(-it.array.nbytes // piece) for it in mine)
        fault = faults.HalfWay("pfs-write", self.rank, step, max(1, pieces // 2)) if faults.active() else None
        targets = {i: (offsets[(self.rank, it.name)], it.array.nbytes) for i, it in enumerate(items)
                   if offsets is not None and (self.rank, it.name) in offsets}
        if self.cfg.direct_io and (self._bounce is None or self._bounce.nbytes < piece):
            self._bounce = storage.aligned_buffer(piece)
        pending.writer = NodeWriter(path, targets, piece, self.cfg.direct_io, fault, self._bounce)
        return pending

    def _create_tmp_dir(self, tmp):
        """Local (rank 0): the step's temporary directory, created anew."""
        try:
            if not os.path.isdir(self.root):
                self._recreate_root()
            if os.path.islink(tmp) or os.path.isfile(tmp):
                os.unlink(tmp)              # planted: never followed
            elif os.path.lexists(tmp):
                shutil.rmtree(tmp)
            os.mkdir(tmp, self.cfg.dir_mode)
        except OSError as e:
            raise CheckpointWriteError(f"cannot create {e.filename or tmp}: {e.strerror}") from e

    def _lay_out_node_file(self, path, node_index):
        """Local (aggregator): this node's file of the step, the spare overwritten (reuse_files)
        or a new one; its {(rank, array name): offset of the dataset's bytes}."""
        try:
            faults.hit("pfs-layout", self.rank, node_index.step)
            offsets = self._reuse_spare(path, node_index)
            if offsets is None:
                offsets = files.create_node_file(path, node_index, self.node, self.node_ranks, self.cfg.file_mode)
            return offsets
        except OSError as e:
            raise CheckpointWriteError(f"cannot create {e.filename or path}: "
                                       f"{' '.join(str(e.strerror or e).split())}") from e

    def _reuse_spare(self, path, node_index):
        """Local (aggregator): with ``reuse_files``, move this node's spare (a retired node file)
        to ``path`` and lay it out for ``node_index`` (its datasets' attributes rewritten, or, for
        arrays of other shapes, HDF5's metadata of a new file written over it:
        files.relayout_node_file); its offsets, or None (no spare, or one that cannot be used) for
        a new file."""
        spare = self._spare_path()
        if not self.cfg.reuse_files or not storage.is_own_dir(os.path.dirname(spare)) or os.path.islink(spare) \
                or not os.path.isfile(spare):
            return None
        if not self._spare_intact(spare):
            log.debug("rank %d: pfs step %d: the spare %s is not a node file this process wrote, intact: not "
                      "reusing", self.rank, node_index.step, spare)
            storage.remove_file(spare)
            return None
        try:
            os.replace(spare, path)
        except FileNotFoundError:
            return None
        offsets = files.reuse_node_file(path, node_index, self.node, self.node_ranks)
        how = "overwriting"
        if offsets is None and os.path.isfile(path):
            offsets = files.relayout_node_file(path, node_index, self.node, self.node_ranks, self.cfg.file_mode)
            how = "another layout: laid out anew and overwriting"
        log.debug("rank %d: pfs step %d: %s the retired node file %s", self.rank, node_index.step,
                  how if offsets is not None else "not reusing", spare)
        return offsets

    def _spare_intact(self, spare):
        """Local (aggregator): whether the spare is a node file this process wrote whose HDF5
        metadata still matches its checksum (damaged metadata can crash libhdf5; a spare left by
        an earlier process is not known, and is replaced by a new file)."""
        try:
            st = os.stat(spare)
            meta = self._written.get((st.st_dev, st.st_ino))
            return meta is not None and meta[0] == st.st_size and files.extents_digest(spare, meta[1]) == meta[2]
        except (OSError, CorruptCheckpointError):
            return False

    def _spare_path(self):
        return os.path.join(self.root, SPARE, lay.node_file(self.node))

    def finish(self, pending, items):
        """Collective: the second half of save(): write what ``pending``'s writer has not been
        given (from ``items``' arrays, which may be None where it has), make the node files
        durable (with the checksums ``items`` carry, when begin() had none), write the master and
        commit; return the bytes this rank wrote. On failure the temporary directory is gone."""
        step = pending.step
        renamed = [False]
        try:
            index = None
            with Collective(self.comm, f"writing pfs checkpoint {step}"):
                try:
                    index = self._write_node(pending, items)
                    faults.hit("pfs-written", self.rank, step)
                except OSError as e:
                    why = " ".join(str(e.strerror or e).split())   # HDF5's messages span lines
                    raise CheckpointWriteError(f"cannot write {e.filename or pending.tmp}: {why}") from e
            with Collective(self.comm, f"committing pfs checkpoint {step}"):
                if self.rank == 0:
                    try:
                        self._commit(pending.tmp, index, renamed)
                    except OSError as e:
                        raise CheckpointWriteError(f"cannot commit pfs step {step}: {e.strerror}"
                                                   + (f" ({e.filename})" if e.filename else "")) from e
        except HpcCkptError:
            pending.writer.close()
            if self.rank == 0:
                self._remove_tree(self.step_dir(step) if renamed[0] else pending.tmp)
            raise
        return pending.nbytes

    def abandon(self, pending):
        """Local, on every rank when a step begun is given up (its error agreed): stop this
        rank's writer; rank 0 removes the temporary directory."""
        if pending.writer is not None:
            pending.writer.close()
        if self.rank == 0:
            self._remove_tree(pending.tmp)

    def _describe_items(self, step, ckpt_id, items):
        """Local: validate this rank's items; return their descriptions (what rank 0 and the
        aggregator need): [(name, dtype, shape, layout kind, global_shape, offset, checksum)]."""
        if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or not 0 <= step <= mf.MAX_STEP:
            raise HpcCkptError(f"step must be a non-negative integer, got {step!r}")
        if not id_ok(ckpt_id):
            raise HpcCkptError(f"ckpt_id must be 1-64 letters, digits, '-' or '_', got {ckpt_id!r}")
        meta, names = [], set()
        for it in items:
            mf.check_array_name(it.name)
            if lay.RANK_GROUP_RE.match(it.name):
                raise ProtectError(f"array name {it.name!r} is reserved by the pfs level (rank groups)")
            if it.name in names:
                raise ProtectError(f"array {it.name!r} appears twice")
            names.add(it.name)
            mf.check_dtype(it.array.dtype)
            kind = it.layout.kind
            if kind in SHARED_LAYOUTS and self.rank != 0:
                continue
            if kind == "block":
                mf.check_global_layout(it.array.shape, it.layout.global_shape, it.layout.offset,
                                       lambda msg, n=it.name: ProtectError(f"array {n!r}: {msg}"))
            meta.append((it.name, it.array.dtype.str, tuple(it.array.shape), kind, it.layout.global_shape,
                         it.layout.offset, it.checksum))
        return meta

    def _index(self, step, ckpt_id, epoch, entries, state_keys):
        return Index(name=self.cfg.name, step=int(step), ckpt_id=ckpt_id, world_size=self.size, created=time.time(),
                     node_of=self.node_of, files={}, arrays=tuple(entries), epoch=int(epoch),
                     state_keys=state_keys)

    def _build_index(self, step, ckpt_id, epoch, metas, keys):
        """Local (rank 0): the checked index from every rank's descriptions."""
        state_keys = {}
        for r, ks in enumerate(keys):
            for k, kind in ks.items():
                if state_keys.setdefault(k, kind) != kind:
                    raise ProtectError(f"state[{k!r}]: the ranks declare different layouts ({state_keys[k]} on a "
                                       f"lower rank, {kind} on rank {r})")
        entries = _entries(metas, self.size, partial=False)
        if not entries:
            raise ProtectError("nothing to checkpoint: no arrays")
        return self._index(step, ckpt_id, epoch, entries, state_keys)

    def _write_node(self, pending, items):
        """Collective: every rank's writer is given the bytes it was not given yet (from
        ``items``); while they are written, the aggregators put the checksums begin() lacked into
        their node files and rank 0 writes the master; then the writers finish and the aggregators
        fsync. Returns rank 0's index (with the node files and the master's checksum; None
        elsewhere). Every rank reaches every gather: an error (this node's layout, its metadata,
        a writer) is raised after them, by each rank that has it."""
        writer = pending.writer
        for i, it in enumerate(items):
            if writer.missing(i):
                writer.write(i, storage.byte_view(it.array))
        error, pending.error = pending.error, None      # the aggregator's: its node file was not laid out
        checksums = None if pending.checksums_known else {it.name: it.checksum for it in items}
        with watch("the other ranks of this node (MPI_Gather of the pfs checksums)"):
            node_sums = None if checksums is None else self.node_comm.gather(
                {it.name: it.checksum for i, it in enumerate(items) if i in writer.targets}, root=0)
        node = None
        if self.is_aggregator and error is None:
            try:
                node = self._node_metadata(pending, node_sums)
            except Exception as e:  # noqa: BLE001 - raised below, after the gathers
                error = e
        with watch("the other ranks (MPI_Gather of the pfs node files' metadata)"):
            sums = None if checksums is None else self.comm.gather(checksums, root=0)
            nodes = self.comm.gather((self.node, node) if self.is_aggregator else None, root=0)
        index = None
        if self.rank == 0 and all(n is None or n[1] is not None for n in nodes):     # else a node failed
            try:
                index = self._master(pending, sums, sorted(n for n in nodes if n is not None))
            except Exception as e:  # noqa: BLE001 - raised below
                error = error or e
        error = writer.close() or error
        with watch("the other ranks of this node (MPI_Allreduce: did a pfs write fail)"):
            failed = self.node_comm.allreduce(error is not None)
        if self.is_aggregator and not failed:
            try:
                storage.fsync_file(writer.path)
            except OSError as e:
                error = e
        if error is not None:
            raise error          # KeyboardInterrupt / SystemExit of a test fault in the writer thread too
        return index

    def _node_metadata(self, pending, node_sums):
        """Local (aggregator): the checksums ``node_sums`` (rank order, None: begin() had them)
        into the node file; its (size, (metadata extents, their checksum))."""
        path = pending.writer.path
        if node_sums is not None:
            files.set_checksums(path, dict(zip(self.node_ranks, node_sums)))
        st = os.stat(path)
        extents = tuple(files.metadata_extents(st.st_size, pending.data_ranges))
        checksum = files.extents_digest(path, extents)
        self._written.pop((st.st_dev, st.st_ino), None)        # newest last
        self._written[(st.st_dev, st.st_ino)] = (st.st_size, extents, checksum)
        while len(self._written) > 64:                # the node files of the kept steps, and more
            del self._written[next(iter(self._written))]
        return st.st_size, (extents, checksum)

    def _master(self, pending, sums, nodes):
        """Local (rank 0): the step's index with every rank's checksums (``sums``, None: it had
        them) and the node files (``nodes``: (node, (size, metadata))), and its master file."""
        index = pending.index if sums is None else _with_checksums(pending.index, sums)
        index = dataclasses.replace(index, files={lay.node_file(n): size for n, (size, _) in nodes},
                                    node_metadata={lay.node_file(n): meta for n, (_, meta) in nodes})
        master = os.path.join(pending.tmp, MASTER)
        files.write_master(master, index, self.cfg.file_mode)
        return dataclasses.replace(index, master_checksum=files.file_digest(master))

    def _commit(self, tmp, index, renamed):
        """Local (rank 0): make the step durable and visible (``renamed[0]`` once renamed)."""
        storage.fsync_dir(tmp)
        faults.hit("pfs-commit", self.rank, index.step)
        final = self.step_dir(index.step)
        if os.path.islink(final):             # never follow a planted link out of the pfs dir
            os.unlink(final)
        if os.path.lexists(final):            # a step of an abandoned attempt: uncommit, then replace
            storage.remove_file(os.path.join(final, MARKER))
            storage.fsync_dir(final)
            self._remove_tree(final)
        os.rename(tmp, final)
        renamed[0] = True
        storage.fsync_dir(self.root)
        faults.hit("pfs-renamed", self.rank, index.step)
        storage.atomic_write_json(os.path.join(final, MARKER), index.to_json(), self.cfg.file_mode)

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

    # ------------------------------------------------------------------ restore / verify
    def restore(self, step, protected, state=None, layouts=None):
        """Collective: fill ``protected`` (a list of (name, ndarray, Layout), in place) and the
        ``state`` dict from committed step ``step``. ``layouts``: the layouts declared now for
        state keys (a Block gives the box each rank reads). Every rank first checks that its
        arrays and state fit and that the checksums of the blocks read hold; only when every rank
        succeeded is anything filled."""
        index, doc0 = self._load(step, with_document=True)
        step_dir = self.step_dir(index.step)
        reader = pfs_check.BlockReader(step_dir, index, self.chunk)
        try:
            with Collective(self.comm, f"restoring pfs step {step}: checking the arrays and state"):
                targets, plan = self._plan(index, doc0, reader, protected, state, layouts or {})
            boxes = [(i, src) for i, mode, src, _ in targets if mode == "box"]
            all_boxes = self.comm.allgather(boxes) if any(e.layout in GLOBAL_LAYOUTS for e in index.arrays) else None
            with Collective(self.comm, f"restoring pfs step {step}: verifying checksums"):
                for i, q in self._verify_share(index, targets, all_boxes):
                    reader.verify(i, q)
            with Collective(self.comm, f"restoring pfs step {step}: reading"):
                for i, mode, src, array in targets:
                    self._fill(reader, index.arrays[i], mode, src, array)
                plan.apply()
        finally:
            reader.close()
        if self.rank == 0:
            self._warn_if_master_damaged(step_dir, index)

    @staticmethod
    def _warn_if_master_damaged(step_dir, index):
        """Local (rank 0, after a restore, which reads only the node files): say so when the
        step's master file, the way HDF5 tools open it, is missing or does not match its checksum."""
        path = os.path.join(step_dir, MASTER)
        try:
            pfs_check.regular_file(path)
            ok = files.file_digest(path) == index.master_checksum
        except (HpcCkptError, OSError):
            ok = False
        if not ok:
            log.warning("pfs step %d was restored from its node files, but its master file %s is missing or damaged "
                        "(HDF5 tools open the step through it; `hpcckpt verify` names the damage)", index.step, path)

    def _plan(self, index, doc0, reader, protected, state, layouts):
        """Local: [(array index, "block"|"box", source rank or (offset, shape), target array)]
        and the state Plan. MismatchError / IncompatibleCheckpointError when they do not fit."""
        where = f"pfs step {index.step}"
        same = index.world_size == self.size
        pos = {e.name: i for i, e in enumerate(index.arrays)}
        targets, names = [], set()
        for name, array, layout in protected:
            if name not in pos:
                raise MismatchError(f"{where}: protected {[name]} is not in the checkpoint")
            e = index.arrays[pos[name]]
            if not isinstance(array, np.ndarray) or not array.flags.writeable:
                raise ProtectError(f"array {name!r}: expected a writeable NumPy array")
            if array.dtype.str != e.dtype:
                raise MismatchError(f"{where}, array {name!r}: the checkpoint holds dtype {e.dtype}, the array "
                                    f"is {array.dtype.str}")
            mode, src, shape = self._source(index, e, same, layout if layout.kind == "block" else None,
                                            tuple(array.shape), where)
            if tuple(array.shape) != shape:
                raise MismatchError(f"{where}, array {name!r}: the checkpoint holds shape {shape} for rank "
                                    f"{self.rank}, the array is {tuple(array.shape)}")
            targets.append((pos[name], mode, src, array))
            names.add(name)
        plan = st.Plan([], [])
        doc_names = set()
        if st.STATE_ENTRY in pos:
            items = self._state_items(index, doc0, reader, pos, same, state, where)
            shapes = {}
            for key, enc in items.items():
                for name in st.array_refs(enc):
                    if name not in pos:
                        raise CorruptCheckpointError(f"{where}: the state document refers to {name!r}, not in it")
                    e = index.arrays[pos[name]]
                    declared = layouts.get(key) if name == key else None
                    current = state.get(key) if name == key else None
                    want = tuple(current.shape) if isinstance(current, np.ndarray) else None
                    mode, src, shape = self._source(index, e, same, declared if declared and declared.kind == "block"
                                                    else None, want, where)
                    shapes[name] = (shape, e.dtype)
                    doc_names.add(name)
            plan = st.plan_restore(state, items, shapes, where)
            for name, array in plan.reads:
                e = index.arrays[pos[name]]
                key = name.split(".")[0]
                declared = layouts.get(key) if name == key else None
                mode, src, _ = self._source(index, e, same, declared if declared and declared.kind == "block" else None,
                                            tuple(array.shape), where)
                targets.append((pos[name], mode, src, array))
        elif state:
            raise MismatchError(f"{where}: the checkpoint holds no state dict, but restart() was given one with "
                                f"{sorted(state)[:8]}")
        def belongs(e):    # arrays this rank would restore
            if e.layout == "rank":
                return same and e.blocks[self.rank] is not None
            return e.layout != "root" or self.rank == 0
        orphans = sorted(e.name for e in index.arrays if belongs(e) and e.name not in names
                         and e.name not in doc_names and e.name != st.STATE_ENTRY)
        if orphans:
            raise MismatchError(f"{where}: the checkpoint has {orphans[:8]} which are not protected")
        return targets, plan

    def _state_items(self, index, doc0, reader, pos, same, state, where):
        """Local: the encoded state items this rank restores ({key: encoded value})."""
        if state is None:
            raise MismatchError(f"{where}: the checkpoint holds a state dict: pass restart(state=...)")
        if same:
            e = index.arrays[pos[st.STATE_ENTRY]]
            if e.blocks[self.rank] is None:
                raise MismatchError(f"{where}: rank {self.rank} checkpointed no state dict")
            if self.rank == 0:
                doc = doc0
            else:
                doc = st.parse_document(reader.read_verified(pos[st.STATE_ENTRY], self.rank).tobytes(),
                                        f"{where}, rank {self.rank}")
            items = dict(doc["items"])
            for key, kind in index.state_keys.items():   # shared values come from rank 0
                if kind == "replicated":
                    items[key] = doc0["items"][key]
            return items
        per_rank = sorted(k for k, kind in index.state_keys.items() if kind == "rank")
        if per_rank:
            raise IncompatibleCheckpointError(
                f"{where} was written by {index.world_size} ranks, this job has {self.size}, and the state values "
                f"{per_rank[:8]} are per rank (no layout); declare ckpt.layout(name, ...) (ROWS, REPLICATED, ROOT or "
                "Block) before checkpointing to restart on another rank count, or restart on "
                f"{index.world_size} ranks")
        items = {}
        for key, kind in index.state_keys.items():
            if kind in GLOBAL_LAYOUTS:
                items[key] = {"$array": key}
            elif kind == "replicated" or (kind == "root" and self.rank == 0):
                items[key] = doc0["items"][key]
        return items

    def _source(self, index, e, same, block, want, where):
        """Local: how this rank reads entry ``e``: ("block", source rank, shape) or ("box",
        (offset, shape), shape). ``block``: the Block layout declared now; ``want``: the shape of
        the array that will receive it (None if unknown)."""
        if e.layout in SHARED_LAYOUTS:
            return "block", 0, e.blocks[0].shape
        if e.layout == "rank":
            if not same:
                raise IncompatibleCheckpointError(
                    f"{where} was written by {index.world_size} ranks, this job has {self.size}, and array {e.name!r} "
                    "is per rank (no layout); only values with a layout (Block, ROWS, REPLICATED, ROOT) restart on "
                    "another rank count")
            b = e.blocks[self.rank]
            if b is None:
                raise MismatchError(f"{where}: rank {self.rank} has no {e.name!r} in the checkpoint")
            return "block", self.rank, b.shape
        if block is not None:
            if block.global_shape != e.global_shape:
                raise MismatchError(f"{where}, array {e.name!r}: the checkpoint holds global shape {e.global_shape}, "
                                    f"the layout declared now says {block.global_shape}")
            shape = want if want is not None else None
            if shape is None:
                raise MismatchError(f"{where}, array {e.name!r}: a Block layout needs an array of the block's shape "
                                    "in the state dict")
            mf.check_global_layout(shape, block.global_shape, block.offset,
                                   lambda msg: MismatchError(f"array {e.name!r}: {msg}"))
            return "box", (tuple(block.offset), shape), shape
        if same:
            b = e.blocks[self.rank]
            return "box", (tuple(b.offset), tuple(b.shape)), tuple(b.shape)
        if e.layout == "rows":
            total, rest = e.global_shape[0], tuple(e.global_shape[1:])
            share, extra = divmod(total, self.size)
            n = share + (1 if self.rank < extra else 0)
            start = self.rank * share + min(self.rank, extra)
            shape = (n,) + rest
            return "box", ((start,) + (0,) * len(rest), shape), shape
        raise MismatchError(f"{where}, array {e.name!r}: restarting on another rank count needs this rank's block: "
                            "declare its Block(global_shape, offset) (protect(..., global_shape=, offset=) or "
                            "ckpt.layout) for the new decomposition")

    def _verify_share(self, index, targets, all_boxes):
        """Local: the (array index, writer rank) blocks this rank verifies: its own blocks that it
        reads whole; on rank 0, rank 0's block of every replicated or root array (read by many
        ranks, verified once); and the blocks of global arrays assigned to it among their readers
        (the rank that reads most of a block verifies it)."""
        share = {(i, src) for i, mode, src, _ in targets if mode == "block" and src == self.rank}
        if self.rank == 0:
            share |= {(i, 0) for i, e in enumerate(index.arrays) if e.layout in SHARED_LAYOUTS}
        if all_boxes is not None:
            for i, e in enumerate(index.arrays):
                boxes = [[box for j, box in rank_boxes if j == i] for rank_boxes in all_boxes]
                if e.layout not in GLOBAL_LAYOUTS or not any(boxes):
                    continue
                empty = ((0,) * len(e.global_shape), (0,) * len(e.global_shape))
                verifier = lay.assign_verifiers([(b.offset, b.shape) for b in e.blocks],
                                                [b[0] if b else empty for b in boxes])
                share |= {(i, q) for q in range(index.world_size) if verifier[q] == self.rank}
        return sorted(share)

    def _fill(self, reader, e, mode, src, array):
        """Local: read one target's bytes (after every rank verified)."""
        if mode == "block":
            tmp = array if array.flags.c_contiguous else np.empty(array.shape, array.dtype)
            fd, path, off, nbytes = reader.source(src, e.name)
            dst = storage.byte_view(tmp)
            for start in range(0, dst.nbytes, self.chunk):
                storage.pread_into(fd, dst[start:start + self.chunk], off + start, path)
            if tmp is not array:
                np.copyto(array, tmp)
            return
        goffset, shape = src
        tmp = array if array.flags.c_contiguous else np.empty(array.shape, array.dtype)
        old = [(b.offset, b.shape) for b in e.blocks]
        for q, src_off, dst_off, ext in lay.read_plan(goffset, shape, old):
            fd, path, base, _ = reader.source(q, e.name)
            self._copy_box(fd, path, base, e.blocks[q].shape, src_off, tmp, dst_off, ext)
        if tmp is not array:
            np.copyto(array, tmp)

    def _copy_box(self, fd, path, base, src_shape, src_off, array, dst_off, ext):
        """Local: copy the box ``ext`` at ``src_off`` of a C-order block stored at file offset
        ``base`` into ``array`` at ``dst_off``."""
        itemsize = array.dtype.itemsize
        src_run = lay.contiguous_run(src_shape, src_off, ext)
        dst_run = lay.contiguous_run(array.shape, dst_off, ext)
        if src_run is not None and dst_run is not None:
            dst = storage.byte_view(array)[dst_run[0] * itemsize:(dst_run[0] + dst_run[1]) * itemsize]
            for start in range(0, dst.nbytes, self.chunk):
                storage.pread_into(fd, dst[start:start + self.chunk], base + src_run[0] * itemsize + start, path)
            return
        # general case: read whole rows (axis 0) of the source block a few at a time, copy the box
        row = lay.volume(src_shape[1:]) * itemsize
        per = max(1, self.chunk // max(row, 1))
        inner = tuple(slice(o, o + n) for o, n in zip(src_off[1:], ext[1:]))
        scratch = np.empty(per * row, np.uint8)
        for r0 in range(0, ext[0], per):
            rows = min(per, ext[0] - r0)
            piece = scratch[:rows * row]
            storage.pread_into(fd, piece, base + (src_off[0] + r0) * row, path)
            src = piece.view(array.dtype).reshape((rows,) + tuple(src_shape[1:]))[(slice(None),) + inner]
            dst_index = (slice(dst_off[0] + r0, dst_off[0] + r0 + rows),) + \
                tuple(slice(o, o + n) for o, n in zip(dst_off[1:], ext[1:]))
            array[dst_index] = src

    def verify(self, step):
        """Collective: re-check every checksum of ``step`` (each rank a share; rank 0 also checks
        the master file); CorruptCheckpointError on every rank on damage."""
        index = self._load(step)
        reader = pfs_check.BlockReader(self.step_dir(index.step), index, self.chunk)
        try:
            with Collective(self.comm, f"verifying pfs step {step}"):
                k = 0
                for i, e in enumerate(index.arrays):
                    for q in e.holders():
                        if k % self.size == self.rank:
                            reader.verify(i, q)
                        k += 1
                if self.rank == 0:
                    pfs_check.check_master(self.step_dir(index.step), index)
        finally:
            reader.close()

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


@dataclasses.dataclass
class PendingStep:
    """A pfs step between PfsStore.begin and finish: its temporary directory, rank 0's index,
    the bytes this rank writes, and this rank's NodeWriter."""
    step: int
    tmp: str
    index: Index
    nbytes: int
    checksums_known: bool
    writer: "NodeWriter" = None
    data_ranges: list = None      # the aggregator's: (offset, nbytes) of each dataset's bytes in the node file
    error: BaseException = None   # the aggregator's: why its node file could not be laid out

    def check(self):
        """Local, inside an agreement: raise the error that kept this node's file from being laid out."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def write(self, i, final):
        """Local: ``final`` is a prefix of item ``i``'s bytes that will not change (the cache
        write's on_chunk: the bytes in the mapped cache file, or in the array while a new cache
        file is written): it goes to the node file while the rest is written."""
        self.writer.write(i, final, early=True)

    def drain(self):
        """Local: wait until what was handed over is written (before its memory goes away)."""
        self.writer.close()

    def incomplete(self):
        """Local: True when some of this rank's bytes were not handed over yet."""
        return any(self.writer.missing(i) for i in self.writer.targets)


class NodeWriter:
    """Local: one rank's writes into its node file, in a thread of their own. ``targets``:
    {item number: (file offset, nbytes)}. Large parts go with direct I/O when ``direct``: from
    their own memory when it is aligned, else through ``bounce`` (storage.write_pieces_at).
    ``close()`` waits for what was handed over and returns the first error (an exception, or
    None); handing over more starts the thread again."""

    def __init__(self, path, targets, piece, direct, fault=None, bounce=None):
        self.path, self.targets, self.piece, self.direct, self.fault = path, targets, piece, direct, fault
        self.bounce = bounce      # for bytes whose address is not aligned (storage.write_pieces_at)
        self.given = {}               # item number -> bytes handed over so far
        self.error = None
        self._queue = self._thread = None

    def missing(self, i):
        """True when item ``i`` is this rank's and not all of its bytes were handed over."""
        return i in self.targets and self.given.get(i, 0) < self.targets[i][1]

    def write(self, i, data, early=False):
        """Hand over the bytes of item ``i`` that ``data`` (a uint8 view of its first bytes) adds.
        ``early``: more will follow; hand over only whole ``piece``s (DIRECT_ALIGN-aligned
        ends) until ``data`` is the whole item."""
        if i not in self.targets:
            return
        at, nbytes = self.targets[i]
        start, end = self.given.get(i, 0), data.nbytes
        if early and end < nbytes:
            end = end // storage.DIRECT_ALIGN * storage.DIRECT_ALIGN
            if end - start < self.piece:
                return
        if end <= start:
            return
        if self._thread is None:
            import queue
            import threading
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="hpcckpt-pfs-write", daemon=True)
            self._thread.start()
        self._queue.put((data[start:end], at + start))
        self.given[i] = end

    def _run(self):
        fd = direct = None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
            direct = storage.open_direct(self.path) if self.direct else None
            while (job := self._queue.get()) is not None:
                if self.error is None:
                    direct = storage.write_pieces_at(fd, direct, job[0], job[1], self.piece, self.fault, self.bounce)
                del job
        except BaseException as e:   # noqa: BLE001 - close() hands it to the caller (a test fault's exit too)
            self.error = self.error or e
        finally:
            for f in (fd, direct):
                if f is not None:
                    os.close(f)

    def close(self):
        if self._thread is not None:
            self._queue.put(None)
            with watch("this rank's pfs writer thread (writing %s)", self.path):
                self._thread.join()
            self._thread = self._queue = None      # what a failed thread left queued is released
        return self.error


def _with_checksums(index, sums):
    """Local (rank 0): ``index`` with every block's checksum from ``sums`` [{name: checksum}
    per rank]."""
    arrays = []
    for e in index.arrays:
        blocks = tuple(None if b is None else dataclasses.replace(b, checksum=sums[r][e.name])
                       for r, b in enumerate(e.blocks))
        arrays.append(dataclasses.replace(e, blocks=blocks))
    return dataclasses.replace(index, arrays=tuple(arrays))


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


def _entries(metas, size, partial):
    """Local: the index entries from per-rank descriptions (None: that rank's not known, when
    ``partial``: an aggregator laying out its node file). Rank 0 (``partial`` False) also checks
    that the ranks agree and that global blocks tile their global shape, and places rows."""
    order, table = [], {}
    for r, meta in enumerate(metas):
        for name, dtype, shape, kind, gshape, goffset, checksum in meta or ():
            if name not in table:
                order.append(name)
                table[name] = (dtype, kind, [None] * size)
            t_dtype, t_kind, blocks = table[name]
            if (dtype, kind) != (t_dtype, t_kind):
                raise ProtectError(f"array {name!r}: the ranks disagree on its dtype or layout (rank {r}: {dtype} "
                                   f"{kind}; a lower rank: {t_dtype} {t_kind})")
            blocks[r] = (shape, gshape, goffset, checksum)
    entries = []
    for name in order:
        dtype, kind, blocks = table[name]
        gshape = None
        if kind in GLOBAL_LAYOUTS and not partial:
            missing = [r for r, b in enumerate(blocks) if b is None]
            if missing:
                raise ProtectError(f"array {name!r} has a {kind} layout but ranks {missing[:8]} do not hold it; "
                                   "every rank must (an empty block is fine)")
        if kind == "block":
            gshapes = {b[1] for b in blocks if b is not None}
            if len(gshapes) != 1:
                raise ProtectError(f"array {name!r}: the ranks disagree on the global shape ({sorted(map(str, gshapes))[:4]})")
            (gshape,) = gshapes
            out = [None if b is None else Block(b[0], b[2], b[3]) for b in blocks]
            if not partial:
                problem = lay.tiling_problem(gshape, [(b.offset, b.shape) for b in out])
                if problem:
                    raise ProtectError(f"array {name!r}: the ranks' blocks do not tile the global shape {gshape}: "
                                       f"{problem}")
        elif kind == "rows" and not partial:
            rest = {b[0][1:] for b in blocks}
            if len(rest) != 1:
                raise ProtectError(f"array {name!r}: a ROWS layout needs the same row shape on every rank "
                                   f"(found {sorted(map(str, rest))[:4]})")
            (rest,) = rest
            out, start = [], 0
            for shape, _, _, checksum in blocks:
                out.append(Block(shape, (start,) + (0,) * len(rest), checksum))
                start += shape[0]
            gshape = (start,) + rest
        else:   # rank, replicated, root; rows on an aggregator (it needs no global placement)
            out = [None if b is None else Block(b[0], None, b[3]) for b in blocks]
        entries.append(Entry(name, dtype, kind, gshape, tuple(out)))
    return entries
