"""The node-local level: one data file and one manifest per rank per step in the node's cache.

Layout (docs/FORMAT.md): ``<cache_dir>/<name>/step_<S>/rank_<R>.dat`` and ``rank_<R>.json``;
``<cache_dir>/<name>/spare/rank_<R>.dat`` (and ``rank_<R>.dat.<i>``, one more per redundant level
of the job) hold retired data files kept for overwriting, and
``spare/trash_<R>_*`` retired files not kept, until a background thread has unlinked them. All
methods are local: the Checkpointer runs the agreement between ranks.
"""
import dataclasses
import logging
import mmap
import os
import time
import uuid

import numpy as np

from .. import data_file, faults, manifest as mf, state as st, storage
from ..config import expand_cache_dir
from .base import Level
from .registry import level_class, register
from ..errors import CheckpointWriteError, CorruptCheckpointError, IncompatibleCheckpointError

log = logging.getLogger("hpcckpt")


@dataclasses.dataclass
class Found:
    """One rank's manifest of one step: ``state`` "ok" (usable by this job), "incompatible" (of
    another job, rank count or placement, or a newer format: never deleted) or "damaged"."""
    step: int
    state: str
    manifest: mf.RankManifest = None
    reason: str = ""

    @property
    def key(self):
        """Ordering key (epoch, step) of a parsed manifest; None when unparsable."""
        return self.manifest.key if self.manifest is not None else None


def step_dirs(root):
    """Local: the steps of the step directories under the cache job directory ``root``,
    ascending (OSError when it cannot be listed). A symbolic link is never ours: following it
    would read, or retire (delete), files outside the cache directory."""
    return sorted(s for name in os.listdir(root) if (s := mf.parse_step_dir_name(name)) is not None
                  and not os.path.islink(os.path.join(root, name)))


def _has_step_dirs(root):
    try:
        return bool(step_dirs(root))
    except OSError:
        return False


