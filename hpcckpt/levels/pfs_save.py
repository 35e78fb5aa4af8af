"""The pfs level's save protocol: ``PfsSave``, the methods of PfsStore that write a step (a mixin:
they use the attributes PfsStore.__init__ sets), and ``PendingStep``, a step between ``begin`` and
``finish``.

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
"""
import dataclasses
import logging
import os
import shutil
import time

import numpy as np

from .. import faults, manifest as mf, storage
from ..comm import Collective
from ..watchdog import watch
from ..errors import CheckpointWriteError, CorruptCheckpointError, HpcCkptError, ProtectError
from . import hdf5_layout as lay
from . import pfs_files as files
from .pfs_index import MARKER, MASTER, SHARED_LAYOUTS, Index, id_ok
from .pfs_items import index_entries, with_checksums
from .pfs_writer import WRITE_PIECE, NodeWriter

log = logging.getLogger("hpcckpt")


class PfsSave:
    """PfsStore's save: ``save`` = ``begin`` then ``finish``; ``abandon`` gives a begun step up."""

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
                    node_index = self._index(step, ckpt_id, epoch, index_entries(metas, self.size, partial=True), {})
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
        entries = index_entries(metas, self.size, partial=False)
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
        index = pending.index if sums is None else with_checksums(pending.index, sums)
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
