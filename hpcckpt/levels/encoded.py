"""The encoded levels: XOR (one parity) and Reed-Solomon (m parities) across groups of nodes,
``EncodedLevel``: the full encode, and the recover that rebuilds lost ranks. The layout of a group's
stripes and symbols, the code and the checks of ``encoded.json`` are levels/encoded_layout.py; the
incremental parity update (``incremental``: only the parity segments that change against a base
step) is levels/encoded_delta.py.

Files: ``step_<S>/held_<R>/parity.dat`` (m pieces) and ``encoded.json`` (the group, the code,
every member's manifest, parity checksums); an incremental step has ``parity.delta`` and
``parity.delta.json`` instead of ``parity.dat``. ``encode`` and ``recover`` are collective.
"""
import dataclasses
import os

import numpy as np
import xxhash
from mpi4py import MPI

from .. import faults, manifest as mf, storage
from ..codecs import gf256
from ..codecs.checksum import new_hasher
from ..errors import HpcCkptError
from ..topology import encoding_groups
from .combine import Buffers, gather_combine, map_range
from ..comm import Deferred
from .base import Level
from .options import Setting
from .registry import register
from .delta import Chain, parity_entries
from .encoded_catalog import EncodedFiles
from .encoded_delta import IncrementalParity
from .encoded_layout import FORMAT, check_info, code_matrix, rebuild_plan, stripe_symbol_owner


