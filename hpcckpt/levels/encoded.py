"""The encoded levels: XOR (one parity) and Reed-Solomon (m parities) across groups of nodes.

A group has k ranks on k distinct nodes and m parity symbols per stripe (xor: m = 1). Each rank's
data file, zero-padded to the group's largest, is cut into k - m pieces. There are k stripes;
stripe s holds k symbols, one on each rank: the rank at group position (s + p) mod k keeps
symbol p, which is parity p when p < m and data piece p - m of that rank otherwise. So every rank
stores its own data plus m pieces of parity (m / (k - m) of its data), and losing any m ranks of
a group erases at most m symbols per stripe: recoverable (SCR's XOR layout, generalised to a
systematic Cauchy Reed-Solomon code over GF(2^8); with m = 1 the code is plain XOR).

Files: ``step_<S>/held_<R>/parity.dat`` (m pieces) and ``encoded.json`` (the group, the code,
every member's manifest, parity checksums). ``encode`` and ``recover`` are collective.

With ``incremental`` (levels/delta.py) an incremental step holds, instead of ``parity.dat``, only
the parity segments that change against the base step B: XOR and RS are linear, so a parity
segment of step S is B's parity segment XOR_q coef_q * (d_S ⊕ d_B) over the data pieces q of its
stripe, and only owners whose blocks changed send their d_S ⊕ d_B (B's data is pinned on every
node). ``parity.delta`` holds the new segments and ``parity.delta.json`` their index; the
``parity_checksums`` of ``encoded.json`` are those of the whole parity of S. A rebuild first makes
``parity.dat`` (B's parity + the segments) and verifies it against them, then proceeds as for a
full step.
"""
import dataclasses
import os
import shutil

import numpy as np
import xxhash
from mpi4py import MPI

from .. import faults, manifest as mf, storage
from ..codecs import gf256
from ..codecs.checksum import new_hasher
from ..codecs.rs import gf_combine_into, rs_parity_matrix
from ..errors import CorruptCheckpointError, HpcCkptError
from ..topology import encoding_groups
from .combine import Buffers, gather_combine, map_range
from .transfer import read_range
from ..comm import Deferred, InFlight
from .base import RedundancyLevel
from .delta import (SEGMENTS_ONLY, Chain, apply_segments, block_count, check_delta_info, check_parity_index,
                    delta_info, parity_entries, piece_segments, segment_length, segment_sums_ok)

FORMAT = "hpcckpt-encoded"
TAG_DELTA = 7200
WAVE_BYTES = 64 << 20    # buffers of one wave of an incremental encode (levels/encoded.py _encode_delta)


def code_matrix(kd, m):
    """The parity coefficients (m x kd). Row 0 is all ones, so m = 1 is plain XOR."""
    return rs_parity_matrix(kd, m)


def stripe_symbol_owner(group_len, s, p):
    """Group position of the rank keeping symbol p of stripe s."""
    return (s + p) % group_len


