"""XOR parity kernels (the XOR level's arithmetic). Local and pure: no MPI, no I/O.

The kernel is a Numba function (xor_kernel.py, imported on first use: importing this module
loads no Numba) compiled lazily on its first call (``cache=True``, so later processes load the
machine code from the Numba cache) with a NumPy reference implementation beside it
(``*_numpy``) that the tests compare against.

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
import functools

import numpy as np

from ..errors import HpcCkptError


@functools.cache
def _kernel():
    """The compiled XOR kernel (imports Numba on first use)."""
    from .xor_kernel import _xor_kernel
    return _xor_kernel


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
    _kernel()(o0, addrs, n, words, True)
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
    _kernel()(a0, np.array([b0], dtype=np.int64), acc.size, a0 % 8 == 0 and b0 % 8 == 0, False)
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
