"""Shared helpers of the reliability tests (fault matrix, hostile input, soak, fuzzing).

``expected_state(rank, step)`` recomputes, in this process, the arrays matrix_app.py holds after
``step`` (the same NumPy operations, so bitwise equal). ``record(kind, row)`` keeps a result row;
with ``RELIABILITY_RECORD=DIR`` the rows are merged into ``DIR/<kind>.json`` at the end of the session
and ``python tests/tools/gen_reliability.py`` renders docs/RELIABILITY.md from them.

Which fault-matrix cases run (the hook is in tests/mpi/conftest.py; pure functions here, tested in
tests/unit/test_matrix_slice.py): the default subset always, plus one *slice* of the other cases,
and all of them with ``RELIABILITY_FULL=1``. ``partition(keys, size)`` sorts the keys and deals them
into N = ceil(len / size) slices (key i goes to slice i % N, so a slice mixes levels, rank counts
and faults, and every key is in exactly one slice); the slice run is ``seed % N``. ``slice_seed()``:
``RELIABILITY_SLICE`` (an integer, or ``none`` for no slice), else the commit of the checkout
(``git rev-parse HEAD`` read as a hex number), else FALLBACK_SEED when git cannot say.
"""
import atexit
import json
import os
import re
import subprocess

import numpy as np

