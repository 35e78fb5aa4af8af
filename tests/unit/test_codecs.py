"""Unit tests of hpcckpt.codecs: kernels against NumPy references, GF(256) axioms, RS erasures."""
import itertools
import subprocess
import sys

import numpy as np
import pytest

from hpcckpt.errors import HpcCkptError
from hpcckpt import codecs as C
from hpcckpt.codecs import gf256

SIZES = [0, 1, 7, 8, 63, 4097, 100003]


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True)
def kernel_at_every_size(monkeypatch):
    """The tests below compare the Numba kernels with the references at every size: short
    buffers take the kernel too (by default they are combined in NumPy: rs.KERNEL_MIN_BYTES), and
    so do plain XOR combinations (by default in NumPy at every size: rs.XOR_NUMPY_MAX_BYTES)."""
    from hpcckpt.codecs import rs
    monkeypatch.setattr(rs, "KERNEL_MIN_BYTES", 0)
    monkeypatch.setattr(rs, "XOR_NUMPY_MAX_BYTES", -1)


def _unaligned(a, shift=3):
    """A copy of 1-D a whose data starts `shift` bytes past an 8-byte boundary."""
    buf = np.empty(a.size + 8, dtype=np.uint8)
    base = (-buf.ctypes.data) % 8
    out = buf[base + shift: base + shift + a.size]
    out[:] = a
    assert a.size == 0 or out.ctypes.data % 8 == shift % 8
    return out


