"""hpcckpt.dtype_check's local parts, and its rounds on one rank (MPI.COMM_SELF); several
ranks that disagree: tests/mpi/test_porting.py."""
import numpy as np

import hpcckpt
from hpcckpt import dtype_check as dc


def test_shared_layouts_count_on_rank_0_only():
    items = [("u", np.zeros(3), hpcckpt.PER_RANK), ("t", np.zeros(()), hpcckpt.REPLICATED),
             ("h", np.zeros(2, np.int8), hpcckpt.ROOT)]
    assert dc.described(items, 0) == [("u", "<f8", "rank"), ("t", "<f8", "replicated"), ("h", "|i1", "root")]
    assert dc.described(items, 1) == [("u", "<f8", "rank")]


def test_two_names_of_one_rank_in_one_bucket_mark_it_crowded():
    names = [f"x{i}" for i in range(dc.BUCKETS + 1)]     # more names than buckets: one bucket holds two
    nh = np.array([dc._hash(0, n) for n in names], np.uint64)
    th = np.array([dc._hash(0, n + "<f8") for n in names], np.uint64)
    w, b = dc._words(nh, th, dc.BUCKETS)
    b = b.tolist()
    crowded = {i for i in b if b.count(i) > 1}
    assert crowded and {int(i) for i in np.flatnonzero(w[:, 4])} == crowded
    one = next(i for i in b if b.count(i) == 1)
    assert w[one, 0] == nh[b.index(one)] and w[one, 0] == dc._TOP - w[one, 1] and w[one, 2] == dc._TOP - w[one, 3]
    assert not w[[i for i in range(dc.BUCKETS) if i not in b], :].any()     # empty buckets: all zero


def test_buckets_grow_with_the_names_of_the_rank_with_most():
    assert dc.buckets(0) == dc.buckets(16) == dc.BUCKETS
    assert dc.buckets(17) == 128 and dc.buckets(2000) == 8192


def test_hashes_are_stable_and_seeded():
    assert dc._hash(0, "u") == dc._hash(0, "u") != dc._hash(1, "u")
    assert 0 < dc._hash(3, "x") < dc._TOP


def test_many_names_on_one_rank_are_sorted_out_in_rounds(monkeypatch):
    from mpi4py import MPI
    entries = [(f"x{i}", "<i4", "rank") for i in range(2000)]
    rounds = []
    real = dc._words
    monkeypatch.setattr(dc, "_words", lambda *a: rounds.append(a[2]) or real(*a))
    dc.check(MPI.COMM_SELF, entries, "test")
    assert rounds[0] == 8192 and 2 <= len(rounds) < dc.ROUNDS      # settled in a few rounds, not by the fallback
