"""The pfs level's read path: ``PfsRestore``, the methods of PfsStore that read a committed step
back (a mixin: they use the attributes PfsStore.__init__ sets): ``restore`` (the N→M placement,
reading the node files) and ``verify``.

Restore, collective: rank 0 reads and checks the index (and rank 0's state document); every
rank plans what it reads — its own blocks on the same rank count, a box of each global array
(block and rows layouts) on any rank count, rank 0's block of replicated and root values — and
checks that its arrays and state fit (MismatchError / IncompatibleCheckpointError, naming the
values); the blocks read are verified against their checksums (each by one reader); only then
is anything filled.
"""
import logging
import os

import numpy as np

from .. import manifest as mf, state as st, storage
from ..comm import Collective
from ..errors import CorruptCheckpointError, HpcCkptError, IncompatibleCheckpointError, MismatchError, ProtectError
from . import hdf5_layout as lay
from . import pfs_check, pfs_files as files
from .pfs_index import GLOBAL_LAYOUTS, MASTER, SHARED_LAYOUTS

log = logging.getLogger("hpcckpt")


class PfsRestore:
    """PfsStore's reading back of committed steps: ``restore`` and ``verify``."""

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
