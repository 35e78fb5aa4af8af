"""Arithmetic in GF(2^8) with the field polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d).

Everything here is local and pure (no MPI, no I/O). Tables are built once at import with
NumPy (a few milliseconds); nothing is compiled. Scalars are plain ints in 0..255; arrays are
uint8. The generator of the multiplicative group is 2.

Public names:
    POLY, EXP_TABLE, LOG_TABLE, INV_TABLE, MUL_TABLE
    gf_mul, gf_div, gf_inv, gf_pow
    gf_matmul, gf_matinv
    cauchy_matrix, encoding_matrix, check_code_params
"""
import numbers

import numpy as np

from ..errors import HpcCkptError

POLY = 0x11d
"""The field polynomial x^8 + x^4 + x^3 + x^2 + 1 (the one of ISA-L, zfec, Jerasure, Linux RAID-6)."""


def _build_tables():
    exp = np.zeros(512, dtype=np.uint8)
    log = np.zeros(256, dtype=np.int32)
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= POLY
    exp[255:510] = exp[0:255]          # so EXP[LOG[a] + LOG[b]] needs no modulo
    exp[510:] = exp[0:2]
    inv = np.zeros(256, dtype=np.uint8)   # INV[0] stays 0 (0 has no inverse)
    inv[1:] = exp[255 - log[1:]]
    a = np.arange(256)
    mul = exp[log[a][:, None] + log[a][None, :]]
    mul[0, :] = 0
    mul[:, 0] = 0
    for t in (exp, log, inv, mul):
        t.flags.writeable = False
    return exp, log, inv, np.ascontiguousarray(mul, dtype=np.uint8)


EXP_TABLE, LOG_TABLE, INV_TABLE, MUL_TABLE = _build_tables()
"""EXP_TABLE[i] = 2^i (512 entries, period 255); LOG_TABLE[a] = log_2 a (LOG_TABLE[0] is
meaningless); INV_TABLE[a] = 1/a (INV_TABLE[0] = 0); MUL_TABLE[a, b] = a*b (256 x 256 uint8).
All read-only."""


def _check_elem(a, what="element"):
    if isinstance(a, (bool, np.bool_)) or not isinstance(a, numbers.Integral) or not 0 <= a <= 255:
        raise HpcCkptError(f"GF(256) {what} must be an int in 0..255, got {a!r}")
    return int(a)


