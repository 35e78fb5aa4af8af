"""The partner level: a copy of every rank's checkpoint in the cache of a rank on another node.

Files: ``step_<S>/held_<H>/partner_<R>.dat`` and ``partner_<R>.json`` (rank R's data and
manifest, kept by holder H). Survives any node losses except a node together with the node
holding its copies. ``encode`` and ``recover`` are collective.

With ``incremental`` (levels/delta.py) an incremental step holds ``partner_<R>.delta`` (the
blocks of rank R changed since the base step B, concatenated) and ``partner_<R>.delta.json``
(their index and B's identity) instead of the ``.dat`` copy; B's copy stays in
``step_<B>/held_<H>/``. A rebuild first makes the full copy (B's copy, cut or extended to the
step's data size, + the delta), verifies it against the per-array checksums of the step's
manifest, then proceeds as for a full step.
"""
import dataclasses
import os
import shutil

import numpy as np

from .. import faults, manifest as mf, storage
from ..errors import CorruptCheckpointError, HpcCkptError
from ..topology import partner_holders
from ..comm import Deferred
from .base import Level
from .registry import register
from .partner_catalog import PartnerFiles
from .delta import Chain, apply_blocks, check_delta_info, delta_bytes, delta_info, stream_reader
from .transfer import exchange_files


