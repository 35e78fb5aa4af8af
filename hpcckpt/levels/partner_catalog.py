"""The partner level's files as ``hpcckpt list/verify`` and relocate see them (local, no MPI):
``step_<S>/held_<H>/partner_<R>.json`` and ``partner_<R>.dat`` (rank R's manifest and data, a
copy kept by holder H), or of an incremental step ``partner_<R>.delta`` and
``partner_<R>.delta.json`` instead of the ``.dat`` (levels/partner.py, levels/delta.py)."""
import os
import re

from .files import LevelFiles, held_delta, read_rank_manifest, verify_held

HELD_RE = re.compile(r"^partner_([0-9]+)\.(dat|json|delta|delta\.json)$")


class PartnerFiles(LevelFiles):
    """Partner copies in held folders."""

    def held_file(self, name):
        return HELD_RE.match(name) is not None

    def held_items(self, path, step, holder, entries):
        from ..catalog import Found
        out = []
        for name, where, kind in entries:
            m = HELD_RE.match(name)
            if m is None or m.group(2) != "json":
                continue
            rank = int(m.group(1))
            data = os.path.join(path, name[:-5] + ".dat")
            item = Found(where, step, rank, kind="partner", holder=holder, files=self, data=data,
                         delta=held_delta(data), what=f" (partner copy held by rank {holder})")
            item.manifest, item.error = read_rank_manifest(where, kind, step, rank)
            if item.error is None:
                item.ckpt = item.manifest.ckpt_id
            out.append(item)
        return out

    def verify(self, item, buffer_bytes=1 << 20):
        m = item.manifest
        return verify_held(item, m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays],
                           buffer_bytes)

    def rebuild_note(self, rank, cs, cat, ok):
        for f in cs.held:
            if f.files is self and f.rank == rank and ok(f) and (cs.ckpt_id is None or f.ckpt == cs.ckpt_id):
                return True, f" (rebuildable from its partner copy held by rank {f.holder})"
        return None
