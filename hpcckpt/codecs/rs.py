"""Reed-Solomon erasure code over GF(2^8) (the RS level's arithmetic). Local and pure.

Code: systematic MDS code with k data blocks and m parity blocks, generator
``encoding_matrix(k, m)`` = [I_k ; P] with P = ``rs_parity_matrix(k, m)`` (a normalised Cauchy
matrix, see gf256.cauchy_matrix). Block b (0 <= b < k + m) is data block b for b < k and
parity block b - k otherwise; parity_j = XOR_i P[j, i] * data_i, byte by byte. All blocks have
the same length n (padding is the caller's job). Any k of the k + m blocks recover the data.

Kernel: ``_gf_kernel`` computes outs[j] ^= XOR_i C[j, i] * ins[i] for all j and i in one pass
over the inputs: the buffers are walked in chunks that stay in L1 cache, and within a chunk
each 8-byte word x of an input is split once into its 8 bit-masks (byte-wise 0x00/0xff masks of
bit b, shared by all outputs) and each product is XOR_b (mask_b & broadcast(c * 2^b)); plain
uint64 operations that LLVM vectorises (SWAR, no table lookups). Inputs whose coefficients are
all 0 or 1 (data block 0 and parity 0 with the normalised Cauchy matrix) take a plain XOR path.
Unaligned buffers and the n % 8 tail use the 256 x 256 multiplication table byte by byte.
Compiled lazily on first call, ``cache=True``. NumPy references (``*_numpy``) sit beside.
"""
import numbers

import numba
import numpy as np
from numba import carray, njit, prange

from ..errors import HpcCkptError
from .gf256 import MUL_TABLE, cauchy_matrix, check_code_params, encoding_matrix, gf_matinv
from .xor import _check_vector, _u64p, _u8p

CHUNK_BYTES = 8192
"""Bytes per chunk and block in the kernel's loops."""

PARALLEL_MIN_BYTES = 1 << 20
"""With threads > 1, buffers shorter than this still run on one thread."""

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


def _broadcast_consts(coeffs):
    """bc[j, i, b] = (coeffs[j, i] * 2^b) repeated in all 8 bytes of a uint64."""
    powers = (1 << np.arange(8)).astype(np.uint8)
    prod = MUL_TABLE[coeffs[:, :, None], powers[None, None, :]]
    return prod.astype(np.uint64) * np.uint64(0x0101010101010101)


def _as_coeffs(coeffs, shape, name="coeffs"):
    c = np.asarray(coeffs)
    if c.shape != shape:
        raise HpcCkptError(f"{name} must have shape {shape}, got {c.shape}")
    if c.dtype != np.uint8:
        if c.size and (not np.issubdtype(c.dtype, np.integer) or c.min() < 0 or c.max() > 255):
            raise HpcCkptError(f"{name} must hold GF(256) elements (ints 0..255)")
        c = c.astype(np.uint8)
    return np.ascontiguousarray(c)


def _as_rows(arrs, name, n=None, writeable=False):
    """A 2-D uint8 array with contiguous rows, or a sequence of 1-D uint8 arrays -> list of rows."""
    if isinstance(arrs, np.ndarray):
        if arrs.ndim != 2 or arrs.dtype != np.uint8:
            raise HpcCkptError(f"{name} must be a 2-D uint8 array or a list of 1-D uint8 arrays")
        rows = list(arrs)
    elif isinstance(arrs, (list, tuple)):
        rows = list(arrs)
    else:
        raise HpcCkptError(f"{name} must be a 2-D uint8 array or a list of 1-D uint8 arrays")
    if n is None and rows:
        n = getattr(rows[0], "size", None)
    for r, a in enumerate(rows):
        _check_vector(a, f"{name}[{r}]", n=n, writeable=writeable)
    return rows


def _resolve_threads(threads, nbytes):
    if isinstance(threads, (bool, np.bool_)) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise HpcCkptError(f"threads must be an int >= 1, got {threads!r}")
    if threads == 1 or nbytes < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(int(threads), numba.get_num_threads()))


