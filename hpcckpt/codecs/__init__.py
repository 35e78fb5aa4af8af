"""Erasure-coding kernels for the XOR and Reed-Solomon levels, and the local level's
copy-and-checksum kernel (xxh3.py). Local and pure (no MPI, no I/O).

Importing this package loads nothing else: each name loads its module on first access. Numba
is loaded only with the first kernel a process needs (xxh3_kernel.py, xor_kernel.py,
rs_kernel.py): the first array of ``xxh3.FUSED_MIN_BYTES`` or more copied into the cache, the
first parity buffer of ``rs.KERNEL_MIN_BYTES`` or more; shorter ones are hashed by the xxhash
library and combined in NumPy, so a job with little data never loads Numba. The kernels
compile on their first call and are cached on disk (``cache=True``; set NUMBA_CACHE_DIR where
the package directory is read-only).
See docs/CODECS.md.
"""
_NAMES = {   # module -> the public names it defines
    "gf256": ("POLY", "EXP_TABLE", "LOG_TABLE", "INV_TABLE", "MUL_TABLE", "gf_mul", "gf_div", "gf_inv",
              "gf_pow", "gf_matmul", "gf_matinv", "cauchy_matrix", "encoding_matrix", "check_code_params"),
    "xor": ("xor_into", "xor_accumulate", "xor_into_numpy", "xor_accumulate_numpy"),
    "rs": ("rs_parity_matrix", "gf_mul_xor_into", "gf_combine_into", "rs_encode", "rs_decode",
           "rs_decode_coefficients", "gf_mul_xor_into_numpy", "gf_combine_into_numpy",
           "rs_encode_numpy", "rs_decode_numpy"),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name):
    """Load ``name`` from its module on first access (PEP 562)."""
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
