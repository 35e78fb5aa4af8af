"""The Numba kernel of codecs.xor (imported on its first use: it imports Numba), and the
address intrinsics the kernel of codecs.rs shares. ``cache=True``: later processes load the
machine code from the Numba cache."""
from numba import carray, njit, types
from numba.extending import intrinsic

CHUNK_BYTES = 8192
"""Bytes per chunk in the kernels' inner loops (fits L1 together with its inputs)."""


def _pointer_intrinsic(item):
    """An intrinsic: int64 address -> pointer to ``item`` values (for numba.carray)."""
    @intrinsic
    def to_pointer(typingctx, addr):
        sig = types.CPointer(item)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
        return sig, codegen
    return to_pointer


_u64p = _pointer_intrinsic(types.uint64)
_u8p = _pointer_intrinsic(types.uint8)


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
