"""Copy an array and compute its XXH3-64 checksum in one pass (local, pure: no MPI, no I/O).

The node-local level copies every protected array into a file mapped in memory. Hashing the
array in a separate pass costs a second trip through the data (14-16 % of the checkpoint time on
our machines, docs/BENCHMARKS.md "Integrity"); this kernel hashes the 64-bit words it copies
while they are in registers, so the checksum rides on the copy's memory traffic.

The digest is exactly XXH3-64 with the default secret and seed 0 (``xxhash.xxh3_64``), so any
xxhash implementation verifies what this wrote (``hpcckpt verify``, restart). The algorithm
(Yann Collet's XXH3, "long input" path, for inputs over 240 bytes):

- 8 accumulators of 64 bits; the input is cut into 1024-byte blocks of 16 stripes of 64 bytes;
- each stripe's 8 words ``v`` update ``acc[i ^ 1] += v[i]`` and
  ``acc[i] += lo32(v[i] ^ key[i]) * hi32(v[i] ^ key[i])`` with ``key = secret[8 s: 8 s + 64]``
  for stripe ``s`` of its block; after each full block the accumulators are scrambled;
- the last (partial) block, the last 64 bytes and a final merge give the 64-bit digest.

The Numba kernel (xxh3_kernel.py, imported on first use) does the full blocks
(``copy_accumulate_blocks``); ``finish`` does the rest in NumPy and Python integers (at most
1 KiB). ``accumulate_blocks_numpy`` and ``xxh3_64_numpy`` are the NumPy references the tests
compare the kernel and the whole digest against (and the whole digest against xxhash).

The compiled kernel is checked against the xxhash library once per process
(``fused_available``); if that check fails, callers fall back to copying and hashing separately.
Arrays shorter than ``FUSED_MIN_BYTES`` take that two-pass path too: a job whose arrays are all
short never loads Numba.
"""
import functools
import logging
import sys
import threading

import numpy as np
import xxhash

from ..errors import HpcCkptError

log = logging.getLogger("hpcckpt")

MIDSIZE_MAX = 240          # inputs up to this size use other XXH3 paths: left to the xxhash library
FUSED_MIN_BYTES = 4 << 20
"""Arrays shorter than this are copied, then hashed by the xxhash library: for them the two
passes are as fast as the kernel's one into a mapped file, and cost nothing like loading Numba
(about a second of CPU, once per process: docs/BENCHMARKS.md "First checkpoint"), so a job
whose arrays are all short never loads it."""
STRIPE_BYTES = 64
BLOCK_BYTES = 1024         # 16 stripes; (secret size - 64) / 8 = 16 with the 192-byte default secret
BLOCK_WORDS = BLOCK_BYTES // 8
STRIPES_PER_BLOCK = 16

PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME64_1 = 0x9E3779B185EBCA87
PRIME64_2 = 0xC2B2AE3D27D4EB4F
PRIME64_3 = 0x165667B19E3779F9
PRIME64_4 = 0x85EBCA77C2B2AE63
PRIME64_5 = 0x27D4EB2F165667C5
AVALANCHE_MUL = 0x165667919E3779F9
MASK64 = (1 << 64) - 1

# XXH3's default secret (a constant of the algorithm, "kSecret" in the reference).
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")
SECRET_WORDS = np.frombuffer(SECRET, "<u8").astype(np.uint64)            # 24 words: stripe keys, scramble keys
LAST_STRIPE_KEYS = np.frombuffer(SECRET[121:185], "<u8").astype(np.uint64)  # secret + 192 - 64 - 7
MERGE_KEYS = [int(k) for k in np.frombuffer(SECRET[11:75], "<u8")]       # secret + 11
INIT_ACC = np.array([PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1],
                    dtype=np.uint64)
STRIPE_KEYS = np.stack([SECRET_WORDS[s:s + 8] for s in range(STRIPES_PER_BLOCK)])   # key of stripe s of a block
_SWAP = np.array([1, 0, 3, 2, 5, 4, 7, 6])
_LO32 = np.uint64(0xFFFFFFFF)
_U32 = np.uint64(32)