def _peasant(a, b):
    """Bitwise carry-less multiplication mod 0x11d (independent of the tables)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    r = np.zeros(np.broadcast(a, b).shape, dtype=np.int64)
    for _ in range(8):
        r ^= np.where(b & 1, a, 0)
        b = b >> 1
        a = a << 1
        a = np.where(a & 0x100, a ^ 0x11d, a)
    return r.astype(np.uint8)


# ----------------------------------------------------------------------------- import / laziness

def test_import_loads_no_numba():
    code = ("import sys, numpy as np, hpcckpt.codecs.xor, hpcckpt.codecs.rs as r\n"
            "assert 'numba' not in sys.modules\n"
            "out = np.zeros(1000, np.uint8)\n"     # short: combined in NumPy
            "r.gf_combine_into([out], [[1, 7]], [np.ones(1000, np.uint8), np.full(1000, 2, np.uint8)])\n"
            "assert 'numba' not in sys.modules and (out == 1 ^ 14).all()\n"
            "from hpcckpt.codecs import rs_kernel as k, xor_kernel as x\n"
            "assert not x._xor_kernel.signatures and not k._gf_kernel.signatures\n"
            "assert not k._gf_kernel_parallel.signatures\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_short_buffers_are_combined_in_numpy_long_ones_by_the_kernel(rng, monkeypatch):
    from hpcckpt.codecs import rs
    monkeypatch.setattr(rs, "KERNEL_MIN_BYTES", 4096)
    used = []
    real = rs._combine_numpy
    monkeypatch.setattr(rs, "_combine_numpy", lambda *a: used.append(a[0][0].size) or real(*a))
    for n in (1, 13, 4095, 4096, 4103):
        for shift in (0, 3):
            ins = [_unaligned(r, shift) for r in rng.integers(0, 256, (4, n), dtype=np.uint8)]
            coeffs = rng.integers(0, 256, (2, 4)).astype(np.uint8)
            coeffs[0] = [1, 0, 1, 1]
            start = rng.integers(0, 256, (2, n), dtype=np.uint8)
            ref = C.gf_combine_into_numpy(start.copy(), coeffs, ins)
            assert np.array_equal(C.gf_combine_into(start.copy(), coeffs, ins), ref), (n, shift)
    assert used == [1, 1, 13, 13, 4095, 4095]


# ----------------------------------------------------------------------------- XOR

@pytest.mark.parametrize("n", SIZES)
def test_xor_into_matches_numpy(rng, n):
    for k in range(1, 9):
        blocks = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(k)]
        ref = np.empty(n, dtype=np.uint8)
        C.xor_into_numpy(ref, blocks)
        expect = np.zeros(n, dtype=np.uint8)
        for b in blocks:
            expect ^= b
        assert np.array_equal(ref, expect)
        out = np.full(n, 0xAA, dtype=np.uint8)
        assert C.xor_into(out, blocks) is out
        assert np.array_equal(out, ref)
        # unaligned buffers take the byte path
        out_u = _unaligned(np.zeros(n, dtype=np.uint8), 5)
        C.xor_into(out_u, [_unaligned(b, 1 + i % 7) for i, b in enumerate(blocks)])
        assert np.array_equal(out_u, ref)
        # tuple and 2-D forms
        out2 = np.empty(n, dtype=np.uint8)
        C.xor_into(out2, np.stack(blocks) if n else tuple(blocks))
        assert np.array_equal(out2, ref)


@pytest.mark.parametrize("n", [1, 63, 100003])
def test_xor_into_aliasing(rng, n):
    for k in (1, 2, 3, 5, 8):
        blocks = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(k)]
        ref = np.empty(n, dtype=np.uint8)
        C.xor_into_numpy(ref, blocks)
        for pos in (0, k - 1):                         # out is blocks[0] or the last block
            bl = [b.copy() for b in blocks]
            C.xor_into(bl[pos], bl)
            assert np.array_equal(bl[pos], ref)


def test_xor_accumulate(rng):
    for n in SIZES:
        acc = rng.integers(0, 256, n, dtype=np.uint8)
        b = rng.integers(0, 256, n, dtype=np.uint8)
        ref = C.xor_accumulate_numpy(acc.copy(), b)
        assert np.array_equal(ref, acc ^ b)
        got = acc.copy()
        assert C.xor_accumulate(got, b) is got
        assert np.array_equal(got, ref)
        got_u = _unaligned(acc, 2)
        C.xor_accumulate(got_u, b)
        assert np.array_equal(got_u, ref)
        C.xor_accumulate(got, got)
        assert not got.any()


def test_xor_recovers_lost_block(rng):
    """XOR-level identity: a lost block is the XOR of the parity and the survivors."""
    blocks = [rng.integers(0, 256, 1001, dtype=np.uint8) for _ in range(5)]
    parity = np.empty(1001, dtype=np.uint8)
    C.xor_into(parity, blocks)
    rebuilt = np.empty(1001, dtype=np.uint8)
    C.xor_into(rebuilt, [parity] + blocks[:2] + blocks[3:])
    assert np.array_equal(rebuilt, blocks[2])


def test_xor_errors():
    a = np.zeros(10, dtype=np.uint8)
    with pytest.raises(HpcCkptError):
        C.xor_into(a, [])
    with pytest.raises(HpcCkptError):
        C.xor_into(a, [np.zeros(9, dtype=np.uint8)])
    with pytest.raises(HpcCkptError):
        C.xor_into(a, [np.zeros(10, dtype=np.int32)])
    with pytest.raises(HpcCkptError):
        C.xor_into(np.zeros(20, dtype=np.uint8)[::2], [a])
    big = np.zeros(20, dtype=np.uint8)
    with pytest.raises(HpcCkptError):
        C.xor_into(big[:10], [big[5:15]])            # partial overlap
    ro = np.zeros(10, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(HpcCkptError):
        C.xor_into(ro, [a])
    with pytest.raises(HpcCkptError):
        C.xor_accumulate(a, np.zeros(11, dtype=np.uint8))


# ----------------------------------------------------------------------------- GF(256)

def test_tables_against_bitwise_multiplication():
    a = np.arange(256)[:, None]
    b = np.arange(256)[None, :]
    assert np.array_equal(gf256.MUL_TABLE, _peasant(a, b))
    assert gf256.MUL_TABLE.dtype == np.uint8 and gf256.MUL_TABLE.shape == (256, 256)
    assert gf256.POLY == 0x11d
    # 2 generates the multiplicative group; EXP/LOG are inverse
    assert sorted(gf256.EXP_TABLE[:255].tolist()) == list(range(1, 256))
    for x in range(1, 256):
        assert gf256.EXP_TABLE[gf256.LOG_TABLE[x]] == x


def test_field_axioms_exhaustive_inverse():
    for a in range(1, 256):
        inv = C.gf_inv(a)
        assert C.gf_mul(a, inv) == 1
        assert C.gf_div(1, a) == inv
        assert C.gf_pow(a, 255) == 1
    with pytest.raises(HpcCkptError):
        C.gf_inv(0)
    with pytest.raises(HpcCkptError):
        C.gf_div(3, 0)
    with pytest.raises(HpcCkptError):
        C.gf_mul(256, 1)


def test_field_axioms_random(rng):
    a, b, c = (rng.integers(0, 256, 5000).astype(np.uint8) for _ in range(3))
    mul = C.gf_mul
    assert np.array_equal(mul(a, b), mul(b, a))
    assert np.array_equal(mul(mul(a, b), c), mul(a, mul(b, c)))
    assert np.array_equal(mul(a, b ^ c), mul(a, b) ^ mul(a, c))
    assert np.array_equal(mul(a, np.ones_like(a)), a)
    assert not mul(a, np.zeros_like(a)).any()
    for x, y in zip(a[:300].tolist(), b[:300].tolist()):
        if y:
            assert C.gf_mul(C.gf_div(x, y), y) == x
        assert C.gf_pow(x, 3) == C.gf_mul(x, C.gf_mul(x, x))


def test_matrix_inverse_and_product(rng):
    for n in (1, 2, 5, 12):
        for _ in range(5):
            a = rng.integers(0, 256, (n, n)).astype(np.uint8)
            try:
                inv = C.gf_matinv(a)
            except HpcCkptError:
                continue
            assert np.array_equal(C.gf_matmul(a, inv), np.eye(n, dtype=np.uint8))
            assert np.array_equal(C.gf_matmul(inv, a), np.eye(n, dtype=np.uint8))
    a = rng.integers(0, 256, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 256, (4, 2)).astype(np.uint8)
    expect = np.zeros((3, 2), dtype=np.uint8)
    for i in range(3):
        for j in range(2):
            for t in range(4):
                expect[i, j] ^= _peasant(a[i, t], b[t, j])
    assert np.array_equal(C.gf_matmul(a, b), expect)


def test_matrix_inverse_singular():
    with pytest.raises(HpcCkptError, match="singular"):
        C.gf_matinv(np.array([[1, 2], [1, 2]], dtype=np.uint8))
    with pytest.raises(HpcCkptError, match="singular"):
        C.gf_matinv(np.array([[3, 7], [C.gf_mul(3, 5), C.gf_mul(7, 5)]], dtype=np.uint8))
    with pytest.raises(HpcCkptError):
        C.gf_matinv(np.zeros((2, 3), dtype=np.uint8))


def test_encoding_matrix_is_mds():
    for k, m in [(1, 1), (2, 2), (4, 2), (5, 3), (3, 4)]:
        g = C.encoding_matrix(k, m)
        assert g.shape == (k + m, k) and g.dtype == np.uint8
        assert np.array_equal(g[:k], np.eye(k, dtype=np.uint8))
        assert (g[k] == 1).all() and (g[k:, 0] == 1).all()    # normalised Cauchy
        for rows in itertools.combinations(range(k + m), k):
            C.gf_matinv(g[list(rows)])                         # raises if singular
    big = C.cauchy_matrix(200, 56)                             # k + m = 256 is allowed
    assert big.shape == (56, 200) and big.all()


def test_code_params_validation():
    for k, m in [(0, 1), (1, 0), (250, 7), (2.0, 1), (True, 1), (-1, 3)]:
        with pytest.raises(HpcCkptError):
            C.encoding_matrix(k, m)
        with pytest.raises(HpcCkptError):
            C.rs_parity_matrix(k, m)


# ----------------------------------------------------------------------------- RS kernels

@pytest.mark.parametrize("n", SIZES)
def test_gf_mul_xor_into_matches_numpy(rng, n):
    for m in range(1, 5):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        coeffs = rng.integers(0, 256, m).astype(np.uint8)
        coeffs[0] = rng.choice([0, 1, 2])                 # include the special coefficients
        start = rng.integers(0, 256, (m, n), dtype=np.uint8)
        ref = C.gf_mul_xor_into_numpy(start.copy(), coeffs, data)
        expect = start.copy()
        for j in range(m):
            expect[j] ^= _peasant(coeffs[j], data)
        assert np.array_equal(ref, expect)
        got = start.copy()
        assert C.gf_mul_xor_into(got, coeffs, data) is got
        assert np.array_equal(got, ref)
        # unaligned inputs and list-of-rows outputs
        rows = [_unaligned(r, 3) for r in start]
        C.gf_mul_xor_into(rows, list(coeffs), _unaligned(data, 6))
        assert np.array_equal(np.array(rows).reshape(m, n), ref)


@pytest.mark.parametrize("n", SIZES)
def test_rs_encode_matches_numpy(rng, n):
    for k in range(1, 9):
        for m in range(1, 5):
            data = rng.integers(0, 256, (k, n), dtype=np.uint8)
            ref = C.rs_encode_numpy(data, m)
            got = C.rs_encode(data, m)
            assert got.shape == (m, n) and got.dtype == np.uint8
            assert np.array_equal(got, ref)
            if k > 1:
                assert np.array_equal(got[0], np.bitwise_xor.reduce(data, axis=0))


def test_rs_encode_threads(rng):
    data = rng.integers(0, 256, (4, (3 << 20) + 5), dtype=np.uint8)
    ref = C.rs_encode(data, 3)
    assert np.array_equal(C.rs_encode(data, 3, threads=2), ref)
    assert np.array_equal(C.rs_encode_numpy(data, 3), ref)


def test_gf_combine_into(rng):
    for n in (0, 13, 4099):
        ins = rng.integers(0, 256, (5, n), dtype=np.uint8)
        coeffs = rng.integers(0, 256, (3, 5)).astype(np.uint8)
        start = rng.integers(0, 256, (3, n), dtype=np.uint8)
        ref = C.gf_combine_into_numpy(start.copy(), coeffs, ins)
        assert np.array_equal(C.gf_combine_into(start.copy(), coeffs, ins), ref)
        assert np.array_equal(C.gf_combine_into(start.copy(), coeffs, list(ins)), ref)


def test_distributed_encoding_matches(rng):
    """parity = XOR over ranks of each rank's contributions P[:, i] * d_i."""
    k, m, n = 6, 3, 5003
    data = rng.integers(0, 256, (k, n), dtype=np.uint8)
    p = C.rs_parity_matrix(k, m)
    reduced = np.zeros((m, n), dtype=np.uint8)
    for i in range(k):
        contrib = np.zeros((m, n), dtype=np.uint8)
        C.gf_mul_xor_into(contrib, p[:, i], data[i])
        C.xor_accumulate(reduced.reshape(-1), contrib.reshape(-1))
    assert np.array_equal(reduced, C.rs_encode(data, m))


