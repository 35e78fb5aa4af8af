"""XOR parity kernels (the XOR level's arithmetic). Local and pure: no MPI, no I/O.

Each kernel is a Numba function compiled lazily on its first call (``cache=True``, so later
processes load the machine code from the Numba cache) with a NumPy reference implementation
beside it (``*_numpy``) that the tests compare against.

The kernels walk the buffers once, in chunks that stay in L1 cache: for every chunk the output
chunk is formed from the first (up to four) inputs and the remaining inputs are folded in while
the chunk is still in cache, so each input byte is read from memory once and each output byte
written once, whatever the number of inputs. When every buffer is 8-byte aligned the work is
done on uint64 words (which LLVM vectorises further) with a byte loop for the last n % 8 bytes;
otherwise the whole buffer goes through the byte loop (also vectorised, same result).

The kernels receive buffer addresses rather than arrays, so one compiled version serves every
number of inputs, alignment and writeability; the Python wrappers validate the arrays and keep
them alive for the call.
"""
import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from ..errors import HpcCkptError

CHUNK_BYTES = 8192
"""Bytes per chunk in the kernels' inner loops (fits L1 together with its inputs)."""


@intrinsic
def _u64p(typingctx, addr):
    """int64 address -> uint64 pointer (for numba.carray)."""
    sig = types.CPointer(types.uint64)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


@intrinsic
def _u8p(typingctx, addr):
    """int64 address -> uint8 pointer (for numba.carray)."""
    sig = types.CPointer(types.uint8)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


@njit(inline="always")
def _xor_chunk(o, ins, i0, cnt, L, first):
    """o[:L] (=|^=) XOR of ins[i0:i0+cnt] (cnt in 1..4); ``first`` assigns instead of XOR."""
    a = ins[i0]
    if cnt == 1:
        if first:
            for w in range(L):
                o[w] = a[w]
        else:
            for w in range(L):
                o[w] ^= a[w]
    elif cnt == 2:
        b = ins[i0 + 1]
        if first:
            for w in range(L):
                o[w] = a[w] ^ b[w]
        else:
            for w in range(L):
                o[w] ^= a[w] ^ b[w]
    elif cnt == 3:
        b = ins[i0 + 1]
        c = ins[i0 + 2]
        if first:
            for w in range(L):
                o[w] = a[w] ^ b[w] ^ c[w]
        else:
            for w in range(L):
                o[w] ^= a[w] ^ b[w] ^ c[w]
    else:
        b = ins[i0 + 1]
        c = ins[i0 + 2]
        d = ins[i0 + 3]
        if first:
            for w in range(L):
                o[w] = a[w] ^ b[w] ^ c[w] ^ d[w]
        else:
            for w in range(L):
                o[w] ^= a[w] ^ b[w] ^ c[w] ^ d[w]


@njit(inline="always")
def _xor_fold(o, ins, L, first):
    """Fold all of ins into o[:L]: the first group of up to 4, then groups of up to 3."""
    k = len(ins)
    cnt = min(k, 4)
    _xor_chunk(o, ins, 0, cnt, L, first)
    i = cnt
    while i < k:
        cnt = min(k - i, 3)
        _xor_chunk(o, ins, i, cnt, L, False)
        i += cnt


@njit(cache=True, nogil=True, boundscheck=False)
def _xor_kernel(out_addr, in_addrs, nbytes, words, first):
    """out = XOR(inputs) (or out ^= XOR(inputs) when not ``first``) over nbytes bytes.

    words: every address is 8-byte aligned, so whole words go through uint64 loops.
    """
    k = in_addrs.size
    done = 0
    if words:
        nw = nbytes // 8
        cw = CHUNK_BYTES // 8
        for c0 in range(0, nw, cw):
            L = min(cw, nw - c0)
            off = c0 * 8
            ins = [carray(_u64p(in_addrs[i] + off), (L,)) for i in range(k)]
            _xor_fold(carray(_u64p(out_addr + off), (L,)), ins, L, first)
        done = nw * 8
    for c0 in range(done, nbytes, CHUNK_BYTES):
        L = min(CHUNK_BYTES, nbytes - c0)
        ins8 = [carray(_u8p(in_addrs[i] + c0), (L,)) for i in range(k)]
        _xor_fold(carray(_u8p(out_addr + c0), (L,)), ins8, L, first)


