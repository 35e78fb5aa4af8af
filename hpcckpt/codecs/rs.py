"""Reed-Solomon erasure code over GF(2^8) (the RS level's arithmetic). Local and pure.

Code: systematic MDS code with k data blocks and m parity blocks, generator
``encoding_matrix(k, m)`` = [I_k ; P] with P = ``rs_parity_matrix(k, m)`` (a normalised Cauchy
matrix, see gf256.cauchy_matrix). Block b (0 <= b < k + m) is data block b for b < k and
parity block b - k otherwise; parity_j = XOR_i P[j, i] * data_i, byte by byte. All blocks have
the same length n (padding is the caller's job). Any k of the k + m blocks recover the data.

Kernel: ``_gf_kernel`` (rs_kernel.py, imported on first use) computes
outs[j] ^= XOR_i C[j, i] * ins[i] for all j and i in one pass over the inputs: the buffers are
walked in chunks that stay in L1 cache, and within a chunk each 8-byte word x of an input is
split once into its 8 bit-masks (byte-wise 0x00/0xff masks of bit b, shared by all outputs)
and each product is XOR_b (mask_b & broadcast(c * 2^b)); plain uint64 operations that LLVM
vectorises (SWAR, no table lookups). Inputs whose coefficients are all 0 or 1 (data block 0
and parity 0 with the normalised Cauchy matrix) take a plain XOR path.
Unaligned buffers and the n % 8 tail use the 256 x 256 multiplication table byte by byte.
Compiled lazily on first call, ``cache=True``. Buffers shorter than ``KERNEL_MIN_BYTES``, and
plain XOR combinations up to ``XOR_NUMPY_MAX_BYTES``, are combined in NumPy instead, so that a job
with little data, or at the xor level with the default io_chunk, never loads Numba. NumPy references
(``*_numpy``) sit beside.
"""
import numbers

import numpy as np

from ..errors import HpcCkptError
from .gf256 import MUL_TABLE, cauchy_matrix, check_code_params, encoding_matrix, gf_matinv
from .xor import _check_vector

KERNEL_MIN_BYTES = 256 << 10
"""Buffers shorter than this are combined in NumPy (``_combine_numpy``): a process whose
buffers are all short never loads Numba (about half a second of CPU per process), and the
kernel's speed matters only for long ones."""

XOR_NUMPY_MAX_BYTES = 4 << 20
"""Plain XOR combinations (every coefficient 0 or 1: the xor level's parity and rebuild) of
buffers up to this size run in NumPy on one thread: ``np.bitwise_xor`` into the output is as
fast as the kernel up to 4 MiB here (docs/BENCHMARKS.md "First checkpoint"). The xor level
combines ``io_chunk`` bytes at a time (1 MiB by default), so with the default it never pays
Numba's start-up."""

PARALLEL_MIN_BYTES = 1 << 20
"""With threads > 1, buffers shorter than this still run on one thread."""

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
    import numba
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
    nt = _resolve_threads(threads, n)
    if n < KERNEL_MIN_BYTES or (nt == 1 and n <= XOR_NUMPY_MAX_BYTES and not np.any(coeffs > 1)):
        _combine_numpy(out_rows, in_rows, coeffs)
        return
    from . import rs_kernel          # Numba, on first use
    out_addrs = np.array([o.ctypes.data for o in out_rows], dtype=np.int64)
    in_addrs = np.array([d.ctypes.data for d in in_rows], dtype=np.int64)
    words = not (np.any(out_addrs % 8) or np.any(in_addrs % 8))
    bc = _broadcast_consts(coeffs)
    simple = np.all(coeffs <= 1, axis=0)
    if nt > 1:
        rs_kernel._gf_kernel_parallel(out_addrs, in_addrs, coeffs, bc, simple, MUL_TABLE, n, words, nt)
    else:
        rs_kernel._gf_kernel(out_addrs, in_addrs, coeffs, bc, simple, MUL_TABLE, 0, n, words)


def _combine_numpy(out_rows, in_rows, coeffs):
    """_combine for short buffers, in NumPy: coefficient 1 is a plain XOR, 0 nothing, any other
    a lookup in its row of the multiplication table (one temporary)."""
    for j, o in enumerate(out_rows):
        for i, d in enumerate(in_rows):
            c = coeffs[j, i]
            if c == 1:
                np.bitwise_xor(o, d, out=o)
            elif c:
                np.bitwise_xor(o, MUL_TABLE[c][d], out=o)


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
