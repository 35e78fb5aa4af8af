"""Do the ranks agree on the dtype and layout of each array name? (Collective; the first
checkpoint of a Checkpointer whose pfs level is in force.)

The node cache (local, partner, xor, rs) stores each rank's arrays as its own, so a name whose
dtype differs between ranks (a state-dict key that is float64 on one rank and float32 on
another) checkpoints there; the pfs level keeps one dtype per array name in its index and
refuses it (``levels/pfs_items.py``, ``index_entries``). ``check`` says so at the first checkpoint of any
level instead of at the first pfs step of the schedule, with the pfs level's message, on every
rank.

Traffic that does not grow with the rank count, whichever names each rank holds: every rank
hashes each of its names into one of ``buckets(most)`` buckets (64, or 4 per name of the rank
with the most names: an agreement of one word gives it) and reduces, per bucket, the maximum
and minimum of the name's hash and of the hash of (name, dtype, layout), and whether two of its
own names share the bucket (5 words, 40 bytes, per bucket). A bucket that every rank filled
with one and the same name is decided by those words: equal type hashes agree, different ones
disagree. The names of the other buckets (two names in one bucket, on one rank or across ranks)
are hashed again with another seed in the next round, over fewer buckets, until every bucket is
decided (about one name in five takes a second round, one in 25 a third). Only a disagreement
gathers details (its names), to name the first one as the pfs level would. Two different names
with equal 64-bit hashes would be taken for one name (odds about 2^-64 per pair).
"""
import hashlib

import numpy as np

from .comm import Collective, explain, mark_collective, reduce_max
from .errors import ProtectError

BUCKETS = 64
ROUNDS = 16
_TOP = (1 << 64) - 1
SHARED = ("replicated", "root")     # written by rank 0 only at the pfs level


def _hash(seed, text):
    """Local, pure: an int in [1, 2^64 - 2] (0 and 2^64 - 1 stand for an empty bucket in the reduction)."""
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, salt=seed.to_bytes(16, "little")).digest(),
                       "little")
    return h % (_TOP - 1) + 1


def described(items, rank):
    """Local: [(name, dtype str, layout kind)] of (name, array, Layout) items, as the pfs level
    sees them (shared layouts count on rank 0 only)."""
    return [(name, a.dtype.str, layout.kind) for name, a, layout in items
            if layout.kind not in SHARED or rank == 0]


def buckets(most):
    """Local, pure: the buckets of a round whose rank with the most names has ``most``: a power
    of two, at least BUCKETS and 4 per name (about one name in five then shares its bucket and
    goes to the next round)."""
    return max(BUCKETS, 1 << max(0, 4 * most - 1).bit_length())


def _words(nh, th, nb):
    """Local: this rank's words of one round: per bucket the name hashes' maximum and TOP minus
    their minimum, the same for the type hashes, and 1 where two of its names share it; and
    each name's bucket."""
    b = (nh % np.uint64(nb)).astype(np.intp)
    w = np.zeros((nb, 5), np.uint64)
    np.maximum.at(w[:, 0], b, nh)
    np.maximum.at(w[:, 1], b, np.uint64(_TOP) - nh)
    np.maximum.at(w[:, 2], b, th)
    np.maximum.at(w[:, 3], b, np.uint64(_TOP) - th)
    w[:, 4] = np.bincount(b, minlength=nb) > 1
    return w, b


def check(comm, items, what):
    """Collective: raise ProtectError on every rank when two ranks hold an array name with
    different dtypes or layouts (the pfs level's message); ``items``: this rank's
    [(name, dtype str, layout kind)] (``described``)."""
    entries = list(items)
    for seed in range(ROUNDS):
        with Collective(comm, f"{what}: comparing the arrays' dtypes between ranks") as c:
            nh = np.array([_hash(seed, name) for name, _, _ in entries], np.uint64)
            th = np.array([_hash(seed, f"{name}\0{dtype}\0{kind}") for name, dtype, kind in entries], np.uint64)
            c.words = [len(entries)]
        nb = buckets(c.result[0])
        mine, b = _words(nh, th, nb)
        r = np.array(reduce_max(comm, mine.ravel()), np.uint64).reshape(nb, 5)
        filled = r[:, 0] != 0
        one_name = filled & (r[:, 4] == 0) & (r[:, 0] == np.uint64(_TOP) - r[:, 1])
        differ = one_name & (r[:, 2] != np.uint64(_TOP) - r[:, 3])
        if differ.any():
            _disagree(comm, [e for e, i in zip(entries, b) if differ[i]])
        undecided = filled & ~one_name          # the same on every rank: from the reduction
        if not undecided.any():
            return
        entries = [e for e, i in zip(entries, b) if undecided[i]]
    _disagree(comm, entries)        # still undecided (never seen): compare those names exactly


def _disagree(comm, entries):
    """Collective (failure path): name the first array the ranks disagree on, as the pfs level does."""
    def pick(everyone):
        seen = {}
        for rank, theirs in enumerate(everyone):
            for name, dtype, kind in theirs:
                first = seen.setdefault(name, (dtype, kind))
                if first != (dtype, kind):
                    return (f"array {name!r}: the ranks disagree on its dtype or layout (rank {rank}: {dtype} "
                            f"{kind}; a lower rank: {first[0]} {first[1]}); the node cache would store it, the pfs "
                            "level cannot (one dtype per array name): give it one dtype on every rank, or a name "
                            "of its own per dtype (docs/PORTING.md)")
        return None
    text = explain(comm, entries, pick)
    if text is not None:
        raise mark_collective(ProtectError(text))