class EncodedLevel(RedundancyLevel):
    """The xor (parity=1) or rs (parity=rs_parity) level for this rank's group."""

    def __init__(self, cache, comm, topology, name, parity):
        self.cache, self.comm, self.name = cache, comm, name
        self.parity = parity
        self.groups = encoding_groups(topology.node_of, cache.cfg.group_size)
        self.group = next(g for g in self.groups if comm.rank in g)
        self._gcomm = None
        self._buffers = Buffers()
        self.chain = Chain(cache) if cache.cfg.incremental else None
        self.sent = 0            # bytes this rank sent in its last encode (benchmarks)

    def pinned_steps(self):
        """Local: the base step of the next incremental checkpoint (kept by retire)."""
        return self.chain.pinned() if self.chain is not None else ()

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

    def _encode_delta(self, step, manifest, plan, deferred, gcomm, k, pos, m, sizes, manifests):
        """Collective over the group: the parity segments of ``step`` that differ from the base's,
        from the changed data segments (d_S xor d_B) of the ranks that changed them."""
        cfg = self.cache.cfg
        kd = k - m
        base_step = plan.base[0]
        piece = self._piece(sizes, kd)
        seg = cfg.incremental_block
        coef = code_matrix(kd, m)
        changed = plan.changed if plan.changed is not None else np.zeros(0, np.int64)
        new_size, old_size = sizes[pos], plan.base_size
        extent = max(new_size, old_size)      # a shrunk rank's bytes past its new end become zero padding
        if old_size > new_size:
            changed = np.concatenate([changed, np.arange(block_count(new_size, seg), block_count(old_size, seg))])
        mine = [piece_segments(changed, cfg.incremental_block, extent, q, piece, seg) for q in range(kd)]
        segs = gcomm.allgather(mine)        # per member, per data piece: its changed segments
        # the data of both steps from the mappings their writes left open (storage.Mappings), else
        # read with pread into buffers, not through new maps: only a tenth of each file is read,
        # and faulting in its pages one by one costs more than the copy
        ro = os.O_RDONLY | os.O_NOFOLLOW
        new_bytes, old_bytes = self.cache.kept_bytes(step, new_size), self.cache.kept_bytes(base_step, old_size)
        fd_new = deferred.run(os.open, self.cache.data_path(step), ro) if new_bytes is None else None
        fd_old = deferred.run(os.open, self.cache.data_path(base_step), ro) if old_bytes is None else None
        fd_par = deferred.run(os.open, self._paths(base_step)[0], ro)
        delta_path, index_path = self._delta_paths(step)
        deferred.run(storage.own_dir, self.cache.held_dir(step), cfg.dir_mode)
        deferred.run(self.cache.reuse_held_spare, delta_path)    # overwritten, then truncated
        fd_out = deferred.run(os.open, delta_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, cfg.file_mode)
        deferred.run(faults.hit, "encode", self.comm.rank, step)

        def stripe_inputs(s):   # [(group position, data piece)] of the data symbols of stripe s
            return [(stripe_symbol_owner(k, s, p), p - m) for p in range(m, k)]
        unions = [sorted(set().union(*(segs[r][q] for r, q in stripe_inputs(s)))) for s in range(k)]
        rounds = max(len(u) for u in unions)
        my_outputs = [(j, (pos - j) % k) for j in range(m)]              # parity j of stripe pos - j
        # the new parity's segment checksums: the base's, with those of the changed segments replaced
        base_info = deferred.run(storage.read_json, self._paths(base_step)[1])
        nseg = -(-piece // seg)
        sums = [list(x) for x in base_info["segment_checksums"]] if base_info is not None \
            and segment_sums_ok(base_info, m, piece, seg) else [[""] * nseg for _ in range(m)]
        written = 0
        index = [[] for _ in range(m)]
        scratch = self._buffers.get("dscratch", seg)

        def read_into(fd, buf, offset):   # zeros after a local error (the exchange goes on; it is raised after)
            if fd is None or deferred.error is not None:
                buf.fill(0)
            elif deferred.run(read_range, fd, buf, offset) is None:
                buf.fill(0)

        def data_delta(out, lo):          # d_S xor d_B of the data bytes [lo, lo + out.size), zero past each end
            hi = lo + out.size
            if hi <= min(new_size, old_size) and new_bytes is not None and old_bytes is not None \
                    and deferred.error is None:
                np.bitwise_xor(new_bytes[lo:hi], old_bytes[lo:hi], out=out)
                return
            nv, ov = max(0, min(hi, new_size) - lo), max(0, min(hi, old_size) - lo)
            out[nv:] = 0
            if new_bytes is not None and deferred.error is None:
                out[:nv] = new_bytes[lo:lo + nv]
            else:
                read_into(fd_new, out[:nv], lo)
            old = scratch[:ov]
            if old_bytes is not None and deferred.error is None:
                old[:] = old_bytes[lo:lo + ov]
            else:
                read_into(fd_old, old, lo)
            np.bitwise_xor(out[:ov], old, out=out[:ov])

        # Rounds: round i moves the i-th changed segment of every stripe. Rounds go in waves of
        # up to WAVE_BYTES of buffers: all the messages of a wave are posted at once (fewer
        # synchronisations), then its outputs are combined in order.
        wave = max(1, WAVE_BYTES // (2 * kd * m * seg))
        sbuf = self._buffers.get("dsend", wave * kd * seg).reshape(wave, kd, seg)
        rbuf = self._buffers.get("drecv", wave * m * kd * seg).reshape(wave, m, kd, seg)
        obuf = self._buffers.get("dout", seg)
        with InFlight() as flight:
            for w0 in range(0, rounds, wave):
                requests, sends, inputs = [], [], {}
                for i in range(w0, min(rounds, w0 + wave)):
                    for j, s in my_outputs:
                        if i < len(unions[s]):
                            t = unions[s][i]
                            n = segment_length(t, seg, piece)
                            for q, (r, dq) in enumerate(stripe_inputs(s)):
                                if t in segs[r][dq]:
                                    requests.append(flight.recv(gcomm, rbuf[i - w0, j, q, :n], r,
                                                                TAG_DELTA + s * m + j))
                                    inputs.setdefault((i, j), []).append(q)
                for i in range(w0, min(rounds, w0 + wave)):
                    for q in range(kd):
                        s = (pos - m - q) % k
                        if i < len(unions[s]) and unions[s][i] in mine[q]:
                            t = unions[s][i]
                            n = segment_length(t, seg, piece)
                            buf = sbuf[i - w0, q, :n]
                            lo = q * piece + t * seg
                            v = max(0, min(n, extent - lo))
                            buf[v:] = 0
                            data_delta(buf[:v], lo)
                            for j in range(m):
                                sends.append(flight.send(gcomm, buf, stripe_symbol_owner(k, s, j),
                                                         TAG_DELTA + s * m + j))
                                self.sent += n
                flight.wait(requests)
                for i in range(w0, min(rounds, w0 + wave)):
                    for j, s in my_outputs:
                        if i >= len(unions[s]):
                            continue
                        t = unions[s][i]
                        n = segment_length(t, seg, piece)
                        lo = t * seg
                        out = obuf[:n]
                        read_into(fd_par, out, j * piece + lo)
                        qs = inputs.get((i, j), [])
                        if qs:
                            gf_combine_into([out], np.array([[coef[j, q] for q in qs]], np.uint8),
                                            [rbuf[i - w0, j, q, :n] for q in qs])
                        sums[j][t] = xxhash.xxh3_64_hexdigest(out)
                        if fd_out is not None:
                            deferred.run(storage.pwrite_all, fd_out, out, written)
                        written += n
                        index[j].append(t)
                flight.wait(sends)
        if fd_out is not None:
            deferred.run(os.ftruncate, fd_out, written)
            os.close(fd_out)
        for fd in (fd_new, fd_old, fd_par):
            if fd is not None:
                os.close(fd)
        del new_bytes, old_bytes
        deferred.run(storage.atomic_write_json, index_path,
                     delta_info(base_step, plan.base[1], cfg.incremental_block, m * piece, [],
                                segment=seg, piece=piece, parity=m, segments=index),
                     cfg.file_mode, cfg.cache_fsync)
        # parity_checksums of a whole symbol cannot be had without reading the base's parity:
        # the segment checksums stand in for them (SEGMENTS_ONLY; _parity_entries)
        self._write_info(deferred, step, manifest.ckpt_id, self.group, pos, m, piece, sizes, manifests,
                         [SEGMENTS_ONLY] * m, (seg, sums))

    def _materialize(self, step, ckpt_id, info):
        """Local: this rank's full parity of ``step`` from the base's parity and the delta,
        verified against ``info`` (the step's encoded.json) before it is renamed into place.
        Raises when the base is missing, does not match, or the result does not verify."""
        delta_path, index_path = self._delta_paths(step)
        idx = check_delta_info(storage.read_json(index_path), index_path)
        m, piece = info["parity"], info["piece"]
        segs, seg = check_parity_index(idx, m, piece, index_path)
        base_info = _check_info(storage.read_json(self._paths(idx["base_step"])[1]), self.comm.rank,
                                idx["base_step"], idx["base_ckpt_id"], self.comm.size, index_path)
        if base_info["piece"] != piece or base_info["parity"] != m:
            raise CorruptCheckpointError(f"{index_path}: the base has another layout")
        tmp = self._paths(step)[0] + ".tmp"
        shutil.copyfile(self._paths(idx["base_step"])[0], tmp)
        try:
            with open(tmp, "r+b") as f:
                f.truncate(m * piece)
                target = np.memmap(f, np.uint8, "r+", shape=(m * piece,))
                apply_segments(target, np.fromfile(delta_path, np.uint8), segs, seg, piece)
                target.flush()
                del target
            storage.verify_file(tmp, m * piece, parity_entries(info), self.cache._read_buffer())
            os.replace(tmp, self._paths(step)[0])
        finally:
            storage.remove_file(tmp)

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
            info = _check_info(info, self.comm.rank, step, ckpt_id, self.comm.size, info_path)
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


def _check_info(info, rank, step, ckpt_id, world_size, where):
    """Validate an encoded.json read back from disk."""
    from ..errors import CorruptCheckpointError

    def bad(msg):
        return CorruptCheckpointError(f"{where}: {msg}")
    if not isinstance(info, dict) or info.get("format") != FORMAT or info.get("version") != 1:
        raise bad("not an hpcckpt encoded-level file")
    if info.get("step") != step or info.get("ckpt_id") != ckpt_id:
        raise bad("belongs to another checkpoint")
    group = info.get("group")
    if (not isinstance(group, list) or not group or len(group) > 256
            or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world_size for r in group)
            or len(set(group)) != len(group) or rank not in group or info.get("position") != group.index(rank)):
        raise bad("bad group")
    m, piece = info.get("parity"), info.get("piece")
    if not isinstance(m, int) or not 0 <= m < len(group) or not isinstance(piece, int) or piece < 8 or piece % 8:
        raise bad("bad code parameters")
    sizes, manifests, checks = info.get("sizes"), info.get("manifests"), info.get("parity_checksums")
    if (not isinstance(sizes, list) or len(sizes) != len(group)
            or not all(isinstance(x, int) and 0 <= x <= piece * max(1, len(group) - m) for x in sizes)):
        raise bad("bad sizes")
    if not isinstance(manifests, list) or len(manifests) != len(group):
        raise bad("bad member manifests")
    if not isinstance(checks, list) or len(checks) != m or not all(isinstance(c, str) for c in checks):
        raise bad("bad parity checksums")
    if "segment_checksums" in info or any(c == SEGMENTS_ONLY for c in checks):
        seg = info.get("segment")
        if not isinstance(seg, int) or isinstance(seg, bool) or seg < 8 or not segment_sums_ok(info, m, piece, seg):
            raise bad("bad segment checksums")
    return info


def rebuild_plan(views, data_ok):
    """Local, pure: from every rank's ``(summary, parity_ok)`` (``summary``: the group, parity,
    piece, sizes and manifests of its ``encoded.json``, or None when it has none), the groups
    with ``losses`` set, or None when some loss is unrecoverable: a lost rank no survivor knows
    of, inconsistent groups, or more lost symbols in a stripe than the group has parity."""
    groups, covered = [], {}
    for summary, _ in views:
        if summary is None:
            continue
        key = tuple(summary["group"])
        if any(r in covered and covered[r] != key for r in key):
            return None     # inconsistent layouts: refuse rather than guess
        if key not in {tuple(g["group"]) for g in groups}:
            groups.append(dict(summary))
        for r in key:
            covered[r] = key
    for r, ok in enumerate(data_ok):
        if not ok and r not in covered:
            return None     # a lost rank no survivor knows about
    for g in groups:
        group, m = g["group"], g["parity"]
        k = len(group)
        lost_data = [not data_ok[r] for r in group]
        lost_parity = [views[r][1] is False or views[r][0] is None for r in group]
        g["losses"] = any(lost_data)
        if not g["losses"]:
            continue
        if m == 0:
            return None
        for s in range(k):
            gone = sum(1 for p in range(k)
                       if (lost_parity if p < m else lost_data)[stripe_symbol_owner(k, s, p)])
            if gone > m:
                return None
    return groups