@register
class PartnerLevel(Level):
    """A copy of each rank's committed step in the cache of a rank on another node."""
    name, order, redundant = "partner", 20, True
    files = PartnerFiles()
    survives = "node"

    def __init__(self, ctx):
        super().__init__(ctx)
        cache = self.cache = ctx.cache
        self.comm = ctx.comm
        self.holders = partner_holders(ctx.topology.node_of)
        self.chain = Chain(cache) if cache.cfg.incremental else None
        self.sent = 0            # bytes this rank sent in its last encode (benchmarks)

    @classmethod
    def placement_warnings(cls, node_of, options, config):
        """Local, pure: one node (nothing survives its loss); uneven nodes (a rank holds several copies)."""
        warnings = super().placement_warnings(node_of, options, config)
        if warnings:
            return warnings
        loads = {}
        for h in partner_holders(node_of):
            loads[h] = loads.get(h, 0) + 1
        worst = max(loads.values())
        return [f"uneven nodes: a rank holds up to {worst} {cls.name} copies"] if worst > 1 else []

    def pinned_steps(self):
        """Local: the base step of the next incremental checkpoint (kept by retire)."""
        return self.chain.pinned() if self.chain is not None else ()

    def _copy_paths(self, step, src):
        held = self.cache.held_dir(step)
        return os.path.join(held, f"partner_{src:06d}.dat"), os.path.join(held, f"partner_{src:06d}.json")

    def _delta_paths(self, step, src):
        held = self.cache.held_dir(step)
        return os.path.join(held, f"partner_{src:06d}.delta"), os.path.join(held, f"partner_{src:06d}.delta.json")

    def background(self):
        return bool(self.ctx.config.background)

    def protect(self, manifest, pending=None):
        """Collective: this rank's copy to its holder, the copies it holds for others (encode)."""
        return self.encode(manifest.step, manifest)

    def encode(self, step, manifest):
        """Collective: send this rank's data to its holder; keep the copies sent to this rank.
        With ``incremental``: only the blocks changed since the base when every rank can (then
        the returned manifest names the base, and is the one to commit)."""
        me = self.comm.rank
        sources = [s for s, h in enumerate(self.holders) if h == me]
        if self.chain is None:
            self._send_copies(step, sources, manifest if self.holders[me] is not None else None, self.holders[me])
            return manifest
        deferred = Deferred()
        plan = self.chain.plan(self.comm, step, manifest, deferred,
                               lambda base: all(os.path.isfile(self._copy_paths(base, s)[0]) for s in sources))
        if plan.incremental:
            manifest = dataclasses.replace(manifest, base=plan.base)
        try:
            self._send_copies(step, sources, manifest if self.holders[me] is not None else None, self.holders[me],
                              plan, deferred.error)
        except BaseException:
            self.chain.forget()
            raise
        self.chain.done(plan, manifest)
        return manifest

    def _send_copies(self, step, sources, manifest, holder, plan=None, error=None):
        """Collective: owners send (data, manifest) to holders; holders store them as copies
        (with an incremental ``plan``: the changed blocks, stored as deltas)."""
        deferred = Deferred()
        deferred.error = error
        cfg = self.cache.cfg
        incremental = plan is not None and plan.incremental
        sends = []
        self.sent = 0
        if manifest is not None and holder is not None:
            if incremental:
                info = delta_info(plan.base[0], plan.base[1], cfg.incremental_block, manifest.data_size,
                                  plan.changed if plan.changed is not None else [], plan.base_size)
                size = delta_bytes(info["blocks"], cfg.incremental_block, manifest.data_size)
                reader = stream_reader(plan.data, plan.changed, cfg.incremental_block) \
                    if plan.data is not None and plan.changed is not None else (lambda buf, off: buf.fill(0))
                sends.append((holder, {"manifest": manifest.to_json(), "delta": info}, reader, size))
            else:
                size = manifest.data_size
                sends.append((holder, manifest.to_json(), deferred.run(self.cache.data_view, manifest), size))
            self.sent = size

        def path_for(src):
            def make(meta):
                faults.hit("encode", self.comm.rank, step)   # test hook: kill/ENOSPC while storing copies
                storage.own_dir(self.cache.held_dir(step), cfg.dir_mode)
                path = self._delta_paths(step, src)[0] if incremental else self._copy_paths(step, src)[0]
                self.cache.reuse_held_spare(path)
                return path
            return make
        metas = exchange_files(self.comm, sends, [(s, path_for(s)) for s in sources], cfg.io_chunk, deferred,
                               cfg.file_mode)
        for src, meta in metas.items():
            if incremental:    # the index first, the manifest last: the copy exists once both are there
                deferred.run(storage.atomic_write_json, self._delta_paths(step, src)[1], meta["delta"],
                             cfg.file_mode, cfg.cache_fsync)
                meta = meta["manifest"]
            deferred.run(storage.atomic_write_json, self._copy_paths(step, src)[1], meta, cfg.file_mode,
                         cfg.cache_fsync)
        deferred.raise_if_any()

    def _usable_copy(self, step, src, ckpt_id):
        """The verified manifest of our copy of rank ``src`` for ``step``, or None. An incremental
        copy is first made full (base copy + delta, into a temporary file), verified, then renamed."""
        data, meta = self._copy_paths(step, src)
        try:
            m = mf.parse(storage.read_json(meta), meta)
            if m.rank != src or m.step != step or m.ckpt_id != ckpt_id:
                return None
            if not os.path.exists(data) and os.path.exists(self._delta_paths(step, src)[1]):
                self._materialize(step, src, m)
            storage.verify_file(data, m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays],
                                self.cache._read_buffer())
            return m
        except (HpcCkptError, OSError, ValueError):
            return None

    def _materialize(self, step, src, m):
        """Local: the full copy of rank ``src`` for ``step`` from the base's copy and the delta,
        verified against ``m`` (the step's manifest) before it is renamed into place. Raises
        (CorruptCheckpointError, OSError) when the base is missing or the result does not verify."""
        delta_path, info_path = self._delta_paths(step, src)
        info = check_delta_info(storage.read_json(info_path), info_path)
        if m.base is None or (info["base_step"], info["base_ckpt_id"]) != tuple(m.base) \
                or info["data_size"] != m.data_size:
            raise CorruptCheckpointError(f"{info_path}: does not match the manifest of step {step}")
        base_data, base_meta = self._copy_paths(info["base_step"], src)
        bm = mf.parse(storage.read_json(base_meta), base_meta)
        if bm.rank != src or bm.ckpt_id != info["base_ckpt_id"] or bm.data_size != info["base_size"] \
                or not os.path.isfile(base_data) or os.path.islink(base_data):
            raise CorruptCheckpointError(f"{base_meta}: not the base of step {step}")
        tmp = self._copy_paths(step, src)[0] + ".tmp"
        shutil.copyfile(base_data, tmp)
        try:
            with open(tmp, "r+b") as f:
                f.truncate(m.data_size)
                delta = np.fromfile(delta_path, np.uint8)
                target = np.memmap(f, np.uint8, "r+", shape=(m.data_size,)) if m.data_size else np.zeros(0, np.uint8)
                apply_blocks(target, delta, info["blocks"], info["block"], m.data_size)
                if m.data_size:
                    target.flush()
                del target
            storage.verify_file(tmp, m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays],
                                self.cache._read_buffer())
            os.replace(tmp, self._copy_paths(step, src)[0])
        finally:
            storage.remove_file(tmp)

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
