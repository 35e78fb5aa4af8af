"""Gather symbols to the rank that computes from them, and combine them there (collective helper
for the encoded levels).

A *symbol* is a byte range of a file on one rank of a group: ``length`` bytes of which the first
``valid`` exist and the rest are zero (ranks protect different amounts of data). An *output* is a
symbol one rank computes as XOR_i c_i * input_i over GF(2^8) (plain XOR when every c_i is 1):
parity while encoding, a lost symbol while rebuilding. Every source sends its raw bytes straight
to the rank that computes (MPI Isend from a read-only memory map of its file: no read copy; zero
bytes are never sent), and that rank combines its inputs with the fused kernel in one pass per
segment and hands the result to a sink. Compared with a reduce-scatter of pre-multiplied blocks
this moves each needed symbol once, sends no zero blocks and does the arithmetic in our kernel.
"""
import mmap
import os

import numpy as np
from mpi4py import MPI

from ..codecs.rs import gf_combine_into
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


def gather_combine(gcomm, length, seg, sends, outputs, buffers):
    """Collective over ``gcomm``: compute every output of the group, ``seg`` bytes at a time.

    sends:   [(dest, tag, source, valid)]: a symbol of this rank that ``dest`` needs for its
             output ``tag``; ``source`` is a uint8 array of at least ``valid`` bytes, or None
             after a local error (zeros are sent, so the other ranks still finish).
    outputs: [(tag, [(src, valid, coef)], sink)]: an output this rank computes from one symbol of
             each ``src`` (never this rank); ``sink(offset, view)`` gets each finished segment,
             in order of offset.
    Every symbol is ``length`` bytes. The tags of one destination are distinct per source.
    """
    nin = max((len(ins) for _, ins, _ in outputs), default=0)
    recv = buffers.get("recv", len(outputs) * nin * seg).reshape(len(outputs), nin, seg)
    out = buffers.get("out", len(outputs) * seg).reshape(len(outputs), seg)
    zeros = None
    for off in range(0, length, seg):
        n = min(seg, length - off)
        requests = []
        for o, (tag, ins, _) in enumerate(outputs):
            for i, (src, valid, _) in enumerate(ins):
                v = present(valid, off, n)
                if v:
                    requests.append(gcomm.Irecv(recv[o, i, :v], source=src, tag=tag))
        for dest, tag, source, valid in sends:
            v = present(valid, off, n)
            if not v:
                continue
            if source is None:
                if zeros is None:
                    zeros = np.zeros(seg, np.uint8)
                view = zeros[:v]
            else:
                view = source[off:off + v]
            requests.append(gcomm.Isend(view, dest=dest, tag=tag))
        MPI.Request.Waitall(requests)
        for o, (tag, ins, sink) in enumerate(outputs):
            rows, coefs = [], []
            for i, (src, valid, coef) in enumerate(ins):
                v = present(valid, off, n)
                if v and coef:
                    if v < n:
                        recv[o, i, v:n] = 0
                    rows.append(recv[o, i, :n])
                    coefs.append(coef)
            result = out[o, :n]
            result.fill(0)
            if rows:
                gf_combine_into([result], np.array([coefs], np.uint8), rows)
            sink(off, result)