def test_golden_parity():
    """On-disk format guard: a fixed input and its parity, computed once and pasted."""
    assert C.rs_parity_matrix(4, 2).tolist() == [[1, 1, 1, 1], [1, 217, 92, 172]]
    assert C.rs_parity_matrix(6, 3).tolist() == [
        [1, 1, 1, 1, 1, 1], [1, 225, 151, 172, 82, 200], [1, 166, 196, 238, 83, 146]]
    k, n = 4, 16
    data = ((37 * np.arange(k)[:, None] + 11 * np.arange(n)[None, :] + 5) % 256).astype(np.uint8)
    expect = bytes.fromhex("1400b488bc700c78b480b4f80cf0bc88"
                           "37f8634e7a23595bc62af9145c80a056")
    assert C.rs_encode(data, 2).tobytes() == expect
    assert C.rs_encode_numpy(data, 2).tobytes() == expect


# ----------------------------------------------------------------------------- RS decode

@pytest.mark.parametrize("k,m,n", [(1, 1, 33), (2, 2, 17), (4, 2, 1001), (5, 3, 64), (3, 4, 9)])
def test_rs_decode_every_erasure_pattern(rng, k, m, n):
    data = rng.integers(0, 256, (k, n), dtype=np.uint8)
    parity = C.rs_encode(data, m)
    allb = {b: (data[b] if b < k else parity[b - k]) for b in range(k + m)}
    for nlost in range(0, m + 1):
        for lost in itertools.combinations(range(k + m), nlost):
            blocks = {b: a for b, a in allb.items() if b not in lost}
            got = C.rs_decode(blocks, k, m, n)
            assert np.array_equal(got, data), (k, m, lost)
            assert np.array_equal(C.rs_decode_numpy(blocks, k, m, n), data)


