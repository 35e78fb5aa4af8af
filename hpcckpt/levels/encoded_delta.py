"""The incremental parity update of the encoded levels (xor, rs), with ``incremental``
(levels/delta.py: the block digests and the chain of base steps).

An incremental step holds, instead of ``parity.dat``, only the parity segments that change
against the base step B: XOR and RS are linear, so a parity segment of step S is B's parity
segment XOR_q coef_q * (d_S ⊕ d_B) over the data pieces q of its stripe, and only owners whose
blocks changed send their d_S ⊕ d_B (B's data is pinned on every node). ``parity.delta`` holds
the new segments and ``parity.delta.json`` their index; the ``parity_checksums`` of
``encoded.json`` are those of the whole parity of S. A rebuild first makes ``parity.dat`` (B's
parity + the segments) and verifies it against them, then proceeds as for a full step.
"""
import os
import shutil

import numpy as np
import xxhash

from .. import faults, storage
from ..codecs.rs import gf_combine_into
from ..comm import InFlight
from ..errors import CorruptCheckpointError
from .delta import (SEGMENTS_ONLY, apply_segments, block_count, check_delta_info, check_parity_index, delta_info,
                    parity_entries, piece_segments, segment_length, segment_sums_ok)
from .encoded_layout import check_info, code_matrix, stripe_symbol_owner
from .transfer import read_range

TAG_DELTA = 7200
WAVE_BYTES = 64 << 20    # buffers of one wave of an incremental encode (IncrementalParity._encode_delta)


class IncrementalParity:
    """The incremental half of EncodedLevel (levels/encoded.py), which it is mixed into: these
    methods use the level's ``cache``, ``comm``, ``group``, ``_buffers``, ``sent``, ``_paths``,
    ``_delta_paths``, ``_piece`` and ``_write_info``."""

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
        # the data of both steps from the mappings their writes left open (data_file.Mappings), else
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
        base_info = check_info(storage.read_json(self._paths(idx["base_step"])[1]), self.comm.rank,
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