def gf_mul(a, b):
    """a * b in GF(256). Local, pure. Ints give an int; uint8 arrays broadcast elementwise."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return MUL_TABLE[np.asarray(a, dtype=np.uint8), np.asarray(b, dtype=np.uint8)]
    return int(MUL_TABLE[_check_elem(a), _check_elem(b)])


def gf_inv(a):
    """1 / a in GF(256); HpcCkptError for 0. Local, pure."""
    a = _check_elem(a)
    if a == 0:
        raise HpcCkptError("0 has no inverse in GF(256)")
    return int(INV_TABLE[a])


def gf_div(a, b):
    """a / b in GF(256); HpcCkptError when b is 0. Local, pure."""
    return gf_mul(_check_elem(a), gf_inv(b))


def gf_pow(a, e):
    """a ** e in GF(256) for an int e >= 0 (0 ** 0 == 1). Local, pure."""
    a = _check_elem(a)
    if not isinstance(e, numbers.Integral) or e < 0:
        raise HpcCkptError(f"exponent must be an int >= 0, got {e!r}")
    if e == 0:
        return 1
    if a == 0:
        return 0
    return int(EXP_TABLE[(int(LOG_TABLE[a]) * int(e)) % 255])


def _as_matrix(a, name):
    a = np.asarray(a)
    if a.ndim != 2:
        raise HpcCkptError(f"{name} must be a 2-D matrix, got shape {a.shape}")
    if a.dtype != np.uint8:
        if not np.issubdtype(a.dtype, np.integer) or a.size and (a.min() < 0 or a.max() > 255):
            raise HpcCkptError(f"{name} must hold GF(256) elements (ints 0..255)")
        a = a.astype(np.uint8)
    return a


def gf_matmul(a, b):
    """Matrix product a @ b over GF(256): (r, s) x (s, c) -> (r, c) uint8. Local, pure (NumPy)."""
    a = _as_matrix(a, "a")
    b = _as_matrix(b, "b")
    if a.shape[1] != b.shape[0]:
        raise HpcCkptError(f"cannot multiply {a.shape} by {b.shape}")
    if a.shape[1] == 0:
        return np.zeros((a.shape[0], b.shape[1]), dtype=np.uint8)
    return np.bitwise_xor.reduce(MUL_TABLE[a[:, :, None], b[None, :, :]], axis=1)


def gf_matinv(a):
    """Inverse of a square matrix over GF(256) by Gauss-Jordan elimination. Local, pure.

    Raises HpcCkptError when the matrix is not square or is singular.
    """
    a = _as_matrix(a, "matrix")
    n = a.shape[0]
    if a.shape != (n, n):
        raise HpcCkptError(f"only square matrices have an inverse, got shape {a.shape}")
    work = np.concatenate([a, np.eye(n, dtype=np.uint8)], axis=1)
    for col in range(n):
        nz = np.flatnonzero(work[col:, col])
        if nz.size == 0:
            raise HpcCkptError(f"matrix is singular over GF(256) (no pivot in column {col})")
        piv = col + int(nz[0])
        if piv != col:
            work[[col, piv]] = work[[piv, col]]
        work[col] = MUL_TABLE[INV_TABLE[work[col, col]], work[col]]
        factors = work[:, col].copy()
        factors[col] = 0
        rows = np.flatnonzero(factors)
        if rows.size:
            work[rows] ^= MUL_TABLE[factors[rows][:, None], work[col][None, :]]
    return np.ascontiguousarray(work[:, n:])


def check_code_params(k, m):
    """Validate a (k data, m parity) code over GF(256): ints, k >= 1, m >= 1, k + m <= 256."""
    for name, v in (("k", k), ("m", m)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise HpcCkptError(f"{name} must be an int, got {v!r}")
    if k < 1 or m < 1:
        raise HpcCkptError(f"need k >= 1 data and m >= 1 parity blocks, got k={k}, m={m}")
    if k + m > 256:
        raise HpcCkptError(f"GF(256) codes need k + m <= 256, got k={k}, m={m}")
    return int(k), int(m)


def cauchy_matrix(k, m):
    """The m x k parity part of the systematic code (uint8). Local, pure.

    Start from the Cauchy matrix C[j, i] = 1 / (x_j + y_i) with y_i = i (i < k) and
    x_j = k + j (j < m); the x's and y's are distinct elements, so every square submatrix of C
    is invertible. Then scale each column so that row 0 is all ones, and each row so that column
    0 is all ones (scaling rows/columns by nonzero constants keeps that property). Parity 0 is
    therefore the plain XOR of the data blocks, and data block 0 enters every parity as is.
    """
    k, m = check_code_params(k, m)
    x = np.arange(k, k + m, dtype=np.uint8)[:, None]
    y = np.arange(k, dtype=np.uint8)[None, :]
    c = INV_TABLE[x ^ y]
    c = MUL_TABLE[c, INV_TABLE[c[0]][None, :]]          # row 0 -> ones
    c = MUL_TABLE[c, INV_TABLE[c[:, 0]][:, None]]       # column 0 -> ones
    return np.ascontiguousarray(c, dtype=np.uint8)


def encoding_matrix(k, m):
    """The (k + m) x k generator of the systematic MDS code: identity on top, cauchy_matrix
    below. Any k of its rows form an invertible matrix. Local, pure."""
    k, m = check_code_params(k, m)
    return np.concatenate([np.eye(k, dtype=np.uint8), cauchy_matrix(k, m)], axis=0)
