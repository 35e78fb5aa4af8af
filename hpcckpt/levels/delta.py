"""Incremental redundancy (``incremental = true``): block digests, changed blocks, the base chain.

A redundant step of a level is either *full* (as without ``incremental``) or *incremental
against a base*: the newest full step of the same level in this run, whose step directory stays
on every node ("pinned", via the ``base`` field of each rank's manifest and ``pinned_steps``)
while a kept step refers to it. An incremental step is a cumulative differential against its
base (never against the previous incremental step), so losing any incremental step loses only
that step.

Each rank's committed data file is cut into ``incremental_block`` byte blocks; their XXH3-64
digests (one per block) are written beside the data, ``step_<S>/rank_<R>.blocks`` (raw little
endian, self-checksummed, docs/FORMAT.md). A block changed since the base when its digest
differs from the base's. The block digests only pick which blocks to send: every byte restored
from an incremental step is verified against the per-array checksums of that step's manifest
(levels rebuild the full redundancy from base + delta, then verify as for a full step).

A rank's data may change size between its base and an incremental step (a growing history, a
state whose arrays change length): the blocks whole in both are compared, every later block is
sent, and the rebuilt copy is the base's cut or extended to the new size before the blocks are
written (xor/rs: the bytes past a rank's end are zeros). Arrays keep their offsets in the data
file while the arrays before them stay within their 4 KiB alignment; an array that moves makes
the blocks after it count as changed.

Whether a step is incremental is decided collectively (one fixed-size reduction): all ranks of
the level's communicator must have the same base and readable base files (the encoded levels
also pieces of the base's size), no rank may have changed more than
``incremental_max_changed`` of its blocks, and fewer than ``incremental_full_every`` incremental
steps may have followed the base.
"""
import dataclasses
import os
import struct

import numpy as np
import xxhash

from .. import data_file, manifest as mf, storage
from ..errors import CorruptCheckpointError

MAGIC = b"HCKBLKS1"
SEGMENTS_ONLY = "segments"   # parity_checksums of an incremental xor/rs step: see segment_checksums
_HEADER = struct.Struct("<8sQQQ")        # magic, block bytes, data bytes, number of blocks
DELTA_FORMAT = "hpcckpt-delta"


