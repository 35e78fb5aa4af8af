"""The selection rule of the fault matrix (reliability.partition / slice_seed / select, used by
the hook in tests/mpi/conftest.py): every case in exactly one slice, the same slice for the same
seed, RELIABILITY_SLICE=none and RELIABILITY_FULL=1."""
import math
import random

import pytest

import reliability
from reliability import partition, select, slice_seed

KEYS = [f"{lvl}-{n}r-{f}" for lvl in ("local", "partner", "xor", "rs", "pfs") for n in (2, 4, 6, 8)
        for f in ("crash", "flip-data", "kill@write", "kill@commit", "enospc@write", "lose-1-node")]
DEFAULTS = ["local-4r-crash-default", "pfs-4r-flip-default"]
SHA = "d844fec0123456789abcdef0123456789abcdef0"


def no_git():
    return None


@pytest.mark.parametrize("size", [1, 7, 25, len(KEYS) - 1, len(KEYS), len(KEYS) + 5])
def test_partition_covers_every_key_exactly_once(size):
    slices = partition(KEYS, size)
    assert len(slices) == math.ceil(len(KEYS) / size)
    flat = [k for s in slices for k in s]
    assert sorted(flat) == sorted(KEYS) and len(flat) == len(set(flat))
    sizes = {len(s) for s in slices}
    assert max(sizes) <= size and max(sizes) - min(sizes) <= 1


def test_partition_is_deterministic_and_ignores_input_order():
    shuffled = KEYS[:]
    random.Random(1).shuffle(shuffled)
    assert partition(shuffled, 25) == partition(KEYS, 25)
    # dealt from the sorted order: slice j holds sorted keys j, j + N, j + 2N, ...
    s, n = sorted(KEYS), len(partition(KEYS, 25))
    assert partition(KEYS, 25)[3] == s[3::n]


def test_partition_edge_cases():
    assert partition([], 25) == []
    with pytest.raises(ValueError):
        partition(KEYS, 0)
    with pytest.raises(ValueError):
        partition(["a", "a"], 5)


def test_seed_from_env_commit_or_fallback():
    assert slice_seed({"RELIABILITY_SLICE": "7"}, no_git) == (7, "RELIABILITY_SLICE=7")
    assert slice_seed({"RELIABILITY_SLICE": "7"}, lambda: SHA)[0] == 7       # the variable wins
    assert slice_seed({}, lambda: SHA) == (int(SHA, 16), "seed from commit d844fec")
    seed, how = slice_seed({}, no_git)
    assert seed == reliability.FALLBACK_SEED and "git unavailable" in how
    for v in ("none", "None", " NONE "):
        assert slice_seed({"RELIABILITY_SLICE": v}, lambda: SHA)[0] is None
    for v in ("abc", "1.5", "0x10"):
        with pytest.raises(ValueError, match="RELIABILITY_SLICE"):
            slice_seed({"RELIABILITY_SLICE": v}, no_git)


def test_select_slice_is_deterministic_for_a_seed():
    slices = partition(KEYS, 25)
    n = len(slices)
    for seed in (0, 3, n - 1, n, 12345, int(SHA, 16)):
        env = {"RELIABILITY_SLICE": str(seed)}
        a, b = select(DEFAULTS, KEYS, False, env, no_git), select(DEFAULTS, KEYS, False, env, no_git)
        assert a.index == b.index == seed % n and a.count == n
        assert a.keys == b.keys == frozenset(DEFAULTS) | frozenset(slices[seed % n])
    by_commit = select(DEFAULTS, KEYS, False, {}, lambda: SHA)
    assert by_commit.index == int(SHA, 16) % n
    assert by_commit.keys == select(DEFAULTS, KEYS, False, {"RELIABILITY_SLICE": str(by_commit.index)}, no_git).keys
    line = by_commit.line()
    assert f"slice {by_commit.index} of {n}" in line and "seed from commit d844fec" in line
    assert f"RELIABILITY_SLICE={by_commit.index} reruns it" in line and f"all {len(DEFAULTS) + len(KEYS)}" in line


def test_consecutive_seeds_cover_the_whole_pool():
    n = len(partition(KEYS, 25))
    seen = set()
    for seed in range(n):
        seen |= select(DEFAULTS, KEYS, False, {"RELIABILITY_SLICE": str(seed)}, no_git).keys
    assert seen == set(DEFAULTS) | set(KEYS)


def test_none_disables_the_slice_and_full_runs_everything():
    off = select(DEFAULTS, KEYS, False, {"RELIABILITY_SLICE": "none"}, lambda: SHA)
    assert off.index is None and off.keys == frozenset(DEFAULTS) and "no slice" in off.line()
    full = select(DEFAULTS, KEYS, None, {"RELIABILITY_FULL": "1", "RELIABILITY_SLICE": "none"}, no_git)
    assert full.full and full.keys == frozenset(DEFAULTS) | frozenset(KEYS)
    assert full.line() == f"fault matrix: all {len(DEFAULTS) + len(KEYS)} cases (RELIABILITY_FULL=1)"
    assert not select(DEFAULTS, KEYS, None, {"RELIABILITY_FULL": "0"}, no_git).full
    with pytest.raises(ValueError):
        select(["a"], ["a", "b"], False, {}, no_git)


def test_git_commit_of_this_checkout_or_none(tmp_path):
    sha = reliability.git_commit()
    assert sha is None or (len(sha) in (40, 64) and int(sha, 16) >= 0)
    assert reliability.git_commit(str(tmp_path / "not-a-checkout")) is None


def test_the_real_matrix_keys():
    import test_fault_matrix as m        # builds the case list only; runs no job
    pool = [k for k, d in m.MATRIX_KEYS.items() if not d]
    defaults = [k for k, d in m.MATRIX_KEYS.items() if d]
    slices = partition(pool, reliability.SLICE_SIZE)
    assert defaults and pool and max(len(s) for s in slices) <= reliability.SLICE_SIZE
    assert sorted(k for s in slices for k in s) == sorted(pool)
    assert {c.id for c in m.ALL_CASES if c.default} <= set(defaults)