class EncodedLevel(IncrementalParity, Level):
    """Parity across this rank's group of nodes: XorLevel (one parity) and RsLevel (m)."""
    redundant = True
    files = EncodedFiles()      # xor and rs keep the same files
    survives, keeps = "node", "parity"
    settings = {"group_size": Setting(4, int, flat="group_size",
                                      doc="ranks per parity group, on distinct nodes (xor and rs share it)")}

    def __init__(self, ctx):
        super().__init__(ctx)
        cache = self.cache = ctx.cache
        self.comm = comm = ctx.comm
        self.parity = self.parities(ctx)
        self.groups = encoding_groups(ctx.topology.node_of, cache.cfg.group_size)
        self.group = next(g for g in self.groups if comm.rank in g)
        self._gcomm = None
        self._buffers = Buffers()
        self.chain = Chain(cache) if cache.cfg.incremental else None
        self.sent = 0            # bytes this rank sent in its last encode (benchmarks)

    @classmethod
    def placement_warnings(cls, node_of, options, config):
        """Local, pure: one node (nothing survives its loss); a rank alone in its group (no parity
        protects it); a group of k ranks with no more than ``parity`` (rs: it uses k - 1)."""
        warnings = super().placement_warnings(node_of, options, config)
        if warnings:
            return warnings
        parity = options.get("parity", 1)
        for group in encoding_groups(node_of, options["group_size"]):
            if len(group) == 1:
                warnings.append(f"rank {group[0]} has no rank on another node to share its {cls.name} group: "
                                f"the {cls.name} level cannot protect it against losing its node")
            elif len(group) <= parity:
                warnings.append(f"the group {group} has {len(group)} ranks: {cls.name} can use only {len(group) - 1} "
                                f"parity block(s) there instead of {parity}")
        return warnings

    def pinned_steps(self):
        """Local: the base step of the next incremental checkpoint (kept by retire)."""
        return self.chain.pinned() if self.chain is not None else ()

    def parities(self, ctx):
        """Local: the number of parity blocks per stripe this level computes."""
        raise NotImplementedError

    def background(self):
        return bool(self.ctx.config.background)

    def protect(self, manifest, pending=None):
        """Collective: this group's parity of the committed step (encode)."""
        return self.encode(manifest.step, manifest)

    def comms(self):
        return () if self._gcomm is None else (self._gcomm,)

    def _paths(self, step):
        held = self.cache.held_dir(step)
        return os.path.join(held, "parity.dat"), os.path.join(held, "encoded.json")

    def _delta_paths(self, step):
        held = self.cache.held_dir(step)
        return os.path.join(held, "parity.delta"), os.path.join(held, "parity.delta.json")

    def _group_comm(self):
        if self._gcomm is None:
            self._gcomm = self.comm.Split(self.groups.index(self.group), self.group.index(self.comm.rank))
        return self._gcomm

    def close(self):
        """Local: free this group's communicator."""
        if self._gcomm is not None:
            self._gcomm.Free()
            self._gcomm = None

    def _segment(self):
        if self.chain is not None:   # one sink call per parity segment (segment checksums)
            return self.cache.cfg.incremental_block
        return max(8, self.cache.cfg.io_chunk // 8 * 8)

    # ------------------------------------------------------------------ encode
    def encode(self, step, manifest):
        """Collective: compute this group's parity and keep this rank's share of it. With
        ``incremental``: only the parity segments changed since the base when every rank can
        (then the returned manifest names the base, and is the one to commit)."""
        if self.chain is None:
            self._encode(step, manifest, None, Deferred())
            return manifest
        deferred = Deferred()
        k = len(self.group)
        m = min(self.parity, k - 1)
        sizes = self._group_comm().allgather(manifest.data_size)     # the group's: do the base's pieces still fit?
        plan = self.chain.plan(self.comm, step, manifest, deferred,
                               lambda base: m > 0 and self._base_ok(base, self._piece(sizes, k - m)))
        if plan.incremental:
            manifest = dataclasses.replace(manifest, base=plan.base)
        try:
            self._encode(step, manifest, plan, deferred, sizes)
        except BaseException:
            self.chain.forget()
            raise
        self.chain.done(plan, manifest)
        return manifest

    def _piece(self, sizes, kd):
        """Bytes per data piece: the largest member's data over kd, rounded up to 8 bytes; with
        ``incremental`` to a whole number of blocks, so that a changed block touches one parity
        segment, not two."""
        align = self.cache.cfg.incremental_block if self.chain is not None else 8
        return max(8, -(-(-(-max(sizes) // kd)) // align) * align)

    def _base_ok(self, base, piece):
        """Local: this rank has what an incremental step against ``base`` needs: its data of the
        base and its parity of the base, whose pieces have the new step's ``piece`` bytes (the data
        may change size while the group's largest stays within its pieces)."""
        parity_path, info_path = self._paths(base)
        if os.path.getsize(self.cache.data_path(base)) != self.chain.base[2] or not os.path.isfile(parity_path):
            return False
        info = storage.read_json(info_path)
        return info.get("group") == self.group and info.get("piece") == piece and \
            os.path.getsize(parity_path) == info["parity"] * info["piece"] and \
            info.get("segment") == self.cache.cfg.incremental_block and \
            isinstance(info.get("segment_checksums"), list) and len(info["segment_checksums"]) == info["parity"]

    def _encode(self, step, manifest, plan, deferred, sizes=None):
        gcomm, group = self._group_comm(), self.group
        k, pos = len(group), self.group.index(self.comm.rank)
        m = min(self.parity, k - 1)
        sizes = gcomm.allgather(manifest.data_size) if sizes is None else sizes
        manifests = gcomm.allgather(manifest.to_json())
        self.sent = 0
        if plan is not None and plan.incremental:
            self._encode_delta(step, manifest, plan, deferred, gcomm, k, pos, m, sizes, manifests)
            deferred.raise_if_any()
            return
        if m == 0:  # a group of one: nothing to encode (start-up warned)
            self._write_info(deferred, step, manifest.ckpt_id, group, pos, m, 8, sizes, manifests, [])
            deferred.raise_if_any()
            return
        kd = k - m
        piece = self._piece(sizes, kd)
        coef = code_matrix(kd, m)
        parity_path, _ = self._paths(step)
        data = deferred.run(self.cache.data_view, manifest)   # the mapping the write left, when kept
        deferred.run(storage.own_dir, self.cache.held_dir(step), self.cache.cfg.dir_mode)
        deferred.run(self.cache.reuse_held_spare, parity_path)
        fd_out = deferred.run(os.open, parity_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, self.cache.cfg.file_mode)
        deferred.run(faults.hit, "encode", self.comm.rank, step)   # test hook: kill/ENOSPC mid-encoding

        def valid(r, q):   # bytes of data piece q of group position r (the rest is zero padding)
            return max(0, min(piece, sizes[r] - q * piece))

        sends = []         # my data piece q is data symbol q of stripe s; its parity owners need it
        for q in range(kd):
            s = (pos - m - q) % k
            source = None if data is None else data[q * piece:q * piece + valid(pos, q)]
            sends += [(stripe_symbol_owner(k, s, j), j, source, valid(pos, q)) for j in range(m)]
            self.sent += m * valid(pos, q)
        hashers = [new_hasher() for _ in range(m)]

        segment_sums = [[] for _ in range(m)] if self.chain is not None else None

        def sink(j):
            def write(off, view):
                hashers[j].update(view)
                if segment_sums is not None:     # views are whole segments (_segment, piece aligned)
                    segment_sums[j].append(xxhash.xxh3_64_hexdigest(view))
                if fd_out is not None:
                    deferred.run(storage.pwrite_all, fd_out, view, j * piece + off)
            return write
        outputs = []       # I keep parity j of stripe pos - j: combine that stripe's data symbols
        for j in range(m):
            s = (pos - j) % k
            owners = [stripe_symbol_owner(k, s, p) for p in range(m, k)]
            outputs.append((j, [(r, valid(r, q), coef[j, q]) for q, r in enumerate(owners)], None, sink(j)))
        gather_combine(gcomm, piece, self._segment(), sends, outputs, self._buffers)
        del data, sends
        if fd_out is not None:
            deferred.run(os.ftruncate, fd_out, m * piece)
            os.close(fd_out)
        self._write_info(deferred, step, manifest.ckpt_id, group, pos, m, piece, sizes, manifests,
                         [h.hexdigest() for h in hashers],
                         None if segment_sums is None else (self._segment(), segment_sums))
        deferred.raise_if_any()


    def _write_info(self, deferred, step, ckpt_id, group, pos, m, piece, sizes, manifests, checksums, segments=None):
        info = {"format": FORMAT, "version": 1, "level": self.name, "step": step, "ckpt_id": ckpt_id,
                "group": group, "position": pos, "parity": m, "piece": piece, "sizes": sizes,
                "manifests": manifests, "parity_checksums": checksums}
        if segments is not None:     # incremental: (segment bytes, [[checksum of each segment] per parity])
            info["segment"], info["segment_checksums"] = segments
        deferred.run(storage.own_dir, self.cache.held_dir(step), self.cache.cfg.dir_mode)
        deferred.run(storage.atomic_write_json, self._paths(step)[1], info, self.cache.cfg.file_mode,
                     self.cache.cfg.cache_fsync)

    # ------------------------------------------------------------------ recover
    def _load_info(self, step, ckpt_id):
        """This rank's validated encoded.json for ``step`` and whether its parity verifies."""
        parity_path, info_path = self._paths(step)
        try:
            info = storage.read_json(info_path)
            info = check_info(info, self.comm.rank, step, ckpt_id, self.comm.size, info_path)
        except (HpcCkptError, OSError):
            return None, False
        try:
            if not os.path.exists(parity_path) and os.path.exists(self._delta_paths(step)[1]):
                self._materialize(step, ckpt_id, info)   # incremental: base parity + delta, verified below
            storage.verify_file(parity_path, info["parity"] * info["piece"] if info["parity"] else 0,
                                parity_entries(info), self.cache._read_buffer())
            return info, True
        except (HpcCkptError, OSError):
            return info, False

    def recover(self, step, ckpt_id, data_ok):
        """Collective: rebuild lost data (and lost parity) of every group; True when done.

        False on every rank when some group lost more symbols in a stripe than it has parity.
        """
        me = self.comm.rank
        info, parity_ok = self._load_info(step, ckpt_id)
        summary = None if info is None else {k: info[k] for k in ("group", "parity", "piece", "sizes", "manifests")}
        views = self.comm.allgather((summary, parity_ok))
        plan = rebuild_plan(views, data_ok)   # failure path only: every rank's summary
        if plan is None:
            return False
        group_index = next((i for i, g in enumerate(plan) if me in g["group"]), None)
        color = group_index if group_index is not None and plan[group_index]["losses"] else MPI.UNDEFINED
        gcomm = self.comm.Split(color, 0 if color == MPI.UNDEFINED else plan[group_index]["group"].index(me))
        deferred = Deferred()
        try:
            if gcomm != MPI.COMM_NULL:
                self._rebuild_group(gcomm, step, ckpt_id, plan[group_index], data_ok, views, deferred)
        finally:
            if gcomm != MPI.COMM_NULL:
                gcomm.Free()
        deferred.raise_if_any()
        return True

    def _rebuild_group(self, gcomm, step, ckpt_id, g, data_ok, views, deferred):
        me = self.comm.rank
        group, m, piece, sizes = g["group"], g["parity"], g["piece"], g["sizes"]
        k, pos = len(group), group.index(me)
        kd = k - m
        lost_data = [not data_ok[r] for r in group]
        lost_parity = [not views[r][1] for r in group]
        gen = np.concatenate([np.eye(kd, dtype=np.uint8), code_matrix(kd, m)])  # code index -> row

        def code_index(p):
            return kd + p if p < m else p - m

        def lost(s, p):
            owner = stripe_symbol_owner(k, s, p)
            return lost_parity[owner] if p < m else lost_data[owner]

        # For every stripe: the lost symbols, the symbols used, and the reconstruction matrix.
        stripes = []
        for s in range(k):
            gone = [p for p in range(k) if lost(s, p)]
            if not gone:
                stripes.append(None)
                continue
            used = sorted((p for p in range(k) if not lost(s, p)), key=code_index)[:kd]
            inv = gf256.gf_matinv(gen[[code_index(p) for p in used]])
            coeffs = gf256.gf_matmul(gen[[code_index(p) for p in gone]], inv)
            stripes.append((gone, used, coeffs))

        def valid(r, p):   # bytes of symbol p held by group position r (the rest is zero)
            return piece if p < m else max(0, min(piece, sizes[r] - (p - m) * piece))

        def where(p):      # file and offset of this rank's symbol p
            return (parity_path, p * piece) if p < m else (self.cache.data_path(step), (p - m) * piece)

        parity_path, _ = self._paths(step)
        deferred.run(storage.own_dir, self.cache.held_dir(step), self.cache.cfg.dir_mode)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
        if lost_data[pos] or lost_parity[pos]:
            deferred.run(faults.hit, "rebuild", me, step)   # test hook: kill/ENOSPC on a rebuilt rank
        fd_data = deferred.run(os.open, self.cache.data_path(step), flags, self.cache.cfg.file_mode) if lost_data[pos] else None
        fd_parity = deferred.run(os.open, parity_path, flags, self.cache.cfg.file_mode) if lost_parity[pos] else None
        hashers = [new_hasher() for _ in range(m)]

        def sink(p):
            def write(off, view):
                if p < m:
                    hashers[p].update(view)
                fd = fd_parity if p < m else fd_data
                if fd is not None:
                    deferred.run(storage.pwrite_all, fd, view, where(p)[1] + off)
            return write
        # Each lost symbol is combined by one of the survivors it is computed from (its
        # "aggregator", chosen round-robin so the work is spread) and forwarded to its owner.
        sends, outputs, deliveries = [], [], []
        for s, stripe in enumerate(stripes):
            if stripe is None:
                continue
            gone, used, coeffs = stripe
            p_mine = (pos - s) % k
            owners = [stripe_symbol_owner(k, s, p) for p in used]
            source = None
            if p_mine in used:
                path, offset = where(p_mine)
                source = deferred.run(map_range, path, offset, valid(pos, p_mine))
            for g, p_lost in enumerate(gone):
                dest = stripe_symbol_owner(k, s, p_lost)
                agg = owners[(s + g) % kd]
                tag = 2 * (s * k + p_lost)
                if dest == pos:
                    deliveries.append((agg, tag + 1, sink(p_lost)))
                if agg == pos:
                    i_mine = used.index(p_mine)
                    ins = [(r, valid(r, p), coeffs[g, i]) for i, (r, p) in enumerate(zip(owners, used)) if r != pos]
                    outputs.append((tag, ins, (source, valid(pos, p_mine), coeffs[g, i_mine]), (dest, tag + 1)))
                elif p_mine in used:
                    sends.append((agg, tag, source, valid(pos, p_mine)))
        _check_tags(gcomm, 2 * k * k)
        gather_combine(gcomm, piece, self._segment(), sends, outputs, self._buffers, deliveries)
        del sends, outputs
        if fd_data is not None:
            deferred.run(os.ftruncate, fd_data, sizes[pos])
            os.close(fd_data)
        if fd_parity is not None:
            deferred.run(os.ftruncate, fd_parity, m * piece)
            os.close(fd_parity)
        if lost_parity[pos]:   # parity rebuilt (hashed on the way): write encoded.json again
            checksums = [h.hexdigest() for h in hashers]
            manifests = next(v[0]["manifests"] for v in (views[r] for r in group) if v[0] is not None)
            self._write_info(deferred, step, ckpt_id, group, pos, m, piece, sizes, manifests, checksums or [])
        if lost_data[pos]:     # data rebuilt: its manifest comes from a group member's copy
            manifests = next(v[0]["manifests"] for v in (views[r] for r in group) if v[0] is not None)
            doc = manifests[pos]
            parsed = deferred.run(_parse_member, doc, me, step, ckpt_id)
            if parsed is not None:
                deferred.run(self.cache.commit, parsed)


def _check_tags(comm, needed):
    """The rebuild tags message (stripe, symbol) pairs; MPI only promises tags up to 32767."""
    tag_ub = comm.Get_attr(MPI.TAG_UB)
    if tag_ub is not None and tag_ub < needed:
        raise HpcCkptError(f"this MPI allows tags up to {tag_ub}; rebuilding a group this large needs {needed}")


def _parse_member(doc, rank, step, ckpt_id):
    m = mf.parse(doc, f"the copy of rank {rank}'s manifest")
    if m.rank != rank or m.step != step or m.ckpt_id != ckpt_id:
        raise ValueError(f"group copy describes rank {m.rank} step {m.step}, not rank {rank} step {step}")
    return m


@register
class XorLevel(EncodedLevel):
    """One XOR parity per group: survives one lost node per group."""
    name, order = "xor", 30

    def parities(self, ctx):
        return 1


@register
class RsLevel(EncodedLevel):
    """Reed-Solomon parity (``rs_parity`` blocks per group): survives that many lost nodes per group."""
    name, order = "rs", 40
    settings = {**EncodedLevel.settings,
                "parity": Setting(2, int, flat="rs_parity", doc="parity blocks per group (at most its ranks - 1)")}

    def parities(self, ctx):
        return int(ctx.options["parity"])