FULL = os.environ.get("RELIABILITY_FULL") == "1"
RECORD = os.environ.get("RELIABILITY_RECORD")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Cases per rotating slice: a case is one or two short mpiexec jobs, 1-8 s a case on 2 cores (a
# slice mixes placements, so most of its cases start their own base job); slice 7 (25 cases)
# added 90 s to the default subset's 50 s with the machine shared (load 2-6): at most ~3-4
# minutes when busier.
SLICE_SIZE = 25
FALLBACK_SEED = 0
_rows = {}
_states = {}


def expected_state(rank, step, n=1000):
    """(u, grid, it) of matrix_app.py's ``rank`` after the update of ``step``."""
    key = (rank, n)
    if key not in _states:
        u = np.arange(n + rank * 37, dtype=np.float64) * (rank + 1)
        grid = np.full((3, 5), rank, dtype=np.int32)
        states = []
        for s in range(64):
            u *= 1.0001
            u += np.sin(u[:1]) + s
            grid += s % 7 + rank
            states.append((u.copy(), grid.copy(), np.array(s, np.int64)))
        _states[key] = states
    return _states[key][step]


def check_restored(directory, nprocs, step, n=1000):
    """Compare the arrays the app dumped after restart() with the state of ``step`` (None: the
    initial arrays). Returns None when bitwise equal, else a description."""
    for r in range(nprocs):
        with np.load(os.path.join(directory, f"rank_{r}.npz")) as z:
            got = (z["u"], z["grid"], z["it"])
        if step is None:
            want = (np.arange(n + r * 37, dtype=np.float64) * (r + 1), np.full((3, 5), r, np.int32),
                    np.zeros((), np.int64))
        else:
            want = expected_state(r, step, n)
        for name, g, w in zip(("u", "grid", "it"), got, want):
            if g.dtype != w.dtype or g.shape != w.shape or g.tobytes() != w.tobytes():
                return f"rank {r} array {name!r} differs from the state of step {step}: WRONG DATA"
    return None


# ---------------------------------------------------------------------- which matrix cases run
def partition(keys, size=SLICE_SIZE):
    """The rotating pool in N = ceil(len(keys) / size) slices: keys sorted, key i in slice i % N.
    Every key is in exactly one slice; slices hold ``size`` or fewer keys, differing by at most one."""
    if size < 1:
        raise ValueError(f"slice size must be at least 1, not {size}")
    keys = sorted(keys)
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate keys in the rotating pool")
    n = -(-len(keys) // size)
    return [keys[i::n] for i in range(n)]


def git_commit(repo=REPO):
    """``git rev-parse HEAD`` of the checkout, or None (no git, not a checkout, refused)."""
    try:
        # safe.directory: a CI checkout owned by another user than the one running the tests
        r = subprocess.run(["git", "-c", f"safe.directory={repo}", "-C", repo, "rev-parse", "HEAD"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = r.stdout.strip()
    return sha if r.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha) else None


def slice_seed(env=None, commit=git_commit):
    """(seed, how): seed None = no slice. RELIABILITY_SLICE (integer or "none") wins over the
    commit; without git, FALLBACK_SEED. ``how`` says where the seed came from."""
    env = os.environ if env is None else env
    value = env.get("RELIABILITY_SLICE", "").strip()
    if value.lower() == "none":
        return None, "RELIABILITY_SLICE=none"
    if value:
        try:
            seed = int(value)
        except ValueError:
            raise ValueError(f"RELIABILITY_SLICE must be an integer or 'none', not {value!r}") from None
        return seed, f"RELIABILITY_SLICE={value}"
    sha = commit()
    if sha is None:
        return FALLBACK_SEED, f"git unavailable, fixed seed {FALLBACK_SEED}"
    return int(sha, 16), f"seed from commit {sha[:7]}"


class Selection:
    """The matrix keys to run: ``keys`` (a frozenset), ``index`` of ``count`` slices (None: no
    slice), ``how`` (where the seed came from), ``full``; ``line()`` says it in one line."""

    def __init__(self, defaults, pool, full, index, count, slice_keys, how):
        self.defaults, self.pool, self.full = sorted(defaults), sorted(pool), full
        self.index, self.count, self.slice_keys, self.how = index, count, sorted(slice_keys), how
        self.keys = frozenset(self.defaults) | (frozenset(self.pool) if full else frozenset(self.slice_keys))

    @property
    def total(self):
        return len(self.defaults) + len(self.pool)

    def line(self, ran_defaults=None, ran_slice=None, named=0):
        """``ran_*``: how many of each were left selected (after -m/-k), when that differs;
        ``named``: cases outside the selection that run because their node id was given."""
        def of(ran, n):
            return f"{n}" if ran is None or ran == n else f"{ran} selected of {n}"
        if self.full:
            return f"fault matrix: all {of(ran_defaults, self.total)} cases (RELIABILITY_FULL=1)"
        head = f"fault matrix: default subset {of(ran_defaults, len(self.defaults))} cases"
        if named:
            head += f" + {named} named by node id"
        if self.index is None:
            return f"{head}, no slice ({self.how}) — RELIABILITY_FULL=1 runs all {self.total}"
        return (f"{head} + slice {self.index} of {self.count} ({self.how}: {of(ran_slice, len(self.slice_keys))} cases)"
                f" — RELIABILITY_SLICE={self.index} reruns it, RELIABILITY_FULL=1 runs all {self.total}")


def select(defaults, pool, full=None, env=None, commit=git_commit, size=SLICE_SIZE):
    """Which matrix keys run: ``defaults`` always; the ``pool`` whole with ``full`` (default:
    RELIABILITY_FULL=1), else its slice ``seed % N`` of ``partition(pool, size)``."""
    env = os.environ if env is None else env
    full = env.get("RELIABILITY_FULL") == "1" if full is None else full
    if set(defaults) & set(pool):
        raise ValueError(f"keys both default and rotating: {sorted(set(defaults) & set(pool))[:5]}")
    if full:
        return Selection(defaults, pool, True, None, None, (), "RELIABILITY_FULL=1")
    slices = partition(pool, size)
    seed, how = slice_seed(env, commit)
    if seed is None or not slices:
        return Selection(defaults, pool, False, None, len(slices), (), how)
    index = seed % len(slices)
    return Selection(defaults, pool, False, index, len(slices), slices[index], how)


def record(kind, row):
    _rows.setdefault(kind, {})[row["case"]] = row
    if FULL:
        _flush()   # a long run keeps what it has done if it is stopped


@atexit.register
def _flush():
    if not RECORD or not _rows:
        return
    os.makedirs(RECORD, exist_ok=True)
    for kind, rows in _rows.items():
        path = os.path.join(RECORD, f"{kind}.json")
        old = {}
        if os.path.exists(path):
            with open(path) as f:
                old = {r["case"]: r for r in json.load(f)}
        old.update(rows)
        with open(path + ".tmp", "w") as f:
            json.dump(sorted(old.values(), key=lambda r: r.get("order", 0)), f, indent=1)
        os.replace(path + ".tmp", path)
    _rows.clear()