def test_rs_decode_unaligned_and_odd(rng):
    k, m, n = 4, 2, 100003
    data = rng.integers(0, 256, (k, n), dtype=np.uint8)
    parity = C.rs_encode(data, m)
    blocks = {1: _unaligned(data[1], 1), 3: data[3], 4: _unaligned(parity[0], 7), 5: parity[1]}
    assert np.array_equal(C.rs_decode(blocks, k, m, n), data)


def test_rs_decode_coefficients_distributed(rng):
    """Each survivor multiplies its block by its coefficient column; the XOR is the lost data."""
    k, m, n = 5, 3, 777
    data = rng.integers(0, 256, (k, n), dtype=np.uint8)
    parity = C.rs_encode(data, m)
    allb = {b: (data[b] if b < k else parity[b - k]) for b in range(k + m)}
    present = [0, 2, 5, 6, 7]
    lost = [1, 3, 4]
    used, coeffs = C.rs_decode_coefficients(k, m, present, lost)
    assert used == (0, 2, 5, 6, 7) and coeffs.shape == (3, 5) and coeffs.dtype == np.uint8
    acc = np.zeros((len(lost), n), dtype=np.uint8)
    for s, b in enumerate(used):
        part = np.zeros_like(acc)
        C.gf_mul_xor_into(part, coeffs[:, s], allb[b])
        acc ^= part
    assert np.array_equal(acc, data[lost])
    # extra survivors: the lowest k are used, data blocks first
    used, _ = C.rs_decode_coefficients(k, m, [7, 6, 0, 2, 3, 5], [1, 4])
    assert used == (0, 2, 3, 5, 6)


