"""Shared helpers of the reliability tests (fault matrix, hostile input, soak, fuzzing).

``expected_state(rank, step)`` recomputes, in this process, the arrays matrix_app.py holds after
``step`` (the same NumPy operations, so bitwise equal). ``record(kind, row)`` keeps a result row;
with ``RELIABILITY_RECORD=DIR`` the rows are merged into ``DIR/<kind>.json`` at the end of the session
and ``python tests/tools/gen_reliability.py`` renders docs/RELIABILITY.md from them.
"""
import atexit
import json
import os

import numpy as np

FULL = os.environ.get("RELIABILITY_FULL") == "1"
RECORD = os.environ.get("RELIABILITY_RECORD")
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