class LocalCache:
    """This rank's files in its node's cache directory."""

    def __init__(self, cfg, topo, spares=1):
        self.cfg, self.rank, self.node, self.world_size = cfg, topo.rank, topo.node, topo.size
        # retired data files kept for overwriting (reuse_files): one, and one more per redundant
        # level the job uses (the step it keeps retires together with an older one)
        self.spares = max(1, int(spares))
        self.placement = mf.placement_digest(topo.node_of)
        self.abandoned_after = None     # restart(): the step it took when newer ones were of another layout
        self.root = os.path.join(expand_cache_dir(cfg, topo.node), cfg.name)
        self._buffer = None
        # the mappings of the data files in rotation (reuse_files: the kept steps and the spare;
        # with incremental also the base of the incremental steps, read by the xor/rs delta)
        self.mappings = data_file.Mappings(cfg.keep + 1 + self.spares + bool(cfg.incremental)) \
            if cfg.reuse_files else None
        self.block_digests = None    # (step, block, digests) of the last write (incremental, levels/delta.py)
        self._odd_spare_told = False  # warned that the spare path is not a regular file
        self._deleter = storage.Deleter("hpcckpt-cache-remove")   # unlinks retired large files (_discard)

    # ------------------------------------------------------------------ paths
    def step_dir(self, step):
        return os.path.join(self.root, mf.step_dir_name(step))

    def data_path(self, step):
        return os.path.join(self.step_dir(step), mf.data_file_name(self.rank))

    def manifest_path(self, step):
        return os.path.join(self.step_dir(step), mf.manifest_file_name(self.rank))

    def held_dir(self, step):
        """Where this rank keeps redundancy for others (partner copies, parity) for ``step``."""
        return os.path.join(self.step_dir(step), mf.held_dir_name(self.rank))

    @property
    def spare_dir(self):
        """Where retired files wait to be overwritten or unlinked; only ever used as a directory
        of its own (storage.own_dir, storage.is_own_dir): never through a link planted there."""
        return os.path.join(self.root, "spare")

    @property
    def spare_path(self):
        return os.path.join(self.spare_dir, mf.data_file_name(self.rank))

    def keep_spares(self, spares):
        """Local: keep up to ``spares`` retired data files (one, and one more per redundant level
        the job has used: save.checkpoint raises it as levels come into use), and as many more
        mappings open."""
        if spares > self.spares:
            if self.mappings is not None:
                self.mappings.limit += spares - self.spares
            self.spares = spares

    def spare_paths(self):
        """Local: the paths of this rank's data-file spares (``spares`` of them; the first is
        ``spare_path``)."""
        return [self.spare_path] + [f"{self.spare_path}.{i}" for i in range(1, self.spares)]

    def held_spare_path(self, name):
        """Where a retired file ``name`` of this rank's held directory waits to be overwritten."""
        return os.path.join(self.spare_dir, f"held_{self.rank:06d}_{name}")

    def reuse_held_spare(self, path):
        """Local: before writing held file ``path``, move the retired file of the same name there
        (``reuse_files``); the caller overwrites it in place and truncates it to its size, which
        on tmpfs is much faster than a new file."""
        spare = self.held_spare_path(os.path.basename(path))
        if self.cfg.reuse_files and not os.path.lexists(path) and storage.is_own_dir(self.spare_dir) \
                and os.path.isfile(spare) and not os.path.islink(spare):
            os.replace(spare, path)

    def _keep_as_spare(self, path, spare):
        """Move retired file ``path`` to ``spare`` (``reuse_files``) unless a spare is already
        kept there; True when moved."""
        if not self.cfg.reuse_files or os.path.islink(path) or not os.path.isfile(path):
            return False
        storage.own_dir(self.spare_dir, self.cfg.dir_mode)
        if os.path.lexists(spare):
            return False
        os.replace(path, spare)
        return True

    def _discard(self, path):
        """Move retired file ``path`` into ``spare/`` under a name of its own and unlink it there in
        a background thread: freeing a large file's pages on tmpfs takes milliseconds that the
        checkpoint need not wait for. A crash leaves it to prepare()."""
        trash = os.path.join(self.spare_dir, f"trash_{self.rank:06d}_{uuid.uuid4().hex[:12]}")
        try:
            storage.own_dir(self.spare_dir, self.cfg.dir_mode)
            os.replace(path, trash)
        except FileNotFoundError:
            return
        except OSError:
            storage.remove_file(path)
            return
        self._deleter.remove(trash)

    def prepare(self):
        """Create the cache directory (local); remove this rank's trash that a crash left."""
        storage.makedirs(self.root, self.cfg.dir_mode)
        for path in self._in_spare(f"trash_{self.rank:06d}_"):
            storage.remove_file(path)

    def _in_spare(self, *prefixes):
        """Local: the paths in ``spare/`` whose names start with one of ``prefixes`` (this rank's)."""
        spare = self.spare_dir
        if not storage.is_own_dir(spare):
            return []
        return [os.path.join(spare, name) for name in os.listdir(spare) if name.startswith(prefixes)]

    # ------------------------------------------------------------------ save
    def write(self, step, ckpt_id, level, epoch, items, pipe=None):
        """Write this rank's arrays for ``step`` (not yet committed); return its RankManifest.

        ``items`` is a list of (name, C-contiguous array, hpcckpt.state.Layout). A committed
        manifest of another job or placement at this step is never written over. ``pipe`` (a
        sync pfs step's PendingStep) is given each array's bytes as they are copied (from the
        arrays, or from the mapped file): drained here only when that mapping is closed at the
        end (not kept), else by the pfs step's finish, so that the rest of the step's protocol
        runs while the bytes go to disk.
        """
        if os.path.islink(self.step_dir(step)):
            os.unlink(self.step_dir(step))   # never write (or uncommit) through a planted link
        if os.path.islink(self.data_path(step)):
            os.unlink(self.data_path(step))  # a planted link would make every later write fail
        found = self.examine(step)
        if found is not None and self.abandoned(found):
            # this job's step on another layout, newer than the restart's; its directory stays:
            # the other ranks of this node write theirs into it now (an rmdir of it, empty for a
            # moment, made a rank's write fail with ENOENT)
            self.retire(step, keep_dir=True)
        elif found is not None and found.state == "incompatible":
            raise CheckpointWriteError(f"step {step} in {self.root} holds a checkpoint this job cannot use "
                                       f"({found.reason}); it is kept: use another name, remove it, or set "
                                       "start = 'fresh'")
        self.uncommit(step)  # a leftover of an abandoned run with the same step number
        storage.makedirs(self.step_dir(step), self.cfg.dir_mode)
        path = self.data_path(step)
        reuse = None
        if self.cfg.reuse_files and not os.path.exists(path) and storage.is_own_dir(self.spare_dir):
            for spare in self.spare_paths():
                if not os.path.lexists(spare):
                    continue
                if os.path.isfile(spare) and not os.path.islink(spare):
                    reuse = spare
                    break
                if not self._odd_spare_told:    # a directory or link put there: never renamed into the step
                    self._odd_spare_told = True
                    log.warning("rank %d: %s is not a regular file: not reused (reuse_files); remove it", self.rank,
                                spare)
        chunks = sum(-(-a.nbytes // self.cfg.io_chunk) for _, a, _ in items)
        fault = faults.HalfWay("write", self.rank, step, max(1, chunks // 2)) if faults.active() else None
        self.block_digests = None
        arrays = [(n, a) for n, a, _ in items]
        digester = None
        if self.cfg.incremental and level_class(level).redundant:   # digested as the arrays are copied
            from .delta import BlockDigester
            digester = BlockDigester(arrays, self.cfg.incremental_block)

        def on_chunk(i, final, source):
            if digester is not None:
                digester.chunk(i, final, source)
            if pipe is not None:
                pipe.write(i, final if final is not None else source)

        def on_written(file_bytes):
            if digester is not None:
                self.block_digests = (step, self.cfg.incremental_block, digester.finish(file_bytes))
            if pipe is not None and self.mappings is None and not isinstance(file_bytes, data_file.FileBytes):
                pipe.drain()        # the mapping it reads is closed next; else the pfs step's finish waits
        hooked = digester is not None or pipe is not None
        entries, size = data_file.write_arrays(path, arrays, self.cfg.io_chunk, self.cfg.file_mode,
                                               self.cfg.cache_fsync, reuse, fault, self.cfg.write_method,
                                               on_written if hooked else None, on_chunk if hooked else None,
                                               self.mappings)
        table = []
        for (name, array, layout), (_, offset, nbytes, checksum) in zip(items, entries):
            table.append(mf.ArrayEntry(name, array.dtype.str, tuple(array.shape), offset, nbytes, checksum,
                                       layout.global_shape, layout.offset, layout.kind))
        return mf.RankManifest(name=self.cfg.name, world_size=self.world_size, rank=self.rank, node=self.node,
                               step=step, level=level, ckpt_id=ckpt_id, created=time.time(),
                               data_file=mf.data_file_name(self.rank), data_size=size, arrays=tuple(table),
                               epoch=epoch, placement=self.placement)

    def close(self):
        """Local: drop the kept mappings (data_file.Mappings); wait for the background unlinks."""
        if self.mappings is not None:
            self.mappings.close()
        self._deleter.wait()

    def remove_spares(self):
        """Local: remove this rank's spare files (``reuse_files``: the retired data file, partner
        copies and parity kept for overwriting), after close(): a closed Checkpointer does not
        keep a checkpoint's worth of node memory for a run that may never come."""
        for path in self._in_spare(mf.data_file_name(self.rank), f"held_{self.rank:06d}_"):
            try:
                storage.remove_file(path)
            except OSError as e:
                log.warning("rank %d: could not remove the spare %s: %s", self.rank, path, e)

    def commit(self, manifest):
        """Write the manifest atomically: from now on this rank's part of the step exists."""
        storage.atomic_write_json(self.manifest_path(manifest.step), manifest.to_json(), self.cfg.file_mode)

    def uncommit(self, step):
        """Remove this rank's manifest of ``step`` (the data stays, reusable)."""
        storage.remove_file(self.manifest_path(step))

    def abandoned(self, found):
        """Local: whether ``found`` is a step of this job written on another rank count or
        placement that a restart from an older step (``abandoned_after``, set by restart())
        left behind: this run replaces it when it checkpoints the same step number."""
        return (self.abandoned_after is not None and found.state == "incompatible" and found.manifest is not None
                and found.manifest.name == self.cfg.name and found.step > self.abandoned_after)

    # ------------------------------------------------------------------ scan / restore
    def steps_on_disk(self):
        """Every step directory under the cache root (committed or not), ascending."""
        try:
            return step_dirs(self.root)
        except FileNotFoundError:
            return []

    def examine(self, step):
        """This rank's manifest of ``step`` as a Found record, or None when there is none."""
        path = self.manifest_path(step)
        if not os.path.lexists(path):
            return None
        try:
            m = mf.parse(storage.read_json(path), path)
        except IncompatibleCheckpointError as e:      # a newer format version
            return Found(step, "incompatible", reason=str(e))
        except (CorruptCheckpointError, OSError) as e:
            return Found(step, "damaged", reason=str(e))
        if m.step != step or m.rank != self.rank:
            return Found(step, "damaged", reason=f"{path}: describes step {m.step} rank {m.rank}")
        reason = mf.foreign_reason(m, path, self.cfg.name, self.world_size, self.node, self.placement)
        if reason is not None:
            return Found(step, "incompatible", m, reason)
        return Found(step, "ok", m)

    def scan(self):
        """This rank's manifests, one Found record per step directory that has one, ascending."""
        return [f for f in map(self.examine, self.steps_on_disk()) if f is not None]

    def why_unusable(self, found):
        """Local: why this rank's cache holds checkpoints but none this job can use, for a message
        (``found``: :meth:`scan`'s records); None when it holds none at all."""
        unusable = [f for f in found if f.state != "ok"]
        if unusable:
            return f"{len(unusable)} checkpoint(s) here are not usable ({unusable[-1].state}: {unusable[-1].reason})"
        parent = os.path.dirname(self.root)
        try:
            names = sorted(os.listdir(parent))
        except OSError:
            names = []
        others = [n for n in names if n != self.cfg.name and os.path.isdir(os.path.join(parent, n))
                  and not os.path.islink(os.path.join(parent, n)) and _has_step_dirs(os.path.join(parent, n))]
        if others:
            return f"{parent} holds checkpoints of other job names: {', '.join(others[:5])}"
        return None

    def read_manifest(self, step, quiet=False):
        """This rank's manifest of ``step`` (validated); None if missing/unreadable and ``quiet``."""
        path = self.manifest_path(step)
        try:
            m = mf.parse(storage.read_json(path), path)
            if m.step != step or m.rank != self.rank or m.name != self.cfg.name or m.world_size != self.world_size:
                raise CorruptCheckpointError(f"{path}: does not describe step {step} of rank {self.rank}")
            return m
        except (CorruptCheckpointError, IncompatibleCheckpointError, OSError) as e:
            if quiet:
                log.debug("rank %d: step %d: %s", self.rank, step, e)
                return None
            raise

    def kept_bytes(self, step, size):
        """Local: a read-only uint8 view of the whole data file of ``step`` (``size`` bytes) from
        the mapping its write left open (data_file.Mappings), or None when none is kept: then read
        the file (a fresh mapping would fault its pages in one by one)."""
        if self.mappings is None or not size:
            return None
        try:
            fd = storage.open_checked(self.data_path(step), size)
        except (CorruptCheckpointError, OSError):
            return None
        try:
            return self._kept_view(fd, size)
        finally:
            os.close(fd)

    def _kept_view(self, fd, size):
        """Local: kept_bytes' view for the open file ``fd`` (``size`` > 0 bytes), or None."""
        kept = self.mappings.find(fd, size) if self.mappings is not None else None
        if kept is None:
            return None
        whole = np.frombuffer(kept, np.uint8)
        whole.flags.writeable = False
        return whole

    def data_view(self, manifest):
        """Local: a read-only uint8 view of a written step's whole data file, memory-mapped (no
        copy): the mapping its write left open (kept_bytes) when there is one, else a new one
        populated up front (MAP_POPULATE) rather than faulted in page by page. Raises
        CorruptCheckpointError when the file is missing or not ``manifest.data_size`` long."""
        fd = storage.open_checked(self.data_path(manifest.step), manifest.data_size)
        try:
            if not manifest.data_size:
                return np.zeros(0, np.uint8)
            kept = self._kept_view(fd, manifest.data_size)
            if kept is not None:
                return kept
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return np.frombuffer(mmap.mmap(fd, manifest.data_size, flags=flags, prot=mmap.PROT_READ), np.uint8)
        finally:
            os.close(fd)

    def mapped_arrays(self, manifest):
        """Read-only views of the arrays of a committed step, memory-mapped from its data file
        (data_view): (name, array, global_shape, global_offset) as the pfs level takes them (no
        copy)."""
        whole = self.data_view(manifest)
        out = []
        for a in manifest.arrays:
            view = whole[a.offset:a.offset + a.nbytes].view(np.dtype(a.dtype)).reshape(a.shape)
            out.append((a.name, view, a.global_shape, a.global_offset))
        return out

    def read_document(self, manifest):
        """Local: the state document of a committed step (verified, parsed), or None without one."""
        entry = manifest.array(st.STATE_ENTRY)
        if entry is None:
            return None
        buf = np.empty(entry.shape, np.dtype(entry.dtype))
        self.read_into(manifest, [(st.STATE_ENTRY, buf)])
        return st.parse_document(buf.tobytes(), self.data_path(manifest.step))

    def state_keys(self, manifest):
        """Local: {state key: layout kind} of a committed step's state dict ({} without one)."""
        doc = self.read_document(manifest)
        if doc is None:
            return {}
        layouts = doc.get("layouts", {})
        return {k: layouts.get(k, {}).get("kind", "rank") for k in doc["items"]}

    def _read_buffer(self):
        if self._buffer is None:
            self._buffer = np.empty(min(self.cfg.io_chunk, data_file.HASH_PIECE), np.uint8)
        return self._buffer

    def verify(self, manifest):
        """Re-hash this rank's data for ``manifest``; CorruptCheckpointError on any difference."""
        storage.verify_file(self.data_path(manifest.step), manifest.data_size,
                            [(a.name, a.offset, a.nbytes, a.checksum) for a in manifest.arrays],
                            self._read_buffer())

    def read_into(self, manifest, targets):
        """Fill arrays from a verified step: ``targets`` is a list of (array name, ndarray); a
        target that is not C-contiguous is filled through a temporary copy."""
        entries = {a.name: a for a in manifest.arrays}
        chunks = sum(-(-entries[n].nbytes // self.cfg.io_chunk) for n, _ in targets)
        fault = faults.HalfWay("restore", self.rank, manifest.step, max(1, chunks // 2)) if faults.active() else None
        direct, copies = [], []
        for name, array in targets:
            if array.flags.c_contiguous:
                direct.append((array, entries[name].offset))
            else:
                tmp = np.empty(array.shape, array.dtype)
                direct.append((tmp, entries[name].offset))
                copies.append((array, tmp))
        data_file.read_into(self.data_path(manifest.step), manifest.data_size, direct, self.cfg.io_chunk, fault)
        for array, tmp in copies:
            np.copyto(array, tmp)

    # ------------------------------------------------------------------ retire
    def retire(self, step, keep_dir=False):
        """Delete this rank's part of ``step``: manifest first (uncommit), then the data, then
        the step directory if it is empty (unless ``keep_dir``).

        With ``reuse_files`` the data file becomes the spare that the next checkpoint overwrites,
        and so do the held copies, parity and deltas (reuse_held_spare).
        """
        self.uncommit(step)
        data = self.data_path(step)
        if not any(self._keep_as_spare(data, spare) for spare in self.spare_paths()) and os.path.isfile(data) \
                and not os.path.islink(data):
            self._discard(data)
        faults.hit("retire", self.rank, step)
        held = self.held_dir(step)
        if os.path.isdir(held) and not os.path.islink(held):
            for name in os.listdir(held):
                path = os.path.join(held, name)
                if not name.endswith((".dat", ".delta")):
                    storage.remove_file(path)
                elif not self._keep_as_spare(path, self.held_spare_path(name)):
                    self._discard(path)
            storage.remove_dir_if_empty(held)
        prefix = f"rank_{self.rank:06d}."
        try:
            names = os.listdir(self.step_dir(step))
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(prefix):
                storage.remove_file(os.path.join(self.step_dir(step), name))
        if not keep_dir:
            storage.remove_dir_if_empty(self.step_dir(step))


@register
class LocalLevel(Level):
    """The node cache alone: every step is written and committed there by the save protocol,
    so this level protects nothing more and survives a process crash, not the loss of its node."""
    name, order = "local", 10