def _combine(out_rows, in_rows, coeffs, threads=1):
    """Core: out_rows[j] ^= XOR_i coeffs[j, i] * in_rows[i] (validated rows, uint8 coeffs)."""
    if not out_rows or not in_rows:
        return
    n = out_rows[0].size
    if n == 0:
        return
    for j, o in enumerate(out_rows):
        for i, d in enumerate(in_rows):
            if np.may_share_memory(o, d):
                raise HpcCkptError(f"output {j} overlaps input {i}")
    out_addrs = np.array([o.ctypes.data for o in out_rows], dtype=np.int64)
    in_addrs = np.array([d.ctypes.data for d in in_rows], dtype=np.int64)
    words = not (np.any(out_addrs % 8) or np.any(in_addrs % 8))
    bc = _broadcast_consts(coeffs)
    simple = np.all(coeffs <= 1, axis=0)
    nt = _resolve_threads(threads, n)
    if nt > 1:
        _gf_kernel_parallel(out_addrs, in_addrs, coeffs, bc, simple, MUL_TABLE, n, words, nt)
    else:
        _gf_kernel(out_addrs, in_addrs, coeffs, bc, simple, MUL_TABLE, 0, n, words)


def gf_combine_into(outs, coeffs, inputs, *, threads=1):
    """outs[j] ^= XOR_i coeffs[j, i] * inputs[i] over GF(256), for all j, in one pass.

    Local; writes only outs. outs: (m, n) uint8 array with contiguous rows or a list of m 1-D
    uint8 arrays; inputs: (k, n) array or list of k 1-D arrays (read only); coeffs: (m, k)
    ints 0..255. Outputs must not overlap inputs. threads > 1 splits buffers of at least
    PARALLEL_MIN_BYTES over Numba's thread pool (leave 1 when every core runs an MPI rank).
    Returns outs.
    """
    out_rows = _as_rows(outs, "outs", writeable=True)
    n = out_rows[0].size if out_rows else None
    in_rows = _as_rows(inputs, "inputs", n=n)
    c = _as_coeffs(coeffs, (len(out_rows), len(in_rows)))
    _combine(out_rows, in_rows, c, threads)
    return outs


def gf_mul_xor_into(outs, coeffs, data, *, threads=1):
    """outs[j] ^= coeffs[j] * data for every j, in one pass over data. Local; writes outs.

    The distributed-encoding primitive: a rank holding data block i calls it with
    coeffs = rs_parity_matrix(k, m)[:, i] and XOR-reduces outs across the group.
    outs: (m, n) uint8 (contiguous rows) or list of m 1-D uint8; coeffs: m ints 0..255;
    data: 1-D uint8 of length n. Returns outs.
    """
    out_rows = _as_rows(outs, "outs", writeable=True)
    _check_vector(data, "data", n=out_rows[0].size if out_rows else None)
    c = _as_coeffs(np.asarray(coeffs).reshape(-1), (len(out_rows),)).reshape(-1, 1)
    _combine(out_rows, [data], c, threads)
    return outs


def gf_mul_xor_into_numpy(outs, coeffs, data):
    """NumPy reference of gf_mul_xor_into (MUL_TABLE fancy indexing, one temporary). Local."""
    out_rows = _as_rows(outs, "outs", writeable=True)
    _check_vector(data, "data", n=out_rows[0].size if out_rows else None)
    c = _as_coeffs(np.asarray(coeffs).reshape(-1), (len(out_rows),))
    for j, o in enumerate(out_rows):
        o ^= MUL_TABLE[c[j]][data]
    return outs


def gf_combine_into_numpy(outs, coeffs, inputs):
    """NumPy reference of gf_combine_into. Local."""
    out_rows = _as_rows(outs, "outs", writeable=True)
    in_rows = _as_rows(inputs, "inputs", n=out_rows[0].size if out_rows else None)
    c = _as_coeffs(coeffs, (len(out_rows), len(in_rows)))
    for j, o in enumerate(out_rows):
        for i, d in enumerate(in_rows):
            o ^= MUL_TABLE[c[j, i]][d]
    return outs


def rs_parity_matrix(k, m):
    """The m x k uint8 parity coefficients P[j, i] of the (k, m) code. Local, pure."""
    return cauchy_matrix(k, m)


def _check_data(data_blocks):
    if not isinstance(data_blocks, np.ndarray) or data_blocks.ndim != 2 or data_blocks.dtype != np.uint8:
        raise HpcCkptError("data_blocks must be a (k, n) uint8 array")
    if data_blocks.shape[1] > 1 and data_blocks.strides[1] != 1:
        raise HpcCkptError("data_blocks rows must be contiguous")
    return data_blocks


def rs_encode(data_blocks, m, *, threads=1):
    """Parity of k data blocks: (k, n) uint8 -> new (m, n) uint8 array. Local, pure.

    parity[j] = XOR_i P[j, i] * data_blocks[i] with P = rs_parity_matrix(k, m); all m
    parities in one pass over the data.
    """
    data = _check_data(data_blocks)
    k, m = check_code_params(data.shape[0], m)
    parity = np.zeros((m, data.shape[1]), dtype=np.uint8)
    _combine(list(parity), list(data), rs_parity_matrix(k, m), threads)
    return parity


