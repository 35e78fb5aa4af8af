"""The Numba kernels of codecs.rs (imported on their first use: it imports Numba); the
algorithm is described in rs.py. ``cache=True``: later processes load the machine code from
the Numba cache."""
import numpy as np
from numba import carray, njit, prange

from .xor_kernel import _u64p, _u8p

CHUNK_BYTES = 8192
"""Bytes per chunk and block in the kernels' loops."""

_ONES = np.uint64(0x0101010101010101)
_S1, _S2, _S3, _S4 = np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4)
_S5, _S6, _S7, _S8 = np.uint64(5), np.uint64(6), np.uint64(7), np.uint64(8)


@njit(inline="always")
def _ex(t):
    """Bytes 0x00/0x01 -> 0x00/0xff (no carries cross bytes; the top byte wraps mod 2^64)."""
    return (t << _S8) - t


@njit(inline="always")
def _bits(x):
    """The 8 byte-wise masks of bits 0..7 of the bytes of x."""
    return (_ex(x & _ONES), _ex((x >> _S1) & _ONES), _ex((x >> _S2) & _ONES),
            _ex((x >> _S3) & _ONES), _ex((x >> _S4) & _ONES), _ex((x >> _S5) & _ONES),
            _ex((x >> _S6) & _ONES), _ex((x >> _S7) & _ONES))


@njit(inline="always")
def _dot(b, c):
    """c * x for the bytes of x given as bit masks b and c's broadcast multiples c * 2^i."""
    return ((b[0] & c[0]) ^ (b[1] & c[1]) ^ (b[2] & c[2]) ^ (b[3] & c[3])
            ^ (b[4] & c[4]) ^ (b[5] & c[5]) ^ (b[6] & c[6]) ^ (b[7] & c[7]))


@njit(inline="always")
def _consts(bc, j, i):
    return (bc[j, i, 0], bc[j, i, 1], bc[j, i, 2], bc[j, i, 3],
            bc[j, i, 4], bc[j, i, 5], bc[j, i, 6], bc[j, i, 7])


@njit(inline="always")
def _mac1(o0, d, L, ca):
    for w in range(L):
        b = _bits(d[w])
        o0[w] ^= _dot(b, ca)


@njit(inline="always")
def _mac2(o0, o1, d, L, ca, cb):
    for w in range(L):
        b = _bits(d[w])
        o0[w] ^= _dot(b, ca)
        o1[w] ^= _dot(b, cb)


@njit(inline="always")
def _mac3(o0, o1, o2, d, L, ca, cb, cc):
    for w in range(L):
        b = _bits(d[w])
        o0[w] ^= _dot(b, ca)
        o1[w] ^= _dot(b, cb)
        o2[w] ^= _dot(b, cc)


@njit(inline="always")
def _mac4(o0, o1, o2, o3, d, L, ca, cb, cc, cd):
    for w in range(L):
        b = _bits(d[w])
        o0[w] ^= _dot(b, ca)
        o1[w] ^= _dot(b, cb)
        o2[w] ^= _dot(b, cc)
        o3[w] ^= _dot(b, cd)


@njit(inline="always")
def _words_chunk(out_addrs, in_addrs, coeffs, bc, simple, off, L):
    """One chunk of L words at byte offset off, all inputs and outputs."""
    m = out_addrs.size
    for i in range(in_addrs.size):
        d = carray(_u64p(in_addrs[i] + off), (L,))
        if simple[i]:                       # coefficients 0/1 only: plain XOR
            for j in range(m):
                if coeffs[j, i]:
                    o = carray(_u64p(out_addrs[j] + off), (L,))
                    for w in range(L):
                        o[w] ^= d[w]
            continue
        j = 0
        while j < m:                        # outputs in groups of up to 4 share the bit masks
            r = m - j
            o0 = carray(_u64p(out_addrs[j] + off), (L,))
            if r == 1:
                _mac1(o0, d, L, _consts(bc, j, i))
                j += 1
            elif r == 2 or r == 6:
                o1 = carray(_u64p(out_addrs[j + 1] + off), (L,))
                _mac2(o0, o1, d, L, _consts(bc, j, i), _consts(bc, j + 1, i))
                j += 2
            elif r == 3 or r == 7:
                o1 = carray(_u64p(out_addrs[j + 1] + off), (L,))
                o2 = carray(_u64p(out_addrs[j + 2] + off), (L,))
                _mac3(o0, o1, o2, d, L, _consts(bc, j, i), _consts(bc, j + 1, i),
                      _consts(bc, j + 2, i))
                j += 3
            else:
                o1 = carray(_u64p(out_addrs[j + 1] + off), (L,))
                o2 = carray(_u64p(out_addrs[j + 2] + off), (L,))
                o3 = carray(_u64p(out_addrs[j + 3] + off), (L,))
                _mac4(o0, o1, o2, o3, d, L, _consts(bc, j, i), _consts(bc, j + 1, i),
                      _consts(bc, j + 2, i), _consts(bc, j + 3, i))
                j += 4


@njit(cache=True, nogil=True, boundscheck=False)
def _gf_kernel(out_addrs, in_addrs, coeffs, bc, simple, table, start, stop, words):
    """outs[j][start:stop] ^= XOR_i coeffs[j, i] * ins[i][start:stop] (addresses of uint8
    buffers). words: all buffers 8-byte aligned and start % 8 == 0."""
    pos = start
    if words:
        cw = CHUNK_BYTES // 8
        nw = (stop - start) // 8
        for c0 in range(0, nw, cw):
            _words_chunk(out_addrs, in_addrs, coeffs, bc, simple, start + c0 * 8, min(cw, nw - c0))
        pos = start + nw * 8
    # byte path: the tail, or everything for unaligned buffers (table lookups)
    for c0 in range(pos, stop, CHUNK_BYTES):
        L = min(CHUNK_BYTES, stop - c0)
        for i in range(in_addrs.size):
            d = carray(_u8p(in_addrs[i] + c0), (L,))
            for j in range(out_addrs.size):
                c = coeffs[j, i]
                if c == 0:
                    continue
                o = carray(_u8p(out_addrs[j] + c0), (L,))
                row = table[c]
                for w in range(L):
                    o[w] ^= row[d[w]]


@njit(cache=True, nogil=True, parallel=True)
def _gf_kernel_parallel(out_addrs, in_addrs, coeffs, bc, simple, table, nbytes, words, nparts):
    """_gf_kernel split into nparts contiguous byte ranges run on Numba's thread pool."""
    for t in prange(nparts):
        s = (nbytes * t // nparts) // 8 * 8
        e = nbytes if t == nparts - 1 else (nbytes * (t + 1) // nparts) // 8 * 8
        _gf_kernel(out_addrs, in_addrs, coeffs, bc, simple, table, s, e, words)