def _check_vector(a, name, n=None, writeable=False):
    if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 1:
        raise HpcCkptError(f"{name} must be a 1-D uint8 numpy array, got "
                           f"{type(a).__name__}{getattr(a, 'shape', '')} {getattr(a, 'dtype', '')}")
    if a.size > 1 and a.strides[0] != 1:
        raise HpcCkptError(f"{name} must be contiguous")
    if n is not None and a.size != n:
        raise HpcCkptError(f"{name} has {a.size} bytes, expected {n} (padding is the caller's job)")
    if writeable and not a.flags.writeable:
        raise HpcCkptError(f"{name} is read-only")
    return a


def _check_xor_args(out, blocks):
    _check_vector(out, "out", writeable=True)
    if isinstance(blocks, np.ndarray) and blocks.ndim == 2:
        blocks = list(blocks)
    if not isinstance(blocks, (list, tuple)) or len(blocks) == 0:
        raise HpcCkptError("blocks must be a non-empty list or tuple of 1-D uint8 arrays")
    for i, b in enumerate(blocks):
        _check_vector(b, f"blocks[{i}]", n=out.size)
    o0 = out.ctypes.data
    for i, b in enumerate(blocks):
        if b.ctypes.data != o0 and np.may_share_memory(out, b):
            raise HpcCkptError(f"out partially overlaps blocks[{i}]; only exact aliasing is allowed")
    return blocks


def xor_into(out, blocks):
    """out[:] = blocks[0] ^ blocks[1] ^ ... (one fused pass). Local, pure apart from writing out.

    out: 1-D uint8 array (writeable, contiguous); blocks: non-empty list/tuple of 1-D uint8
    arrays of out's length (or a 2-D uint8 array, one block per row). out may be one of the
    blocks (exactly the same buffer), e.g. ``xor_into(a, (a, b, c))``. Any length, including 0.
    Returns out.
    """
    blocks = _check_xor_args(out, blocks)
    n = out.size
    if n == 0:
        return out
    o0 = out.ctypes.data
    # XOR is commutative: put the blocks that alias out first, so that they are read before
    # out is written (the first group of up to four is combined element by element).
    order = sorted(range(len(blocks)), key=lambda i: blocks[i].ctypes.data != o0)
    if sum(1 for b in blocks if b.ctypes.data == o0) > 4:
        raise HpcCkptError("out appears more than four times among blocks")
    addrs = np.array([blocks[i].ctypes.data for i in order], dtype=np.int64)
    words = bool(o0 % 8 == 0 and not np.any(addrs % 8))
    _xor_kernel(o0, addrs, n, words, True)
    return out


def xor_accumulate(acc, block):
    """acc ^= block, in place (one pass). Local. acc and block: 1-D uint8 of equal length.
    Returns acc."""
    _check_vector(acc, "acc", writeable=True)
    _check_vector(block, "block", n=acc.size)
    if acc.size == 0:
        return acc
    if block.ctypes.data == acc.ctypes.data:
        acc[:] = 0
        return acc
    if np.may_share_memory(acc, block):
        raise HpcCkptError("acc partially overlaps block")
    a0 = acc.ctypes.data
    b0 = block.ctypes.data
    _xor_kernel(a0, np.array([b0], dtype=np.int64), acc.size, a0 % 8 == 0 and b0 % 8 == 0, False)
    return acc


def xor_into_numpy(out, blocks):
    """NumPy reference of xor_into (chained np.bitwise_xor; one temporary). Local, pure."""
    blocks = _check_xor_args(out, blocks)
    acc = blocks[0].copy()
    for b in blocks[1:]:
        np.bitwise_xor(acc, b, out=acc)
    out[:] = acc
    return out


def xor_accumulate_numpy(acc, block):
    """NumPy reference of xor_accumulate. Local."""
    _check_vector(acc, "acc", writeable=True)
    _check_vector(block, "block", n=acc.size)
    np.bitwise_xor(acc, block, out=acc)
    return acc
