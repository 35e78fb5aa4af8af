"""hpcckpt.codecs.xxh3: the copy-and-checksum kernel against its NumPy reference, and both against
the xxhash library (the digest that restart and ``hpcckpt verify`` recompute)."""
import subprocess
import sys

import numpy as np
import pytest
import xxhash

from hpcckpt.codecs import xxh3
from hpcckpt.errors import HpcCkptError

# around every boundary of the algorithm: the 240-byte limit, stripes (64), blocks (1024)
SIZES = [0, 1, 17, 240, 241, 255, 256, 1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048, 2049,
         4096 + 64, 100003, (1 << 20) + 13]


@pytest.fixture
def rng():
    return np.random.default_rng(20261203)


@pytest.fixture(autouse=True)
def kernel_at_every_size(monkeypatch):
    """The tests below take the kernel at every size over 240 bytes (by default arrays shorter
    than xxh3.FUSED_MIN_BYTES are copied and hashed in two passes)."""
    monkeypatch.setattr(xxh3, "FUSED_MIN_BYTES", 0)


def _at(nbytes, misalign=0):
    """An uint8 array of nbytes whose data starts ``misalign`` bytes past a 64-byte boundary."""
    raw = np.empty(nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + misalign
    return raw[start:start + nbytes]


def test_import_loads_no_numba():
    code = ("import sys, hpcckpt.storage, hpcckpt.data_file, hpcckpt.codecs.xxh3\n"
            "assert 'numba' not in sys.modules, 'importing the storage layer must not import Numba'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_numpy_reference_is_xxh3_64(rng):
    for n in [s for s in SIZES if s > xxh3.MIDSIZE_MAX]:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert xxh3.xxh3_64_numpy(data) == xxhash.xxh3_64_intdigest(data), n
    with pytest.raises(HpcCkptError, match="over 240"):
        xxh3.xxh3_64_numpy(np.zeros(240, np.uint8))


def test_kernel_matches_numpy_reference(rng):
    for blocks in (1, 2, 7, 64):
        words = rng.integers(0, 2**64, blocks * xxh3.BLOCK_WORDS, dtype=np.uint64)
        acc_kernel, acc_numpy = xxh3.INIT_ACC.copy(), xxh3.INIT_ACC.copy()
        dst = _at(words.nbytes).view(np.uint64)
        xxh3.copy_accumulate_blocks(words, dst, acc_kernel)
        xxh3.accumulate_blocks_numpy(words, acc_numpy)
        assert np.array_equal(acc_kernel, acc_numpy), blocks
        assert np.array_equal(dst, words)


def test_kernel_argument_checks():
    acc = xxh3.INIT_ACC.copy()
    words = np.zeros(xxh3.BLOCK_WORDS, np.uint64)
    with pytest.raises(HpcCkptError, match="whole blocks"):
        xxh3.copy_accumulate_blocks(words[:100], _at(800).view(np.uint64), acc)
    with pytest.raises(HpcCkptError, match="64-byte aligned"):
        xxh3.copy_accumulate_blocks(words, _at(1024, 8).view(np.uint64), acc)


def test_the_kernel_passes_its_self_check():
    """On the machines we run on, the fused path is in use (not the two-pass fallback)."""
    assert xxh3.fused_available()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("src_misalign,dst_misalign", [(0, 0), (8, 0), (3, 0), (0, 8)])
def test_copy_and_hash_is_a_copy_and_the_xxhash_digest(rng, n, src_misalign, dst_misalign):
    """Aligned inputs take the kernel, misaligned ones the two-pass path: same copy, same digest."""
    src = _at(n, src_misalign)
    src[:] = rng.integers(0, 256, n, dtype=np.uint8)
    dst = _at(n, dst_misalign)
    dst[:] = 0xAB
    assert xxh3.copy_and_hash(src, dst, 4096) == xxhash.xxh3_64_intdigest(src)
    assert np.array_equal(dst, src)


def test_copy_and_hash_read_only_source_and_chunk_hook(rng):
    n = 10 * 4096 + 100
    src = rng.integers(0, 256, n, dtype=np.uint8)
    src.flags.writeable = False
    dst = _at(n)
    calls = []
    digest = xxh3.copy_and_hash(src, dst, 4096, after_chunk=calls.append)
    assert digest == xxhash.xxh3_64_intdigest(src) and np.array_equal(dst, src)
    assert len(calls) == -(-n // 4096)      # once per chunk, the tail's chunk included
    calls.clear()
    xxh3.copy_and_hash(src, dst, 5000, after_chunk=calls.append)   # rounded to whole blocks
    assert len(calls) == -(-n // 4096)


@pytest.mark.parametrize("dst_misalign", [0, 8])      # the fused kernel, and the two-pass path
def test_copy_and_hash_hook_reports_the_final_prefix(rng, dst_misalign):
    """after_chunk(done): dst[:done] is already the copy (what the pfs flush writes out early),
    done grows, and the last call reports the whole array."""
    n = 9 * 4096 + 777
    src = rng.integers(0, 256, n, dtype=np.uint8)
    dst = _at(n, dst_misalign)
    dst[:] = 0
    seen = []

    def hook(done):
        assert np.array_equal(dst[:done], src[:done])
        seen.append(done)
    assert xxh3.copy_and_hash(src, dst, 4096, after_chunk=hook) == xxhash.xxh3_64_intdigest(src)
    assert seen == sorted(seen) and seen[-1] == n and len(seen) == -(-n // 4096)


def test_copy_and_hash_stops_where_the_hook_raises(rng):
    """A fault in the middle leaves the rest of the destination untouched (a partial write)."""
    n = 8 * 4096
    src = rng.integers(0, 256, n, dtype=np.uint8)
    dst = _at(n)
    dst[:] = 0

    def fail_on_third(done):
        fail_on_third.calls += 1
        if fail_on_third.calls == 3:
            raise OSError(28, "injected")
    fail_on_third.calls = 0
    with pytest.raises(OSError, match="injected"):
        xxh3.copy_and_hash(src, dst, 4096, after_chunk=fail_on_third)
    assert np.array_equal(dst[:3 * 4096], src[:3 * 4096]) and not dst[3 * 4096:].any()


def test_copy_and_hash_size_mismatch():
    with pytest.raises(HpcCkptError, match="destination"):
        xxh3.copy_and_hash(np.zeros(10, np.uint8), np.zeros(9, np.uint8), 4096)


def test_aligned_inputs_take_the_kernel(rng, monkeypatch):
    used = []
    real = xxh3._copy_and_hash_fused
    monkeypatch.setattr(xxh3, "_copy_and_hash_fused", lambda *a: used.append(1) or real(*a))
    src = rng.integers(0, 256, 5000, dtype=np.uint8)
    xxh3.copy_and_hash(src, _at(5000), 4096)
    assert used == [1]
    xxh3.copy_and_hash(src[:240], _at(240), 4096)     # the xxhash library's short-input paths
    xxh3.copy_and_hash(src, _at(5000, 8), 4096)       # destination not 64-byte aligned
    assert used == [1]
    monkeypatch.setattr(xxh3, "FUSED_MIN_BYTES", 5001)  # shorter arrays: two passes, no Numba needed
    assert xxh3.copy_and_hash(src, _at(5000), 4096) == xxhash.xxh3_64_intdigest(src)
    assert used == [1]


def test_a_short_array_loads_no_numba():
    code = ("import sys, numpy as np, xxhash\n"
            "from hpcckpt.codecs import xxh3\n"
            "src = np.arange(xxh3.FUSED_MIN_BYTES - 1, dtype=np.uint64).view(np.uint8)[:xxh3.FUSED_MIN_BYTES - 1]\n"
            "dst = np.empty_like(src)\n"
            "assert xxh3.copy_and_hash(src, dst, 1 << 16) == xxhash.xxh3_64_intdigest(src)\n"
            "assert (dst == src).all() and 'numba' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_kernel_that_fails_its_check_is_not_used(rng, monkeypatch, caplog):
    """A miscompiled (here: do-nothing) kernel is caught by the self-check: the two-pass path
    takes over, with a warning, and the digest is still right."""
    monkeypatch.setattr(xxh3, "_kernel", lambda: (lambda src, dst, acc, keys: None))
    xxh3.fused_available.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="hpcckpt"):
            assert not xxh3.fused_available()
        assert "wrong results" in caplog.text
        src = rng.integers(0, 256, 5000, dtype=np.uint8)
        dst = _at(5000)
        assert xxh3.copy_and_hash(src, dst, 4096) == xxhash.xxh3_64_intdigest(src)
        assert np.array_equal(dst, src)
    finally:
        xxh3.fused_available.cache_clear()


def test_restart_loads_the_kernel_in_the_background_for_a_large_array(tmp_path):
    """Checkpointer.restart() with an array of FUSED_MIN_BYTES or more protected starts loading
    Numba and the kernel in a thread (xxh3.preload), so the first checkpoint does not wait for
    it; with short arrays only it does not. One process (MPI.COMM_SELF) in a fresh interpreter."""
    code = (
        "import sys, numpy as np\n"
        "from mpi4py import MPI\n"
        "import hpcckpt\n"
        "from hpcckpt.codecs import xxh3\n"
        "kw = dict(name='p', cache_dir=sys.argv[1] + '/node{node}', pfs_dir=sys.argv[1] + '/pfs')\n"
        "big = np.arange(xxh3.FUSED_MIN_BYTES // 8, dtype=np.float64)\n"
        "with hpcckpt.Checkpointer(MPI.COMM_SELF, **kw) as ck:\n"
        "    small = np.zeros(1000)\n"
        "    ck.protect('small', small)\n"
        "    assert ck.restart() is None and xxh3._preload is None and 'numba' not in sys.modules\n"
        "with hpcckpt.Checkpointer(MPI.COMM_SELF, **kw) as ck:\n"
        "    small = np.zeros(1000)\n"
        "    ck.protect('small', small)\n"
        "    ck.protect('big', big)\n"
        "    assert xxh3._preload is None\n"
        "    assert ck.restart() is None and xxh3._preload is not None\n"
        "    xxh3._preload.join(120)\n"
        "    assert 'numba' in sys.modules and xxh3.fused_available.cache_info().currsize == 1\n"
        "    ck.checkpoint(1, 'local')\n"
        "keep, big[:] = big.copy(), 0\n"
        "with hpcckpt.Checkpointer(MPI.COMM_SELF, **kw) as ck:\n"
        "    small = np.zeros(1000)\n"
        "    ck.protect('small', small)\n"
        "    ck.protect('big', big)\n"
        "    assert ck.restart() == 1 and np.array_equal(big, keep)\n"
        "print('OK')\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stdout + res.stderr
