"""The arrays ``protect()`` registers by reference, and the check that the application still
holds each of them.

``protect(name, array)`` keeps a reference to ``array`` and checkpoints whatever it holds. An
application that later rebinds the name (``pos = pos + dt * vel``) leaves hpcckpt with the old
buffer, which nothing else references any more: checkpointing it would restart the run into a
stale state. :func:`dropped` finds such arrays by their reference counts (CPython's), so that
``checkpoint()`` refuses them on every rank. An array counts as held while anything besides
hpcckpt references it, or, for a view, while anything besides the view references the array it
views (``u_inner = u[1:-1]`` keeps ``u``'s memory in use after ``u`` itself is dropped; a
protected view of an array the application still holds is in use too). Memory owned by
something that is not a NumPy array (a memory map, a buffer) is always taken as held.
"""
import dataclasses
import sys

import numpy as np

from . import state as st


@dataclasses.dataclass
class Protected:
    """One protect()ed array and its layout."""
    array: np.ndarray
    layout: st.Layout


# sys.getrefcount of an array referenced only by a Protected: the attribute and the argument
_ONLY_OURS = 2
# ... of the array a view views, referenced only by that view: its .base, a local, the argument
_ONLY_THE_VIEWS = 3


def dropped(protected):
    """Local: the names of the arrays of ``protected`` ({name: Protected}) that nothing outside
    hpcckpt references any more, in protection order."""
    return [name for name, p in protected.items() if not _held(p)]


def _held(p):
    if sys.getrefcount(p.array) > _ONLY_OURS:
        return True
    base = p.array.base
    while base is not None:
        if not isinstance(base, np.ndarray) or sys.getrefcount(base) > _ONLY_THE_VIEWS:
            return True
        base = base.base
    return False


def dropped_message(step, names):
    """The ProtectError text for the arrays :func:`dropped` found at checkpoint ``step``."""
    listed = ", ".join(repr(n) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (f"checkpoint {step}: the protected array(s) {listed} are referenced by nothing but hpcckpt: the "
            "application rebound the name to another array (as `x = x + dx` or `x = comm.bcast(x)` do), so "
            "this checkpoint would save a stale buffer and a restart would not fill the array the "
            "application uses. Pass state that is rebound in the state dict (checkpoint(step, state) and "
            "restart(state): docs/PORTING.md), or update the protected array in place (`x[...] = x + dx`)")