def test_rs_decode_too_many_erasures(rng):
    k, m, n = 4, 2, 50
    data = rng.integers(0, 256, (k, n), dtype=np.uint8)
    parity = C.rs_encode(data, m)
    blocks = {0: data[0], 2: data[2], 5: parity[1]}
    with pytest.raises(HpcCkptError, match="cannot decode"):
        C.rs_decode(blocks, k, m, n)
    with pytest.raises(HpcCkptError, match="cannot decode"):
        C.rs_decode_coefficients(k, m, [0, 1, 2], [3])


def test_rs_argument_errors(rng):
    data = rng.integers(0, 256, (4, 10), dtype=np.uint8)
    with pytest.raises(HpcCkptError):
        C.rs_encode(data.astype(np.int16), 2)
    with pytest.raises(HpcCkptError):
        C.rs_encode(data, 0)
    with pytest.raises(HpcCkptError):
        C.rs_decode({0: data[0], 1: data[1], 2: data[2], 9: data[3]}, 4, 2, 10)   # bad index
    with pytest.raises(HpcCkptError):
        C.rs_decode({0: data[0], 1: data[1], 2: data[2], 3: data[3][:9]}, 4, 2, 10)
    with pytest.raises(HpcCkptError):
        C.rs_decode_coefficients(4, 2, [0, 1, 2, 3], [4])                          # parity index
    with pytest.raises(HpcCkptError):
        C.rs_decode_coefficients(4, 2, [0, 0, 1, 2], [3])                          # repeated
    out = np.zeros((2, 10), dtype=np.uint8)
    with pytest.raises(HpcCkptError):
        C.gf_mul_xor_into(out, [1, 2, 3], data[0])                                 # m mismatch
    with pytest.raises(HpcCkptError):
        C.gf_mul_xor_into(out, [1, 256], data[0])
    with pytest.raises(HpcCkptError):
        C.gf_mul_xor_into(out, [1, 2], out[0])                                     # overlap
    with pytest.raises(HpcCkptError):
        C.rs_encode(data, 2, threads=0)
