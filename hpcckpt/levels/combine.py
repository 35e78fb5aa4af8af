"""Gather symbols to the rank that computes from them, and combine them there (collective helper
for the encoded levels).

A *symbol* is a byte range of a file on one rank of a group: ``length`` bytes of which the first
``valid`` exist and the rest are zero (ranks protect different amounts of data). An *output* is a
symbol one rank computes as XOR_i c_i * input_i over GF(2^8) (plain XOR when every c_i is 1):
parity while encoding, a lost symbol while rebuilding. Every source sends its raw bytes straight
to the rank that computes (a persistent MPI send, ``comm.InFlight``, from a read-only memory
map of its file: no read copy; zero bytes are never sent), and that rank combines its inputs
with the fused kernel in one pass per segment and hands the result to a sink. Compared with a reduce-scatter of pre-multiplied blocks
this moves each needed symbol once, sends no zero blocks and does the arithmetic in our kernel.
"""
import mmap
import os

import numpy as np

from ..codecs.rs import gf_combine_into
from ..comm import InFlight
from ..errors import CorruptCheckpointError


def present(valid, offset, n):
    """Bytes of the segment [offset, offset + n) that exist in a symbol with ``valid`` bytes."""
    return max(0, min(n, valid - offset))


def map_range(path, offset, nbytes):
    """Local: a read-only uint8 view of ``nbytes`` of ``path`` from ``offset`` (memory-mapped).

    CorruptCheckpointError when the file is shorter (a map past the end would fault on use).
    """
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if size < offset + nbytes:
            raise CorruptCheckpointError(f"{path}: {size} bytes, {offset + nbytes} needed")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, offset + nbytes - start, prot=mmap.PROT_READ, offset=start)
        return np.frombuffer(mapped, np.uint8, nbytes, offset - start)   # unmapped when unused
    finally:
        os.close(fd)


class Buffers:
    """Scratch buffers kept between checkpoints (new memory is slow to touch here)."""

    def __init__(self):
        self._arrays = {}

    def get(self, name, nbytes):
        a = self._arrays.get(name)
        if a is None or a.nbytes < nbytes:
            a = self._arrays[name] = np.empty(max(nbytes, 8), np.uint8)
        return a[:nbytes]


def gather_combine(gcomm, length, seg, sends, outputs, buffers, deliveries=()):
    """Collective over ``gcomm``: compute every output of the group, ``seg`` bytes at a time.

    sends:      [(dest, tag, source, valid)]: a symbol of this rank that ``dest`` needs for its
                output ``tag``; ``source`` is a uint8 array of at least ``valid`` bytes, or None
                after a local error (zeros are sent, so the other ranks still finish).
    outputs:    [(tag, ins, local, sink)]: an output this rank computes from one symbol of each
                ``src`` in ins = [(src, valid, coef)] (never this rank) and, when ``local`` is
                (source, valid, coef), one symbol of its own. ``sink`` is either a callable
                ``sink(offset, view)``, called for each finished segment in order of offset, or
                (dest, tag): the result is forwarded to ``dest``, which lists it in deliveries.
    deliveries: [(src, tag, sink)]: finished symbols computed by ``src`` for this rank.
    Every symbol is ``length`` bytes. Tags are distinct per (source, destination) pair.
    """
    nin = max((len(ins) + 1 for _, ins, _, _ in outputs), default=0)
    recv = buffers.get("recv", len(outputs) * nin * seg).reshape(len(outputs), nin, seg)
    out = buffers.get("out", len(outputs) * seg).reshape(len(outputs), seg)
    got = buffers.get("delivered", len(deliveries) * seg).reshape(len(deliveries), seg)
    zeros = np.zeros(seg, np.uint8) if any(source is None for _, _, source, _ in sends) else None
    with InFlight() as flight:
        for off in range(0, length, seg):
            n = min(seg, length - off)
            inputs, later = [], []
            for o, (tag, ins, _, _) in enumerate(outputs):
                for i, (src, valid, _) in enumerate(ins):
                    v = present(valid, off, n)
                    if v:
                        inputs.append(flight.recv(gcomm, recv[o, i, :v], src, tag))
            for d, (src, tag, _) in enumerate(deliveries):
                later.append(flight.recv(gcomm, got[d, :n], src, tag))
            for dest, tag, source, valid in sends:
                v = present(valid, off, n)
                if v:
                    view = zeros[:v] if source is None else source[off:off + v]
                    later.append(flight.send(gcomm, view, dest, tag))
            flight.wait(inputs)
            for o, (tag, ins, local, sink) in enumerate(outputs):
                rows, coefs = [], []
                for i, (src, valid, coef) in enumerate(ins):
                    v = present(valid, off, n)
                    if v and coef:
                        if v < n:
                            recv[o, i, v:n] = 0
                        rows.append(recv[o, i, :n])
                        coefs.append(coef)
                if local is not None:
                    source, valid, coef = local
                    v = present(valid, off, n)
                    if v and coef:
                        row = recv[o, len(ins), :n]
                        if v == n and source is not None and not source[off:off + n].ctypes.data % 8:
                            row = source[off:off + n]
                        else:   # a short (zero-padded) or unaligned piece, or a failed source
                            row[:v] = 0 if source is None else source[off:off + v]
                            row[v:] = 0
                        rows.append(row)
                        coefs.append(coef)
                result = out[o, :n]
                result.fill(0)
                if rows:
                    gf_combine_into([result], np.array([coefs], np.uint8), rows)
                if callable(sink):
                    sink(off, result)
                else:
                    later.append(flight.send(gcomm, result, sink[0], sink[1]))
            flight.wait(later)
            for d, (_, _, sink) in enumerate(deliveries):
                sink(off, got[d, :n])
