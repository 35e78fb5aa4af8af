"""Erasure-coding kernels for the XOR and Reed-Solomon levels. Local and pure (no MPI, no I/O).

Importing this package compiles nothing: the Numba kernels compile on their first call and are
cached on disk (``cache=True``; set NUMBA_CACHE_DIR where the package directory is read-only).
See docs/CODECS.md.
"""
from .gf256 import (  # noqa: F401
    POLY, EXP_TABLE, LOG_TABLE, INV_TABLE, MUL_TABLE, gf_mul, gf_div, gf_inv, gf_pow,
    gf_matmul, gf_matinv, cauchy_matrix, encoding_matrix, check_code_params)
from .xor import (  # noqa: F401
    xor_into, xor_accumulate, xor_into_numpy, xor_accumulate_numpy)
from .rs import (  # noqa: F401
    rs_parity_matrix, gf_mul_xor_into, gf_combine_into, rs_encode, rs_decode,
    rs_decode_coefficients, gf_mul_xor_into_numpy, gf_combine_into_numpy, rs_encode_numpy,
    rs_decode_numpy)

__all__ = [
    "POLY", "EXP_TABLE", "LOG_TABLE", "INV_TABLE", "MUL_TABLE", "gf_mul", "gf_div", "gf_inv",
    "gf_pow", "gf_matmul", "gf_matinv", "cauchy_matrix", "encoding_matrix", "check_code_params",
    "xor_into", "xor_accumulate", "xor_into_numpy", "xor_accumulate_numpy",
    "rs_parity_matrix", "gf_mul_xor_into", "gf_combine_into", "rs_encode", "rs_decode",
    "rs_decode_coefficients", "gf_mul_xor_into_numpy", "gf_combine_into_numpy",
    "rs_encode_numpy", "rs_decode_numpy",
]
