"""The partner level: a copy of every rank's checkpoint in the cache of a rank on another node.

Files: ``step_<S>/held_<H>/partner_<R>.dat`` and ``partner_<R>.json`` (rank R's data and
manifest, kept by holder H). Survives any node losses except a node together with the node
holding its copies. ``encode`` and ``recover`` are collective.
"""
import os

from .. import faults, manifest as mf, storage
from ..errors import HpcCkptError
from ..topology import partner_holders
from ..comm import Deferred
from .base import RedundancyLevel
from .transfer import exchange_files


class PartnerLevel(RedundancyLevel):
    name = "partner"

    def __init__(self, cache, comm, topology):
        self.cache, self.comm = cache, comm
        self.holders = partner_holders(topology.node_of)

    def _copy_paths(self, step, src):
        held = self.cache.held_dir(step)
        return os.path.join(held, f"partner_{src:06d}.dat"), os.path.join(held, f"partner_{src:06d}.json")

    def encode(self, step, manifest):
        """Collective: send this rank's data to its holder; keep the copies sent to this rank."""
        me = self.comm.rank
        self._send_copies(step, [s for s, h in enumerate(self.holders) if h == me],
                          manifest if self.holders[me] is not None else None, self.holders[me])

    def _send_copies(self, step, sources, manifest, holder):
        """Collective: owners send (data, manifest) to holders; holders store them as copies."""
        deferred = Deferred()
        sends = []
        if manifest is not None and holder is not None:
            sends.append((holder, manifest.to_json(), self.cache.data_path(step), manifest.data_size))

        def path_for(src):
            def make(meta):
                faults.hit("encode", self.comm.rank, step)   # test hook: kill/ENOSPC while storing copies
                storage.makedirs(self.cache.held_dir(step), self.cache.cfg.dir_mode)
                path = self._copy_paths(step, src)[0]
                self.cache.reuse_held_spare(path)
                return path
            return make
        metas = exchange_files(self.comm, sends, [(s, path_for(s)) for s in sources], self.cache.cfg.io_chunk, deferred,
                               self.cache.cfg.file_mode)
        for src, meta in metas.items():
            deferred.run(storage.atomic_write_json, self._copy_paths(step, src)[1], meta, self.cache.cfg.file_mode,
                         self.cache.cfg.cache_fsync)
        deferred.raise_if_any()

    def _usable_copy(self, step, src, ckpt_id):
        """The verified manifest of our copy of rank ``src`` for ``step``, or None."""
        data, meta = self._copy_paths(step, src)
        try:
            m = mf.parse(storage.read_json(meta), meta)
            if m.rank != src or m.step != step or m.ckpt_id != ckpt_id:
                return None
            storage.verify_file(data, m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays],
                                self.cache._read_buffer())
            return m
        except (HpcCkptError, OSError):
            return None

    def recover(self, step, ckpt_id, data_ok):
        """Collective: rebuild the ranks whose data is lost from their copies; True when done.

        Afterwards the copies that the rebuilt ranks held are sent to them again, so that the
        next failure is covered. False (on every rank) when some lost rank has no usable copy.
        """
        me = self.comm.rank
        lost = [r for r, ok in enumerate(data_ok) if not ok]
        held_dir = self.cache.held_dir(step)
        candidates = []
        names = os.listdir(held_dir) if os.path.isdir(held_dir) and os.access(held_dir, os.R_OK | os.X_OK) else []
        if names:
            for name in names:
                if name.startswith("partner_") and name.endswith(".json") and name[8:-5].isdigit():
                    candidates.append(int(name[8:-5]))
        mine = {src: m for src in candidates if src in lost and (m := self._usable_copy(step, src, ckpt_id))}
        holder_of = rebuild_plan(self.comm.allgather(sorted(mine)), lost)   # failure path only
        if holder_of is None:
            return False
        # 1. rebuild: each lost rank receives its copy from the rank that serves it
        deferred = Deferred()
        sends = [(src, m.to_json(), self._copy_paths(step, src)[0], m.data_size)
                 for src, m in mine.items() if holder_of[src] == me]
        recvs = []
        if me in holder_of:
            def my_data_path(meta):
                faults.hit("rebuild", self.comm.rank, step)   # test hook: kill/ENOSPC on the rebuilt rank
                storage.makedirs(self.cache.step_dir(step), self.cache.cfg.dir_mode)
                return self.cache.data_path(step)
            recvs.append((holder_of[me], my_data_path))
        metas = exchange_files(self.comm, sends, recvs, self.cache.cfg.io_chunk, deferred, self.cache.cfg.file_mode)
        if me in holder_of:
            m = deferred.run(_parse_copy, metas[holder_of[me]], me, step, ckpt_id, holder_of[me])
            if m is not None:
                deferred.run(self.cache.commit, m)
        # 2. protect again: owners resend to the rebuilt ranks the copies those held
        resend_to = {s: h for s, h in enumerate(self.holders) if h in lost}
        own = deferred.run(self._own_manifest, step) if me in resend_to else None
        try:
            self._send_copies(step, [s for s, h in resend_to.items() if h == me], own, resend_to.get(me))
        finally:
            deferred.raise_if_any()
        return True

    def _own_manifest(self, step):
        path = self.cache.manifest_path(step)
        try:
            return mf.parse(storage.read_json(path), path)
        except HpcCkptError as e:
            raise ValueError(str(e)) from e


def rebuild_plan(offers, lost):
    """Local, pure: ``{lost rank: the rank that sends it its copy}`` from every rank's ``offers``
    (``offers[r]``: the lost ranks whose verified copy rank r holds); the lowest offering rank
    serves. None when some lost rank has no verified copy anywhere."""
    holder_of = {}
    for rank, srcs in enumerate(offers):
        for src in srcs:
            holder_of.setdefault(src, rank)
    if any(r not in holder_of for r in lost):
        return None
    return {r: holder_of[r] for r in lost}


def _parse_copy(doc, rank, step, ckpt_id, sender):
    try:
        m = mf.parse(doc, f"copy of rank {rank} sent by rank {sender}")
    except HpcCkptError as e:
        raise ValueError(str(e)) from e
    if m.rank != rank or m.step != step or m.ckpt_id != ckpt_id:
        raise ValueError(f"rank {sender} sent a copy of rank {m.rank} step {m.step}, not of rank {rank} step {step}")
    return m
