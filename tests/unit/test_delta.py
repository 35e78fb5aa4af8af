"""Pure logic of incremental redundancy (hpcckpt/levels/delta.py): block digests against the NumPy
XXH3 reference, changed blocks, delta streams applied, the digests file, piece segments, the
parity delta of XOR and RS equal to the recomputed parity, config keys, the manifest's base."""
import dataclasses

import numpy as np
import pytest

from hpcckpt import Config, ConfigError, manifest as mf
from hpcckpt.codecs.rs import gf_combine_into_numpy, rs_parity_matrix
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.levels import delta


def changed_copy(rng, data, block, frac):
    n = delta.block_count(data.size, block)
    picked = np.sort(rng.choice(n, int(round(frac * n)), replace=False))
    new = data.copy()
    for b in picked:
        lo, hi = b * block, min((b + 1) * block, data.size)
        new[lo:hi] = rng.integers(0, 256, hi - lo, dtype=np.uint8)
        if hi - lo and np.array_equal(new[lo:hi], data[lo:hi]):
            new[lo] ^= 1
    return new, picked


@pytest.mark.parametrize("size", [0, 1, 100, 240, 241, 4096, 4096 * 5 + 17, 70000])
def test_block_digests_match_reference(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    got = delta.block_digests(data, 4096)
    assert got.dtype == np.uint64 and got.size == delta.block_count(size, 4096)
    assert np.array_equal(got, delta.block_digests_reference(data, 4096))


@pytest.mark.parametrize("frac", [0.0, 0.1, 1.0])
def test_changed_blocks_stream_and_apply(frac):
    rng = np.random.default_rng(7)
    block, size = 4096, 4096 * 40 + 123
    old = rng.integers(0, 256, size, dtype=np.uint8)
    new, picked = changed_copy(rng, old, block, frac)
    blocks = delta.changed_blocks(delta.block_digests(new, block), delta.block_digests(old, block))
    assert list(blocks) == list(picked)
    nbytes = delta.delta_bytes(blocks, block, size)
    stream = np.empty(nbytes, np.uint8)
    read = delta.stream_reader(new, blocks, block)
    for off in range(0, nbytes, 5000):            # in chunks that do not align with blocks
        read(stream[off:off + 5000], off)
    target = old.copy()
    delta.apply_blocks(target, stream, blocks, block, size)
    assert np.array_equal(target, new)
    with pytest.raises(CorruptCheckpointError):
        delta.apply_blocks(old.copy(), stream[:-1] if nbytes else np.zeros(1, np.uint8), blocks, block, size)


@pytest.mark.parametrize("grow", [1, 5000, 3 * 4096, -1, -4096 - 50, -30 * 4096])
def test_data_that_changed_size_is_the_base_cut_or_extended_plus_the_delta(grow):
    """A grown or shrunk step: the blocks whole in both are compared, every later one is in the
    delta, and base (cut or extended with zeros to the new size) + delta is the new data."""
    rng = np.random.default_rng(abs(grow))
    block, base_size = 4096, 4096 * 40 + 123
    old = rng.integers(0, 256, base_size, dtype=np.uint8)
    size = base_size + grow
    new = np.concatenate([old[:size], rng.integers(0, 256, max(0, grow), dtype=np.uint8)])
    new[5 * block + 9] ^= 1                                     # and one block changed in place
    blocks = delta.changed_blocks(delta.block_digests(new, block), delta.block_digests(old, block), size,
                                  base_size, block)
    tail = delta.tail_blocks(size, base_size, block)
    assert tail == min(size, base_size) // block
    assert list(blocks) == [5] + list(range(tail, delta.block_count(size, block)))
    info = delta.check_delta_info(delta.delta_info(1, "id", block, size, blocks, base_size), "x")
    assert info["base_size"] == base_size
    stream = np.empty(delta.delta_bytes(blocks, block, size), np.uint8)
    delta.stream_reader(new, blocks, block)(stream, 0)
    target = np.concatenate([old[:size], np.zeros(max(0, grow), np.uint8)])
    delta.apply_blocks(target, stream, blocks, block, size)
    assert np.array_equal(target, new)
    with pytest.raises(CorruptCheckpointError, match="new blocks are not all in the delta"):
        delta.check_delta_info(delta.delta_info(1, "id", block, size, [5], base_size), "x")


def test_digests_file_roundtrip_and_damage(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 50000, dtype=np.uint8)
    d = delta.block_digests(data, 4096)
    path = str(tmp_path / "rank_000000.blocks")
    delta.write_digests(path, 4096, data.size, d, 0o600)
    assert np.array_equal(delta.read_digests(path, 4096, data.size), d)
    assert delta.read_digests(path, 8192, data.size) is None          # another block size
    assert delta.read_digests(path, 4096, data.size + 1) is None      # another data size
    assert delta.read_digests(str(tmp_path / "missing"), 4096, data.size) is None
    raw = bytearray(open(path, "rb").read())
    raw[40] ^= 1
    open(path, "wb").write(bytes(raw))
    assert delta.read_digests(path, 4096, data.size) is None          # damaged


def test_piece_segments_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(50):
        block = int(rng.choice([4096, 8192]))
        size = int(rng.integers(1, 100000))
        piece = int(rng.integers(1, 40000)) // 8 * 8 + 8
        seg = int(rng.choice([4096, 8192, 12288]))
        nb = delta.block_count(size, block)
        blocks = np.sort(rng.choice(nb, int(rng.integers(0, nb + 1)), replace=False))
        mask = np.zeros(size, bool)
        for b in blocks:
            mask[b * block:(b + 1) * block] = True
        for q in range(-(-size // piece)):
            want = [t for t in range(-(-piece // seg))
                    if mask[q * piece + t * seg:min(q * piece + min((t + 1) * seg, piece), size)].any()]
            assert delta.piece_segments(blocks, block, size, q, piece, seg) == want


@pytest.mark.parametrize("kd,m", [(3, 1), (2, 2), (5, 3)])
def test_parity_delta_equals_recomputed_parity(kd, m):
    """XOR (m = 1) and RS are linear: P_S = P_B xor coef * (d_S xor d_B), segment by segment."""
    rng = np.random.default_rng(kd * 10 + m)
    n, block = 4096 * 6, 4096
    coef = rs_parity_matrix(kd, m)
    old = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(kd)]
    new = [changed_copy(rng, d, block, 0.3)[0] for d in old]

    def parity(data):
        out = np.zeros((m, n), np.uint8)
        return gf_combine_into_numpy(out, coef, data)
    p_old, p_new = parity(old), parity(new)
    patched = p_old.copy()
    gf_combine_into_numpy(patched, coef, [a ^ b for a, b in zip(new, old)])
    assert np.array_equal(patched, p_new)
    if m == 1:
        assert np.array_equal(p_new[0], np.bitwise_xor.reduce(new))   # plain XOR


def test_delta_info_validation():
    doc = delta.delta_info(3, "abc", 4096, 10000, [0, 2])
    assert delta.check_delta_info(doc, "x") is doc
    for bad in ({**doc, "blocks": [2, 0]}, {**doc, "blocks": [3]}, {**doc, "format": "x"}, {**doc, "block": 0},
                {**doc, "base_step": -1}, [], {**doc, "version": 2}, {**doc, "base_size": -1},
                {**doc, "base_size": "10000"}, {**doc, "base_size": 4096 + 5}):
        with pytest.raises(CorruptCheckpointError):
            delta.check_delta_info(bad, "x")


def test_config_keys(tmp_path):
    c = Config.load(None, environ={"HPCCKPT_INCREMENTAL": "true", "HPCCKPT_INCREMENTAL_BLOCK": "64KiB",
                                   "HPCCKPT_INCREMENTAL_FULL_EVERY": "3", "HPCCKPT_INCREMENTAL_MAX_CHANGED": "0.25"},
                    cache_dir=str(tmp_path))
    assert (c.incremental, c.incremental_block, c.incremental_full_every, c.incremental_max_changed) == \
        (True, 65536, 3, 0.25)
    d = Config.load(None, environ={}, cache_dir=str(tmp_path))
    assert (d.incremental, d.incremental_block, d.incremental_full_every, d.incremental_max_changed) == \
        (False, 1 << 20, 8, 0.5)
    for bad in ({"incremental_block": 1000}, {"incremental_block": 6000}, {"incremental_full_every": 0},
                {"incremental_max_changed": 1.5}, {"incremental": "yes"}):
        with pytest.raises(ConfigError):
            Config.load(None, environ={}, cache_dir=str(tmp_path), **bad)


def test_manifest_base_roundtrip():
    m = mf.RankManifest(name="a", world_size=2, rank=1, node=1, step=5, level="partner", ckpt_id="ff",
                        created=1.0, data_file=mf.data_file_name(1), data_size=0, arrays=())
    doc = m.to_json()
    assert "base" not in doc and mf.parse(doc, "x").base is None          # full steps: as before
    inc = dataclasses.replace(m, base=(2, "ee"))
    assert mf.parse(inc.to_json(), "x").base == (2, "ee")
    for bad in ({"step": 5, "ckpt_id": "ee"}, {"step": 1}, {"step": True, "ckpt_id": "ee"}, "x"):
        doc = m.to_json()
        doc["base"] = bad
        with pytest.raises(CorruptCheckpointError):
            mf.parse(mf.sign(doc), "x")


def test_apply_segments_round_by_round():
    piece, seg = 10000, 4096                      # 3 segments per symbol, the last one short
    base = np.zeros(2 * piece, np.uint8)
    segments = [[0, 2], [1]]                      # parity 0: segments 0 and 2; parity 1: segment 1
    lens = [4096, 4096, 1808]
    # order: round 0: parity 0 seg 0, parity 1 seg 1; round 1: parity 0 seg 2
    chunks = [np.full(lens[0], 1, np.uint8), np.full(lens[1], 2, np.uint8), np.full(lens[2], 3, np.uint8)]
    delta.apply_segments(base, np.concatenate(chunks), segments, seg, piece)
    assert (base[:4096] == 1).all() and (base[4096:8192] == 0).all() and (base[8192:piece] == 3).all()
    assert (base[piece:piece + 4096] == 0).all() and (base[piece + 4096:piece + 8192] == 2).all()
    with pytest.raises(CorruptCheckpointError):
        delta.apply_segments(base, np.zeros(10, np.uint8), segments, seg, piece)
    idx = {"segments": segments, "segment": seg, "piece": piece, "parity": 2}
    assert delta.check_parity_index(idx, 2, piece, "x") == (segments, seg)
    for bad in ({**idx, "segments": [[2, 0], [1]]}, {**idx, "segments": [[3], [1]]}, {**idx, "parity": 1},
                {**idx, "segment": 0}):
        with pytest.raises(CorruptCheckpointError):
            delta.check_parity_index(bad, 2, piece, "x")


@pytest.mark.parametrize("block", [4096, 3 * 4096, 1 << 20])
def test_block_digester_during_the_copy_equals_the_digests_of_the_file(tmp_path, block):
    """BlockDigester takes the blocks inside one array from the source as the copy passes them,
    the rest (across arrays and gaps) from the file: the same digests as block_digests of the
    written file, for arrays large and small, aligned and not."""
    from hpcckpt import data_file
    from hpcckpt.levels.delta import BlockDigester, block_digests
    rng = np.random.default_rng(5)
    arrays = [("a", rng.integers(0, 256, 3 * (1 << 20) + 17, dtype=np.uint8)), ("s", np.arange(7.0)),
              ("b", rng.random(70001)), ("c", rng.integers(0, 9, 1 << 20, dtype=np.int8))]
    d = BlockDigester(arrays, block)
    got = {}
    path = str(tmp_path / "f.dat")
    data_file.write_arrays(path, arrays, 4096 * 5, on_chunk=d.chunk,
                           on_written=lambda file_bytes: got.setdefault("d", d.finish(file_bytes).copy()))
    data = np.fromfile(path, np.uint8)
    assert data.size == d.size and d.done.any() and np.array_equal(got["d"], block_digests(data, block))