def rs_encode_numpy(data_blocks, m):
    """NumPy reference of rs_encode. Local, pure."""
    data = _check_data(data_blocks)
    k, m = check_code_params(data.shape[0], m)
    p = rs_parity_matrix(k, m)
    parity = np.zeros((m, data.shape[1]), dtype=np.uint8)
    for j in range(m):
        for i in range(k):
            parity[j] ^= MUL_TABLE[p[j, i]][data[i]]
    return parity


def _check_indices(indices, k, m, name):
    out = []
    for b in indices:
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, numbers.Integral) or not 0 <= b < k + m:
            raise HpcCkptError(f"{name}: block index {b!r} is not an int in 0..{k + m - 1}")
        out.append(int(b))
    if len(set(out)) != len(out):
        raise HpcCkptError(f"{name}: repeated block index in {out}")
    return out


def rs_decode_coefficients(k, m, present_indices, lost_data_indices):
    """How to rebuild lost data blocks from k surviving blocks. Local, pure.

    present_indices: the indices (0 <= b < k + m; data b < k, parity b - k otherwise) of the
    blocks available; lost_data_indices: the data indices (< k) to rebuild.
    Returns (used, coeffs): ``used`` is the sorted tuple of the k present indices chosen (the
    lowest ones, so data blocks are preferred), ``coeffs`` a (len(lost_data_indices), k) uint8
    matrix with data[lost[r]] = XOR_s coeffs[r, s] * block[used[s]].
    In a distributed decode the rank holding block used[s] multiplies it by coeffs[:, s]
    (gf_mul_xor_into) and the results are XOR-reduced.
    Raises HpcCkptError when fewer than k blocks are present.
    """
    k, m = check_code_params(k, m)
    present = sorted(_check_indices(present_indices, k, m, "present_indices"))
    lost = _check_indices(lost_data_indices, k, m, "lost_data_indices")
    for b in lost:
        if b >= k:
            raise HpcCkptError(f"lost_data_indices: {b} is a parity index (data indices are < {k})")
    if len(present) < k:
        raise HpcCkptError(f"cannot decode: only {len(present)} of the {k + m} blocks are present, "
                           f"a ({k}, {m}) code needs {k} (at most {m} may be lost)")
    used = tuple(present[:k])
    inv = gf_matinv(encoding_matrix(k, m)[list(used)])
    return used, np.ascontiguousarray(inv[lost], dtype=np.uint8)


def _check_blocks(blocks, k, m, n):
    if not isinstance(blocks, dict):
        raise HpcCkptError("blocks must be a dict {block index: 1-D uint8 array}")
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or n < 0:
        raise HpcCkptError(f"n must be an int >= 0, got {n!r}")
    idx = _check_indices(list(blocks), k, m, "blocks")
    for b in idx:
        _check_vector(blocks[b], f"blocks[{b}]", n=n)
    return idx


def rs_decode(blocks, k, m, n, *, threads=1):
    """Rebuild the (k, n) uint8 data from any k of the k + m blocks. Local, pure.

    blocks: dict {block index: 1-D uint8 array of length n} (data b < k, parity b - k
    otherwise); extra blocks are ignored. Lost data blocks are rebuilt in one fused pass over
    the k blocks chosen by rs_decode_coefficients. Raises HpcCkptError when fewer than k
    blocks are given.
    """
    k, m = check_code_params(k, m)
    present = _check_blocks(blocks, k, m, n)
    lost = [b for b in range(k) if b not in blocks]
    used, coeffs = rs_decode_coefficients(k, m, present, lost)
    data = np.empty((k, n), dtype=np.uint8)
    for b in range(k):
        if b in blocks:
            data[b] = blocks[b]
    if lost:
        data[lost] = 0
        _combine([data[b] for b in lost], [blocks[b] for b in used], coeffs, threads)
    return data


def rs_decode_numpy(blocks, k, m, n):
    """NumPy reference of rs_decode. Local, pure."""
    k, m = check_code_params(k, m)
    present = _check_blocks(blocks, k, m, n)
    lost = [b for b in range(k) if b not in blocks]
    used, coeffs = rs_decode_coefficients(k, m, present, lost)
    data = np.zeros((k, n), dtype=np.uint8)
    for b in range(k):
        if b in blocks:
            data[b] = blocks[b]
    for r, b in enumerate(lost):
        for s, u in enumerate(used):
            data[b] ^= MUL_TABLE[coeffs[r, s]][blocks[u]]
    return data
