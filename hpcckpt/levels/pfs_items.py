"""What a pfs step is written from, and the index entries built from it. Local, no MPI.

``Item``: one array to write, with its layout and checksum, made from a committed cache step
(``items_from_manifest``) or from live arrays (``items_from_arrays``). Each rank describes its
items (PfsSave._describe_items); ``index_entries`` turns every rank's descriptions into the
index's entries (rank 0 checks them; an aggregator needs only its node's), and ``with_checksums``
puts checksums known only after the cache write into rank 0's index.
"""
import dataclasses

import numpy as np

from .. import state as st, storage
from ..codecs.checksum import new_hasher
from ..errors import ProtectError
from . import hdf5_layout as lay
from .pfs_index import GLOBAL_LAYOUTS, Block, Entry

__all__ = ["Item", "items_from_arrays", "items_from_manifest", "index_entries", "with_checksums"]


@dataclasses.dataclass(frozen=True)
class Item:
    """One array to write: its name, data, layout (hpcckpt.state.Layout) and XXH3-64 checksum."""
    name: str
    array: np.ndarray
    layout: st.Layout
    checksum: str


def items_from_manifest(manifest, mapped):
    """Items of a committed cache step: ``mapped`` are its arrays (LocalCache.mapped_arrays;
    None: the items carry no data, for a PendingStep given all of it already)."""
    arrays = {name: a for name, a, _, _ in mapped or ()}
    return [Item(a.name, arrays.get(a.name), st.Layout(a.layout, a.global_shape, a.global_offset), a.checksum)
            for a in manifest.arrays]


def items_from_arrays(arrays):
    """Items of live arrays, hashed here: ``arrays`` is a list of (name, ndarray, global_shape
    or None, offset or None) — for code that drives the store directly."""
    out = []
    for name, array, gshape, goffset in arrays:
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ProtectError(f"array {name!r}: expected a C-contiguous NumPy array")
        hasher = new_hasher()
        hasher.update(storage.byte_view(array))
        layout = st.PER_RANK if gshape is None else st.Block(gshape, goffset)
        out.append(Item(name, array, layout, hasher.hexdigest()))
    return out


def with_checksums(index, sums):
    """Local (rank 0): ``index`` with every block's checksum from ``sums`` [{name: checksum}
    per rank]."""
    arrays = []
    for e in index.arrays:
        blocks = tuple(None if b is None else dataclasses.replace(b, checksum=sums[r][e.name])
                       for r, b in enumerate(e.blocks))
        arrays.append(dataclasses.replace(e, blocks=blocks))
    return dataclasses.replace(index, arrays=tuple(arrays))


def index_entries(metas, size, partial):
    """Local: the index entries from per-rank descriptions (None: that rank's not known, when
    ``partial``: an aggregator laying out its node file). Rank 0 (``partial`` False) also checks
    that the ranks agree and that global blocks tile their global shape, and places rows."""
    order, table = [], {}
    for r, meta in enumerate(metas):
        for name, dtype, shape, kind, gshape, goffset, checksum in meta or ():
            if name not in table:
                order.append(name)
                table[name] = (dtype, kind, [None] * size)
            t_dtype, t_kind, blocks = table[name]
            if (dtype, kind) != (t_dtype, t_kind):
                raise ProtectError(f"array {name!r}: the ranks disagree on its dtype or layout (rank {r}: {dtype} "
                                   f"{kind}; a lower rank: {t_dtype} {t_kind})")
            blocks[r] = (shape, gshape, goffset, checksum)
    entries = []
    for name in order:
        dtype, kind, blocks = table[name]
        gshape = None
        if kind in GLOBAL_LAYOUTS and not partial:
            missing = [r for r, b in enumerate(blocks) if b is None]
            if missing:
                raise ProtectError(f"array {name!r} has a {kind} layout but ranks {missing[:8]} do not hold it; "
                                   "every rank must (an empty block is fine)")
        if kind == "block":
            gshapes = {b[1] for b in blocks if b is not None}
            if len(gshapes) != 1:
                raise ProtectError(f"array {name!r}: the ranks disagree on the global shape ({sorted(map(str, gshapes))[:4]})")
            (gshape,) = gshapes
            out = [None if b is None else Block(b[0], b[2], b[3]) for b in blocks]
            if not partial:
                problem = lay.tiling_problem(gshape, [(b.offset, b.shape) for b in out])
                if problem:
                    raise ProtectError(f"array {name!r}: the ranks' blocks do not tile the global shape {gshape}: "
                                       f"{problem}")
        elif kind == "rows" and not partial:
            rest = {b[0][1:] for b in blocks}
            if len(rest) != 1:
                raise ProtectError(f"array {name!r}: a ROWS layout needs the same row shape on every rank "
                                   f"(found {sorted(map(str, rest))[:4]})")
            (rest,) = rest
            out, start = [], 0
            for shape, _, _, checksum in blocks:
                out.append(Block(shape, (start,) + (0,) * len(rest), checksum))
                start += shape[0]
            gshape = (start,) + rest
        else:   # rank, replicated, root; rows on an aggregator (it needs no global placement)
            out = [None if b is None else Block(b[0], None, b[3]) for b in blocks]
        entries.append(Entry(name, dtype, kind, gshape, tuple(out)))
    return entries
