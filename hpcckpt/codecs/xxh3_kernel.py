"""The Numba kernel of codecs.xxh3: copy 1024-byte blocks and fold them into XXH3's accumulators.

Imported only when the kernel is first needed (it imports Numba). The work of one block is an
intrinsic written in LLVM IR with 8 x 64-bit vectors (one 64-byte stripe per vector; 512-bit
registers on AVX-512 machines, two 256-bit ones on AVX2): per stripe one load, one non-temporal
64-byte store to the destination (no read of the destination line first, no eviction of the
rest of the cache), and XXH3's accumulate step on the same registers. Numba's own vectorisers
would only use 256-bit registers and add a shuffle per stripe. ``compiled_kernel()`` compiles
the loop over blocks for a writable and a read-only source, or loads it from the Numba cache.
"""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .xxh3 import BLOCK_WORDS, PRIME32_1, STRIPES_PER_BLOCK

PREFETCH_WORDS = 512   # ask for the source 4 KiB ahead: ~15 % faster than the hardware prefetcher alone here

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V8 = ir.VectorType(_I64, 8)


def _splat(value):
    return ir.Constant(_V8, [ir.Constant(_I64, value)] * 8)


def _vector_at(builder, data, index):
    """Pointer to the 8 words of ``data`` from ``index`` on, as one vector."""
    return builder.bitcast(builder.gep(data, [index]), _V8.as_pointer())


def _prefetch(builder, pointer):
    pointer = builder.bitcast(pointer, ir.IntType(8).as_pointer())
    function = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [pointer.type, _I32, _I32, _I32]), "llvm.prefetch.p0")
    builder.call(function, [pointer, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _store_nontemporal(builder, vector, pointer):
    store = builder.store(vector, pointer, align=64)
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(_I32, 1)]))


@intrinsic
def copy_accumulate_block(typingctx, src, dst, start, keys, acc):
    """dst[start:start + 128] = src[start:start + 128] and fold those 1024 bytes into ``acc``
    (a tuple of the 8 accumulators), which it returns: XXH3's accumulate over 16 stripes, then
    its scramble. ``keys`` holds the 24 secret words; dst must be 64-byte aligned at start."""
    def codegen(context, builder, signature, args):
        src_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        dst_data = context.make_array(signature.args[1])(context, builder, args[1]).data
        keys_data = context.make_array(signature.args[3])(context, builder, args[3]).data
        start = args[2]
        acc = ir.Constant(_V8, ir.Undefined)
        for lane in range(8):
            acc = builder.insert_element(acc, builder.extract_value(args[4], lane), ir.Constant(_I32, lane))
        words = ir.Constant(_V8, None)   # the block's words summed per lane
        for stripe in range(STRIPES_PER_BLOCK):
            at = builder.add(start, ir.Constant(_I64, stripe * 8))
            _prefetch(builder, builder.gep(src_data, [builder.add(at, ir.Constant(_I64, PREFETCH_WORDS))]))
            data = builder.load(_vector_at(builder, src_data, at), align=8)
            _store_nontemporal(builder, data, _vector_at(builder, dst_data, at))
            key = builder.load(_vector_at(builder, keys_data, ir.Constant(_I64, stripe)), align=8)
            mixed = builder.xor(data, key)
            acc = builder.add(acc, builder.mul(builder.and_(mixed, _splat(0xFFFFFFFF)),
                                               builder.lshr(mixed, _splat(32))))
            words = builder.add(words, data)
        # XXH3 adds each word to the neighbouring lane (acc[i ^ 1] += v[i]): once per block here
        swap = ir.Constant(ir.VectorType(_I32, 8), [ir.Constant(_I32, i ^ 1) for i in range(8)])
        acc = builder.add(acc, builder.shuffle_vector(words, words, swap))
        scramble_key = builder.load(_vector_at(builder, keys_data, ir.Constant(_I64, 16)), align=8)
        acc = builder.xor(builder.xor(acc, builder.lshr(acc, _splat(47))), scramble_key)
        acc = builder.mul(acc, _splat(PRIME32_1))
        out = ir.Constant(context.get_value_type(signature.return_type), ir.Undefined)
        for lane in range(8):
            out = builder.insert_value(out, builder.extract_element(acc, ir.Constant(_I32, lane)), lane)
        return out
    return acc(src, dst, start, keys, acc), codegen


@intrinsic
def store_fence(typingctx):
    """Order the non-temporal stores before whatever follows (a locked instruction on x86)."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


def copy_accumulate_blocks(src, dst, acc, keys):
    """dst[:] = src and fold each 1024-byte block of src into the accumulators ``acc``.

    src, dst: uint64, the same multiple of 128 words, dst 64-byte aligned; keys: the 24 secret
    words; acc: the 8 accumulators, updated in place.
    """
    state = (acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7])
    for block in range(np.uint64(src.size // BLOCK_WORDS)):
        state = copy_accumulate_block(src, dst, block * np.uint64(BLOCK_WORDS), keys, state)
    for lane in range(8):
        acc[lane] = state[lane]
    store_fence()


def compiled_kernel():
    """The dispatcher of ``copy_accumulate_blocks`` for a writable and a read-only source."""
    writable = types.Array(types.uint64, 1, "C")
    readonly = types.Array(types.uint64, 1, "C", readonly=True)
    signatures = [types.void(src, writable, writable, readonly) for src in (writable, readonly)]
    return numba.njit(signatures, cache=True, boundscheck=False, nogil=True)(copy_accumulate_blocks)