# ---------------------------------------------------------------- NumPy reference and the tail
def _stripe_terms(v, keys):
    """Per-lane accumulator increments of stripes ``v`` (..., 8) with keys (..., 8), wrapping."""
    x = v ^ keys
    return v[..., _SWAP] + (x & _LO32) * (x >> _U32)


def _scramble(acc):
    acc ^= acc >> np.uint64(47)
    acc ^= SECRET_WORDS[16:24]
    acc *= np.uint64(PRIME32_1)


def accumulate_blocks_numpy(words, acc):
    """NumPy reference of ``copy_accumulate_blocks`` without the copy: fold every whole block of
    ``words`` (uint64, a multiple of 128 words) into ``acc`` (8 uint64, updated in place)."""
    with np.errstate(over="ignore"):
        for block in words.reshape(-1, STRIPES_PER_BLOCK, 8):
            acc += _stripe_terms(block, STRIPE_KEYS).sum(axis=0, dtype=np.uint64)
            _scramble(acc)


def _mul128_fold64(a, b):
    product = a * b
    return (product ^ (product >> 64)) & MASK64


def finish(acc, data, blocks_done):
    """The XXH3-64 digest (int) of ``data`` (uint8, over 240 bytes) once its first ``blocks_done``
    whole blocks (all but the last, possibly partial, one) are folded into ``acc`` (local)."""
    n = data.size
    start = blocks_done * BLOCK_BYTES
    stripes = (n - 1 - start) // STRIPE_BYTES
    acc = acc.copy()
    with np.errstate(over="ignore"):
        if stripes:
            v = data[start:start + stripes * STRIPE_BYTES].view("<u8").reshape(stripes, 8).astype(np.uint64)
            acc += _stripe_terms(v, STRIPE_KEYS[:stripes]).sum(axis=0, dtype=np.uint64)
        last = data[n - STRIPE_BYTES:].view("<u8").astype(np.uint64)
        acc += _stripe_terms(last, LAST_STRIPE_KEYS)
    result = n * PRIME64_1 & MASK64
    lanes = [int(a) for a in acc]
    for i in range(4):
        result += _mul128_fold64(lanes[2 * i] ^ MERGE_KEYS[2 * i], lanes[2 * i + 1] ^ MERGE_KEYS[2 * i + 1])
    result &= MASK64
    result ^= result >> 37
    result = result * AVALANCHE_MUL & MASK64
    return result ^ (result >> 32)


def xxh3_64_numpy(data):
    """NumPy reference of the whole XXH3-64 digest (int) of ``data`` (uint8, over 240 bytes)."""
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if data.size <= MIDSIZE_MAX:
        raise HpcCkptError(f"xxh3_64_numpy covers inputs over {MIDSIZE_MAX} bytes, got {data.size}")
    blocks = (data.size - 1) // BLOCK_BYTES
    acc = INIT_ACC.copy()
    accumulate_blocks_numpy(data[:blocks * BLOCK_BYTES].view("<u8").astype(np.uint64), acc)
    return finish(acc, data, blocks)


# ---------------------------------------------------------------- the kernel (xxh3_kernel.py)
@functools.cache
def _kernel():
    """The compiled kernel (imports Numba on first use: jobs that never write never load it)."""
    from .xxh3_kernel import compiled_kernel
    return compiled_kernel()


_KEYS_READONLY = SECRET_WORDS.copy()
_KEYS_READONLY.flags.writeable = False


def copy_accumulate_blocks(src, dst, acc):
    """dst[:] = src and fold src's whole blocks into ``acc`` (Numba; local).

    src, dst: 1-D C-contiguous uint64 arrays of the same size, a multiple of 128 words; dst
    64-byte aligned (it is written with non-temporal 64-byte stores).
    """
    if src.size != dst.size or src.size % BLOCK_WORDS:
        raise HpcCkptError(f"copy_accumulate_blocks needs equal sizes in whole blocks of {BLOCK_WORDS} "
                           f"words, got {src.size} and {dst.size}")
    if dst.ctypes.data % 64:
        raise HpcCkptError("copy_accumulate_blocks needs a 64-byte aligned destination")
    _kernel()(src, dst, acc, _KEYS_READONLY)


