"""The xor and rs levels' files as ``hpcckpt list/verify`` and relocate see them (local, no MPI):
``step_<S>/held_<H>/encoded.json`` (the group, the code, every member's manifest, the parity
checksums) and ``parity.dat``, or of an incremental step ``parity.delta`` and
``parity.delta.json`` instead of ``parity.dat`` (levels/encoded.py, levels/delta.py). Both
levels keep the same files (``encoded.json`` names its level): one EncodedFiles serves both."""
import os

from .. import manifest as mf, storage
from ..errors import HpcCkptError
from .files import LevelFiles, held_delta, message, not_regular, verify_held

TABLE = "encoded.json"
PARITY = "parity.dat"
HELD_NAMES = (TABLE, PARITY, "parity.delta", "parity.delta.json")


def parity_table(doc, holder):
    """The parts of an ``encoded.json`` the catalog uses: size, entries (what ``parity.dat`` is
    checked against), group, parity, level, ckpt_id. ValueError when it is not one of holder's."""
    if not isinstance(doc, dict) or doc.get("format") != "hpcckpt-encoded":
        raise ValueError("not an hpcckpt encoded-level file")
    m, piece, sums, group = doc["parity"], doc["piece"], doc["parity_checksums"], doc["group"]
    if not (isinstance(m, int) and isinstance(piece, int) and piece >= 8 and isinstance(sums, list) and len(sums) == m
            and all(isinstance(c, str) for c in sums)):
        raise ValueError("not an hpcckpt encoded-level file")
    if not (isinstance(group, list) and group and all(mf._is_int(r) and r >= 0 for r in group) and holder in group):
        raise ValueError(f"its group {group!r} does not list its holder, rank {holder}")
    if not isinstance(doc.get("ckpt_id"), str) or not isinstance(doc.get("level"), str):
        raise ValueError("its ckpt_id or level is missing")
    from .delta import SEGMENTS_ONLY, parity_entries, segment_sums_ok
    if m and any(c == SEGMENTS_ONLY for c in sums) and not segment_sums_ok(doc, m, piece, doc.get("segment")):
        raise ValueError("bad segment checksums")     # an incremental step's parity: one checksum per segment
    return {"size": m * piece, "entries": parity_entries(doc),
            "group": list(group), "parity": m, "level": doc["level"], "ckpt_id": doc["ckpt_id"]}


class EncodedFiles(LevelFiles):
    """xor/rs parity in held folders."""

    def held_file(self, name):
        return name in HELD_NAMES

    def held_items(self, path, step, holder, entries):
        from ..catalog import Found
        out = []
        for name, where, kind in entries:
            if name != TABLE:
                continue
            data = os.path.join(path, PARITY)
            item = Found(where, step, holder, kind="parity", holder=holder, files=self, data=data,
                         delta=held_delta(data), what=" (parity)")
            if kind != "file":
                item.error = f"{where}: {not_regular(kind)}"
            else:
                try:
                    item.manifest = parity_table(storage.read_json(where), holder)
                    item.ckpt = item.manifest["ckpt_id"]
                except KeyError as err:
                    item.error = f"{where}: key {err} is missing; not an hpcckpt encoded-level file"
                except (HpcCkptError, OSError, ValueError, TypeError, RecursionError) as err:
                    item.error = message(where, err)
            out.append(item)
        return out

    def verify(self, item, buffer_bytes=1 << 20):
        return verify_held(item, item.manifest["size"], item.manifest["entries"], buffer_bytes)

    def rebuild_note(self, rank, cs, cat, ok):
        parities = [f for f in cs.held if f.files is self]
        notes = []
        for f in parities:
            t = f.manifest
            if not ok(f) or rank not in t["group"] or (cs.ckpt_id and t["ckpt_id"] != cs.ckpt_id):
                continue
            good_parity = {g.holder for g in parities if ok(g) and g.manifest["group"] == t["group"]}
            lost = [q for q in t["group"]
                    if not (any(r.rank == q and ok(r) for r in cs.reference) and q in good_parity)]
            m, k = t["parity"], len(t["group"])
            if len(lost) <= m:
                return True, (f" (rebuildable from the {t['level']} parity of group {t['group']}: {len(lost)} of {k} "
                              f"members lost, {m} parit{'y' if m == 1 else 'ies'})")
            notes.append((False, f" (not rebuildable: group {t['group']} lost {len(lost)} of {k} members, its "
                                 f"{t['level']} parity covers {m})"))
        return notes[0] if notes else None
