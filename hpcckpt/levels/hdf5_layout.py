"""Pure layout logic of the pfs level (local, no I/O): global blocks, hyperslab intersections,
contiguous byte runs, and who verifies which block.

A *block* is ``(offset, shape)``: the part of a global array one rank holds, with ``offset`` and
``shape`` tuples of the same length as the global shape. A 0-d array is the block ``((), ())``.
"""
import re

import numpy as np

RANK_GROUP_RE = re.compile(r"^rank_[0-9]{6}$")


def rank_group(rank):
    """The group of one rank's datasets in a node file (and the link in the master file)."""
    return f"rank_{rank:06d}"


def node_file(node):
    """The HDF5 file written by the aggregator of ``node``."""
    return f"node_{node:06d}.h5"


NODE_FILE_RE = re.compile(r"^node_[0-9]{6}\.h5$")


def volume(shape):
    """Number of elements of a shape (1 for ``()``)."""
    n = 1
    for s in shape:
        n *= int(s)
    return n


def intersect(off_a, shape_a, off_b, shape_b):
    """The intersection of two boxes as ``(offset, shape)``, or None when it is empty."""
    lo = tuple(max(a, b) for a, b in zip(off_a, off_b))
    hi = tuple(min(a + n, b + m) for a, n, b, m in zip(off_a, shape_a, off_b, shape_b))
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, tuple(h - l for l, h in zip(lo, hi))


def tiling_problem(global_shape, blocks):
    """None when ``blocks`` (a list of (offset, shape)) tile ``global_shape`` exactly: every block
    inside, no two overlapping, together covering everything. Otherwise a message."""
    ndim = len(global_shape)
    for r, (off, shape) in enumerate(blocks):
        if len(off) != ndim or len(shape) != ndim:
            return f"rank {r}: block has {len(shape)} dimensions, the global shape {tuple(global_shape)} has {ndim}"
        if any(o < 0 or n < 0 or o + n > g for o, n, g in zip(off, shape, global_shape)):
            return f"rank {r}: block {tuple(shape)} at offset {tuple(off)} does not fit in {tuple(global_shape)}"
    total = sum(volume(s) for _, s in blocks)
    if ndim == 0:
        return None if total == 1 else (f"a 0-d global array must be held by exactly one rank, "
                                        f"{len(blocks)} ranks hold it")
    nonempty = [(r, np.asarray(o, np.int64), np.asarray(s, np.int64))
                for r, (o, s) in enumerate(blocks) if volume(s) > 0]
    if nonempty:
        ranks = [r for r, _, _ in nonempty]
        lo = np.stack([o for _, o, _ in nonempty])
        hi = lo + np.stack([s for _, _, s in nonempty])
        for i in range(len(nonempty) - 1):   # O(P^2) box tests, vectorised per row
            clash = np.all((lo[i] < hi[i + 1:]) & (lo[i + 1:] < hi[i]), axis=1)
            if clash.any():
                j = i + 1 + int(np.argmax(clash))
                return f"the blocks of ranks {ranks[i]} and {ranks[j]} overlap"
    if total != volume(global_shape):
        return (f"the blocks cover {total} of the {volume(global_shape)} elements of the global shape "
                f"{tuple(global_shape)}; every element must belong to exactly one rank")
    return None


def contiguous_run(shape, offset, sub_shape):
    """If the sub-box ``(offset, sub_shape)`` of a C-order block of ``shape`` is one contiguous
    run of elements, return ``(first element, element count)``; else None."""
    ndim = len(shape)
    if volume(sub_shape) == 0:
        return 0, 0
    # all axes after the first partial one must be full, all axes before it of extent 1
    k = ndim
    for axis in range(ndim - 1, -1, -1):
        if sub_shape[axis] != shape[axis]:
            k = axis
            break
    if any(sub_shape[axis] != 1 for axis in range(k)):
        return None
    first = 0
    for axis in range(ndim):
        first = first * shape[axis] + offset[axis]
    return first, volume(sub_shape)


def read_plan(new_offset, new_shape, old_blocks):
    """How one rank fills its block ``(new_offset, new_shape)`` from the old blocks.

    Returns a list of ``(old index, offset inside the old block, offset inside the new block,
    shape)`` for every non-empty intersection, in old-block order.
    """
    plan = []
    if volume(new_shape) == 0:
        return plan
    for q, (off, shape) in enumerate(old_blocks):
        if volume(shape) == 0:
            continue
        box = intersect(new_offset, new_shape, off, shape)
        if box is None:
            continue
        lo, ext = box
        plan.append((q, tuple(l - o for l, o in zip(lo, off)), tuple(l - o for l, o in zip(lo, new_offset)), ext))
    return plan


def assign_verifiers(old_blocks, new_blocks):
    """For each old block, the new rank that verifies its checksum: the one that reads the most
    of it (so the data is then in the page cache), else ``old index % len(new_blocks)``."""
    out = []
    size = len(new_blocks)
    for q, (off, shape) in enumerate(old_blocks):
        best, best_vol = q % size, 0
        if volume(shape) > 0:
            for r, (noff, nshape) in enumerate(new_blocks):
                box = intersect(off, shape, noff, nshape) if volume(nshape) > 0 else None
                v = volume(box[1]) if box else 0
                if v > best_vol:
                    best, best_vol = r, v
        out.append(best)
    return out


def check_safe_source(file_name):
    """Raise ValueError unless a VDS/external-link target is a node file of the same directory."""
    if not isinstance(file_name, str) or file_name == "." or not NODE_FILE_RE.match(file_name):
        raise ValueError(f"refusing source file {file_name!r}: only node_<n>.h5 of the same step directory")