@functools.cache
def fused_available():
    """True when the compiled kernel gives xxhash's digests here (checked once per process;
    the first call compiles the kernel or loads it from the Numba cache)."""
    if sys.byteorder != "little":
        return False
    probe = np.random.default_rng(20261203).integers(0, 256, 5 * BLOCK_BYTES + 77, dtype=np.uint8)
    copy = _aligned_empty(probe.size)
    try:
        digest = _copy_and_hash_fused(probe, copy, BLOCK_BYTES, None)
    except Exception as e:   # no compiler for this CPU, a broken cache...
        log.warning("hpcckpt: the copy-and-checksum kernel is unavailable (%s: %s); arrays are "
                    "copied and hashed in two passes", type(e).__name__, e)
        return False
    if digest != xxhash.xxh3_64_intdigest(probe) or not np.array_equal(copy, probe):
        log.warning("hpcckpt: the copy-and-checksum kernel gives wrong results on this machine; "
                    "arrays are copied and hashed in two passes")
        return False
    return True


_preload = None


def preload():
    """Local: start loading the kernel (``fused_available``) in a background thread, once per
    process, so that the first array of ``FUSED_MIN_BYTES`` or more does not wait for Numba
    (``Checkpointer.restart`` calls it when such an array is protected). ``copy_and_hash``
    waits for it."""
    global _preload
    if _preload is None:
        # not a daemon: an interpreter that exits meanwhile waits for it rather than tearing
        # Numba and LLVM down under it
        _preload = threading.Thread(target=fused_available, name="hpcckpt-kernel-load", daemon=False)
        _preload.start()


def _fused_ready():
    """fused_available(), after a preload() thread has finished (local)."""
    if _preload is not None:
        _preload.join()          # returns at once once it has finished
    return fused_available()


def _aligned_empty(nbytes, alignment=64):
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes]


def copy_and_hash(src, dst, chunk, after_chunk=None):
    """Copy ``src`` into ``dst`` (1-D uint8, same size); return src's XXH3-64 digest (int). Local.

    With ``after_chunk``, works through ``chunk`` bytes at a time and calls ``after_chunk(done)``
    after each, ``done`` being how many leading bytes of ``dst`` are now final (a test hook, and
    the pfs flush that writes them out while the rest is copied); without, copies the whole array
    in one kernel call. Arrays shorter than ``FUSED_MIN_BYTES``, a
    source not 8-byte aligned or a destination not 64-byte aligned, and machines where the kernel
    failed its check are copied and hashed separately (the same digest, one more pass).
    """
    n = src.size
    if dst.size != n:
        raise HpcCkptError(f"copy_and_hash: the source has {n} bytes, the destination {dst.size}")
    if n >= max(FUSED_MIN_BYTES, MIDSIZE_MAX + 1) and src.ctypes.data % 8 == 0 and dst.ctypes.data % 64 == 0 \
            and _fused_ready():
        return _copy_and_hash_fused(src, dst, chunk, after_chunk)
    hasher = xxhash.xxh3_64()
    for start in range(0, n, chunk):
        dst[start:start + chunk] = src[start:start + chunk]
        hasher.update(src[start:start + chunk])
        if after_chunk is not None:
            after_chunk(min(start + chunk, n))
    return hasher.intdigest()


def _copy_and_hash_fused(src, dst, chunk, after_chunk):
    """copy_and_hash through the kernel: src, dst 8-byte aligned, over 240 bytes."""
    n = src.size
    tail = (n - 1) // BLOCK_BYTES * BLOCK_BYTES    # the last block, even a whole one, is finish()'s
    step = max(1, chunk // BLOCK_BYTES) * BLOCK_BYTES if after_chunk is not None else n
    acc = INIT_ACC.copy()
    for start in range(0, n, step):                # every start is a whole block, <= tail
        end = min(start + step, n)
        whole = min(end, tail)
        if whole > start:
            copy_accumulate_blocks(src[start:whole].view(np.uint64), dst[start:whole].view(np.uint64), acc)
        if end == n:
            dst[tail:] = src[tail:]
        if after_chunk is not None:
            after_chunk(n if end == n else whole)
    return finish(acc, src, tail // BLOCK_BYTES)