# ---------------------------------------------------------------------- block digests (local, pure)
def block_count(size, block):
    return -(-size // block)


def block_digests(data, block):
    """Local, pure: the XXH3-64 digest of each ``block``-byte block of the uint8 array ``data``
    (the last block may be shorter), as a uint64 array. The xxhash library hashes at memory
    speed; ``block_digests_reference`` is the NumPy reference the tests compare it with."""
    n = block_count(data.size, block)
    out = np.empty(n, np.uint64)
    digest = xxhash.xxh3_64_intdigest
    for i in range(n):
        out[i] = digest(data[i * block:(i + 1) * block])
    return out


class BlockDigester:
    """Local: the block digests of a data file being written (data_file.write_arrays), taken from
    each array's source bytes as soon as the copy has passed a whole block of the file that lies
    inside that array (``chunk``, the write's on_chunk: those bytes are still in the CPU cache),
    and from the file itself for the rest (blocks across arrays or gaps; ``finish``). The same
    digests as block_digests of the whole file."""

    def __init__(self, arrays, block):
        layout, self.size = data_file.file_layout(arrays)
        self.offsets = [off for _, off, _ in layout]
        self.block = block
        self.digests = np.empty(block_count(self.size, block), np.uint64)
        self.done = np.zeros(self.digests.size, bool)
        self._next = [-(-off // block) for off in self.offsets]    # per array: its next whole block

    def chunk(self, i, final, source):
        off, b, end = self.offsets[i], self.block, self.offsets[i] + source.size
        k = self._next[i]
        digest = xxhash.xxh3_64_intdigest
        while k < self.digests.size:
            lo, hi = k * b, min((k + 1) * b, self.size)
            if hi > end:
                break
            self.digests[k] = digest(source[lo - off:hi - off])
            self.done[k] = True
            k += 1
        self._next[i] = k

    def finish(self, file_bytes):
        """The digests, those not taken during the copy hashed from the file now."""
        b = self.block
        for k in np.flatnonzero(~self.done):
            self.digests[k] = xxhash.xxh3_64_intdigest(file_bytes[k * b:(k + 1) * b])
        return self.digests


def block_digests_reference(data, block):
    """Local, pure: the same digests from hpcckpt's NumPy XXH3 (codecs/xxh3.py), which covers
    inputs over 240 bytes; a shorter last block is left to the xxhash library there too."""
    from ..codecs.xxh3 import MIDSIZE_MAX, xxh3_64_numpy
    pieces = [np.ascontiguousarray(data[i:i + block]) for i in range(0, data.size, block)]
    return np.array([xxh3_64_numpy(p) if p.size > MIDSIZE_MAX else xxhash.xxh3_64_intdigest(p) for p in pieces],
                    np.uint64)


def changed_blocks(new, old, size=None, base_size=None, block=None):
    """Local, pure: the indices (int64, ascending) of the blocks whose digests differ. When the
    data changed size (``size`` != ``base_size``), only the blocks whole in both are compared;
    every later block of the new data counts as changed."""
    new, old = np.asarray(new), np.asarray(old)
    if size == base_size:
        return np.flatnonzero(new != old).astype(np.int64)
    common = min(size, base_size) // block
    return np.concatenate([np.flatnonzero(new[:common] != old[:common]),
                           np.arange(common, new.size)]).astype(np.int64)


def tail_blocks(size, base_size, block):
    """Local, pure: the first block an incremental step must send whole when its data has
    ``size`` bytes and its base's ``base_size`` (every block from there on; none when equal)."""
    return block_count(size, block) if size == base_size else min(size, base_size) // block


def block_ranges(blocks, block, size):
    """Local, pure: [(offset, nbytes)] in the data of each block index in ``blocks``."""
    return [(int(b) * block, min(block, size - int(b) * block)) for b in blocks]


def delta_bytes(blocks, block, size):
    """Local, pure: the bytes of the changed ``blocks`` (the last block of the data may be short)."""
    return sum(n for _, n in block_ranges(blocks, block, size))


def stream_reader(data, blocks, block):
    """Local: ``read(buf, offset)`` filling ``buf`` with the bytes from ``offset`` of the stream
    made of the changed ``blocks`` of ``data`` (a uint8 array), in ascending block order."""
    size = data.size

    def read(buf, offset):
        done = 0
        while done < buf.size:
            i, within = divmod(offset + done, block)
            start = int(blocks[i]) * block + within
            n = min(buf.size - done, block - within, size - start)
            buf[done:done + n] = data[start:start + n]
            done += n
    return read


def apply_blocks(target, delta, blocks, block, size):
    """Local, pure: write the compact ``delta`` (the changed blocks, concatenated) into the
    uint8 array ``target`` of ``size`` bytes at the offsets of ``blocks``."""
    pos = 0
    if delta_bytes(blocks, block, size) != delta.size:
        raise CorruptCheckpointError(f"the delta has {delta.size} bytes, its index "
                                     f"{delta_bytes(blocks, block, size)}")
    for off, n in block_ranges(blocks, block, size):
        target[off:off + n] = delta[pos:pos + n]
        pos += n
    if pos != delta.size:
        raise CorruptCheckpointError(f"the delta has {delta.size} bytes, its index {pos}")


# ---------------------------------------------------------------------- the digests file
def write_digests(path, block, size, digests, mode, fsync=False):
    """Local: write the block digests file atomically (header, digests, XXH3-64 of both)."""
    body = _HEADER.pack(MAGIC, block, size, digests.size) + digests.astype("<u8").tobytes()
    storage.atomic_write_bytes(path, body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body)), mode, fsync)


def read_digests(path, block, size):
    """Local: the digests of ``path`` when it is intact and describes ``size`` bytes in
    ``block``-byte blocks, else None (a missing or damaged base is not an error: the step is
    then taken in full)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_HEADER.size + 8 * block_count(size, block) + 8 + 1)
    except OSError:
        return None
    if len(raw) < _HEADER.size + 8:
        return None
    body, check = raw[:-8], struct.unpack("<Q", raw[-8:])[0]
    magic, b, s, n = _HEADER.unpack(body[:_HEADER.size])
    if (magic != MAGIC or b != block or s != size or n != block_count(size, block)
            or len(body) != _HEADER.size + 8 * n or xxhash.xxh3_64_intdigest(body) != check):
        return None
    return np.frombuffer(body, "<u8", n, _HEADER.size).astype(np.uint64)


def digests_path(cache, step):
    return os.path.join(cache.step_dir(step), f"rank_{cache.rank:06d}.blocks")


# ---------------------------------------------------------------------- the delta index (JSON)
def delta_info(base_step, base_ckpt_id, block, size, blocks, base_size=None, **extra):
    """The JSON document describing one delta file (``base_size``: the base's data size when it
    differs from ``size``; ``extra``: level-specific keys)."""
    doc = {"format": DELTA_FORMAT, "version": 1, "base_step": int(base_step), "base_ckpt_id": base_ckpt_id,
           "block": int(block), "data_size": int(size), "blocks": [int(b) for b in blocks]}
    if base_size is not None and base_size != size:
        doc["base_size"] = int(base_size)
    doc.update(extra)
    return doc


def check_delta_info(doc, where):
    """Validate a delta index read back from disk; CorruptCheckpointError when it is not one."""
    def ok_int(v, low=0):
        return isinstance(v, int) and not isinstance(v, bool) and v >= low
    if (not isinstance(doc, dict) or doc.get("format") != DELTA_FORMAT or doc.get("version") != 1
            or not ok_int(doc.get("base_step")) or not isinstance(doc.get("base_ckpt_id"), str)
            or not ok_int(doc.get("block"), 1) or not ok_int(doc.get("data_size"))
            or not isinstance(doc.get("blocks"), list) or not ok_int(doc.get("base_size", 0))):
        raise CorruptCheckpointError(f"{where}: not an hpcckpt delta index")
    doc.setdefault("base_size", doc["data_size"])     # absent: the base has the step's size
    n = block_count(doc["data_size"], doc["block"])
    blocks = doc["blocks"]
    if not all(ok_int(b) and b < n for b in blocks) or any(a >= b for a, b in zip(blocks, blocks[1:])):
        raise CorruptCheckpointError(f"{where}: bad block list")
    tail = tail_blocks(doc["data_size"], doc["base_size"], doc["block"])
    if n - tail > len(blocks) or blocks[len(blocks) - (n - tail):] != list(range(tail, n)):
        raise CorruptCheckpointError(f"{where}: the data changed size, but its new blocks are not all in the delta")
    return doc


# ---------------------------------------------------------------------- the chain of one level
@dataclasses.dataclass
class Plan:
    """What one encode does: ``base`` (step, ckpt_id) when incremental (else None), this rank's
    digests of the new step and the blocks changed since the base (None when full)."""
    base: tuple
    base_size: int              # the base's data size (when incremental)
    digests: np.ndarray
    changed: np.ndarray
    data: np.ndarray            # the mapped data of the new step (None after a local error)

    @property
    def incremental(self):
        return self.base is not None


class Chain:
    """The base of one level for one Checkpointer (in memory: the first redundant step of a run,
    and the first after a restart, is full)."""

    def __init__(self, cache):
        self.cache, self.cfg = cache, cache.cfg
        self.base = None         # (step, ckpt_id, data_size) of the newest full step encoded
        self.since = 0           # incremental steps encoded since the base

    def pinned(self):
        """Local: the steps that must stay (the current base)."""
        return () if self.base is None else (self.base[0],)

    def plan(self, comm, step, manifest, deferred, extra_ok=None):
        """Collective over ``comm`` (one fixed-size reduction): digest this rank's data of
        ``step`` (written to its digests file) and decide, with every rank, whether ``step`` is
        incremental. ``extra_ok()``: a level's own check that it can apply a delta (the base
        copies or parity it holds exist). Local errors go to ``deferred``."""
        cfg, size = self.cfg, manifest.data_size
        data = deferred.run(_map, self.cache.data_path(step), size)
        known = self.cache.block_digests        # computed by the local write while the file was mapped
        if known is not None and known[0] == step and known[1] == cfg.incremental_block \
                and known[2].size == block_count(size, cfg.incremental_block):
            digests = known[2]
        else:
            digests = deferred.run(block_digests, data, cfg.incremental_block) if data is not None else None
        if digests is not None:
            deferred.run(write_digests, digests_path(self.cache, step), cfg.incremental_block, size, digests,
                         cfg.file_mode, cfg.cache_fsync)
        changed, ok = None, False
        if self.base is not None and digests is not None and deferred.error is None \
                and self.since < cfg.incremental_full_every:
            base_step, _, base_size = self.base
            old = read_digests(digests_path(self.cache, base_step), cfg.incremental_block, base_size)
            if old is not None:
                changed = changed_blocks(digests, old, size, base_size, cfg.incremental_block)
                try:    # a base that is missing or of another layout: this step is full
                    ok = extra_ok is None or bool(extra_ok(base_step))
                except (OSError, ValueError, KeyError, TypeError, CorruptCheckpointError):
                    ok = False
        nblocks = max(1, block_count(size, cfg.incremental_block))
        frac = 0 if changed is None else -(-len(changed) * 1_000_000 // nblocks)
        mine = -1 if self.base is None else self.base[0]
        from mpi4py import MPI      # here: `hpcckpt verify` reads deltas without MPI
        words = np.array([0 if ok else 1, frac, mine, -mine], np.int64)
        comm.Allreduce(MPI.IN_PLACE, words, op=MPI.MAX)
        incremental = (words[0] == 0 and words[2] == -words[3] and words[2] >= 0      # decided on reduced
                       and words[1] <= cfg.incremental_max_changed * 1_000_000)      # values only: the same everywhere
        base = (self.base[0], self.base[1]) if incremental else None
        return Plan(base, self.base[2] if incremental else None, digests, changed if incremental else None, data)

    def done(self, plan, manifest):
        """Local: ``manifest``'s step was encoded as ``plan`` on this rank (the level raises on every
        rank otherwise, and a step that fails is discarded: its base is never used)."""
        if plan.incremental:
            self.since += 1
        else:
            self.base, self.since = (manifest.step, manifest.ckpt_id, manifest.data_size), 0

    def forget(self):
        """Local: the next step is full (after a failed encode)."""
        self.base, self.since = None, 0


def _map(path, size):
    from .combine import map_range
    return map_range(path, 0, size)


# ---------------------------------------------------------------------- encoded levels (xor, rs)
def piece_segments(blocks, block, size, q, piece, seg):
    """Local, pure: the ``seg``-byte segments (indices within the piece, ascending) of data piece
    ``q`` (bytes [q * piece, (q + 1) * piece) of a ``size``-byte file) that overlap the changed
    ``blocks``."""
    lo_piece, hi_piece = q * piece, min((q + 1) * piece, size)
    out = set()
    for b in blocks:
        lo, hi = max(int(b) * block, lo_piece), min((int(b) + 1) * block, size, hi_piece)
        if lo < hi:
            out.update(range((lo - lo_piece) // seg, (hi - 1 - lo_piece) // seg + 1))
    return sorted(out)


def segment_length(t, seg, piece):
    """Bytes of segment ``t`` of a ``piece``-byte symbol (the last one may be shorter)."""
    return min(seg, piece - t * seg)


def apply_segments(target, delta, segments, seg, piece):
    """Local, pure: write the parity delta (the changed segments of each parity j, round by
    round: the i-th of parity 0, the i-th of parity 1, ...) into ``target``, the m parity
    symbols of ``piece`` bytes back to back. CorruptCheckpointError when the sizes disagree."""
    pos = 0
    for i in range(max(map(len, segments), default=0)):
        for j, segs in enumerate(segments):
            if i < len(segs):
                t = segs[i]
                n = segment_length(t, seg, piece)
                if pos + n > delta.size:
                    raise CorruptCheckpointError(f"the parity delta has {delta.size} bytes, its index more")
                target[j * piece + t * seg:j * piece + t * seg + n] = delta[pos:pos + n]
                pos += n
    if pos != delta.size:
        raise CorruptCheckpointError(f"the parity delta has {delta.size} bytes, its index {pos}")


def check_parity_index(idx, m, piece, where):
    """Validate the parity-specific keys of a parity delta index; returns (segments, segment)."""
    segs, seg = idx.get("segments"), idx.get("segment")
    if (idx.get("piece") != piece or idx.get("parity") != m or not isinstance(seg, int) or isinstance(seg, bool)
            or seg < 1 or not isinstance(segs, list) or len(segs) != m
            or not all(isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                                   and 0 <= t * seg < piece for t in x)
                       and all(a < b for a, b in zip(x, x[1:])) for x in segs)):
        raise CorruptCheckpointError(f"{where}: bad parity delta index")
    return segs, seg


def materialize_held(held_dir, name, size):
    """Local: the full bytes (uint8 array of ``size``) of held file ``name`` (``partner_<R>.dat``
    or ``parity.dat``) of an incremental step from the base step's file and the delta beside it
    (``hpcckpt verify``). Raises CorruptCheckpointError or OSError when that cannot be done; the
    caller verifies the result against its checksums."""
    stem = name[:-4]
    index_path = os.path.join(held_dir, stem + ".delta.json")
    idx = check_delta_info(storage.read_json(index_path), index_path)
    step_dir = os.path.dirname(os.path.abspath(held_dir))
    base_held = os.path.join(os.path.dirname(step_dir), mf.step_dir_name(idx['base_step']), os.path.basename(held_dir))
    base = np.fromfile(os.path.join(base_held, name), np.uint8)
    if base.size != idx["base_size"] or idx["data_size"] != size:
        raise CorruptCheckpointError(f"{index_path}: the base step {idx['base_step']} has no {name} of "
                                     f"{idx['base_size']} bytes")
    if base.size != size:          # the data changed size: the base cut or extended with zeros
        base = np.concatenate([base[:size], np.zeros(max(0, size - base.size), np.uint8)])
    delta = np.fromfile(os.path.join(held_dir, stem + ".delta"), np.uint8)
    if name == "parity.dat":
        m = idx.get("parity")
        piece = idx.get("piece")
        if not isinstance(m, int) or not isinstance(piece, int) or m < 1 or m * piece != size:
            raise CorruptCheckpointError(f"{index_path}: bad parity delta index")
        segs, seg = check_parity_index(idx, m, piece, index_path)
        apply_segments(base, delta, segs, seg, piece)
    else:
        apply_blocks(base, delta, idx["blocks"], idx["block"], size)
    return base


def segment_sums_ok(info, m, piece, seg):
    """Local, pure: ``info`` has a checksum for each ``seg``-byte segment of its m parities."""
    sums, nseg = info.get("segment_checksums"), -(-piece // seg)
    return (info.get("segment") == seg and isinstance(sums, list) and len(sums) == m
            and all(isinstance(x, list) and len(x) == nseg and all(isinstance(c, str) and c for c in x) for x in sums))


def parity_entries(info):
    """Local, pure: what parity.dat of a validated encoded.json is checked against, as (name,
    offset, nbytes, checksum): a checksum per parity symbol, or per segment of each symbol
    (incremental steps: ``segment_checksums``; full steps with ``incremental`` have both, and
    the whole-symbol ones are used)."""
    m, piece = info["parity"], info["piece"]
    if m and all(c == SEGMENTS_ONLY for c in info["parity_checksums"]):
        seg = info["segment"]
        return [(f"parity {j} segment {t}", j * piece + t * seg, min(seg, piece - t * seg), c)
                for j, sums in enumerate(info["segment_checksums"]) for t, c in enumerate(sums)]
    return [(f"parity {j}", j * piece, piece, c) for j, c in enumerate(info["parity_checksums"])]
