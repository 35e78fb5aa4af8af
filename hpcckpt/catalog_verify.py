"""Re-verify the checkpoints a catalog found (local, no MPI; ``hpcckpt verify``, and the cheap
file checks of ``hpcckpt list/inspect``): ``verify`` re-hashes one rank part, partner copy or
parity; ``verify_pfs`` one pfs step (index, master file, every block); ``check`` every
checkpoint of a catalog, as Findings naming each damaged or missing part and what could
rebuild it (a partner copy, parity, the pfs copy)."""
import collections
import dataclasses
import os
import stat

from . import storage
from .catalog import cache_steps, index_cap, not_regular, why
from .errors import HpcCkptError
from .levels import registry


def verify(item, buffer_bytes=1 << 20):
    """Re-hash one found manifest's data; return None when intact, else the reason."""
    import numpy as np
    if item.error:
        return item.error
    m = item.manifest
    if item.kind == "parity":
        size, entries = m["size"], m["entries"]
    else:
        size, entries = m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays]
    path = item.data_path
    if item.delta_path is not None:
        return _verify_incremental(path, size, entries)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path}: missing"
    except OSError as e:
        return f"{path}: cannot be examined ({why(e)})"
    if not stat.S_ISREG(st.st_mode):     # never open a FIFO (it would block) nor follow a link
        kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"
        return f"{path}: {not_regular(kind)}"
    try:
        storage.verify_file(path, size, entries, np.empty(buffer_bytes, np.uint8))
    except HpcCkptError as e:
        return str(e)
    except OSError as e:
        return f"{path}: cannot be read ({why(e)})"
    return None


def _verify_incremental(path, size, entries):
    """An incremental partner copy or parity (levels/delta.py): rebuilt in memory from its base
    step's file and the delta, then checked against its checksums; None when intact."""
    import xxhash
    from .levels.delta import materialize_held
    delta = path[:-4] + ".delta"
    try:
        data = materialize_held(os.path.dirname(path), os.path.basename(path), size)
    except (HpcCkptError, OSError, ValueError) as e:
        return f"{delta}: incremental, its base and delta cannot be applied ({e})"
    for name, offset, nbytes, checksum in entries:
        if xxhash.xxh3_64_hexdigest(data[offset:offset + nbytes]) != checksum:
            return f"{delta}: incremental, {name} rebuilt from its base and delta does not match its checksum"
    return None


def verify_pfs(item):
    """[problem, ...] of one pfs step (empty when intact): its index, master file and every block."""
    if item.error:
        return [item.error if item.error.startswith(item.path) else f"{item.path}: {item.error}"]
    from .levels import pfs_check, pfs_index
    unreadable = []
    for name in [pfs_index.MASTER] + sorted(item.index.files):
        path = os.path.join(item.path, name)
        if os.path.islink(path):
            continue    # verify_step says it is not a regular file
        try:        # O_NONBLOCK: a FIFO put in place of a file must not hang the check
            os.close(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
        except FileNotFoundError:
            pass    # verify_step says it is missing
        except OSError as e:
            unreadable.append((path, f"{path}: cannot be read ({why(e)})"))
    try:
        _, problems = pfs_check.verify_step(item.path, max_bytes=index_cap())
    except HpcCkptError as e:
        problems = [str(e)]
    except OSError as e:
        problems = [f"{e.filename or item.path}: cannot be read ({why(e)})"]
    except Exception as e:   # noqa: BLE001 - whatever HDF5 says about a damaged file, as one line
        problems = [f"{item.path}: cannot be verified ({type(e).__name__}: {e})"]
    bad = [path for path, _ in unreadable]
    return [msg for _, msg in unreadable] + [p for p in problems if not any(p.startswith(b) for b in bad)]


def pfs_file_problems(item):
    """Cheap checks of a committed pfs step's files (no hashing): each node file and the master
    exist as regular files, node files of the size the index says. [problem, ...]"""
    from .levels import pfs_index
    out = []
    files = dict(item.index.files) if item.index else {}
    for name in [pfs_index.MASTER] + sorted(files):
        path = os.path.join(item.path, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            out.append(f"{name} missing")
            continue
        except OSError as e:
            out.append(f"{name} cannot be examined ({why(e)})")
            continue
        if not stat.S_ISREG(st.st_mode):
            out.append(f"{name} is not a regular file")
        elif name in files and st.st_size != files[name]:
            out.append(f"{name} has {st.st_size} bytes, the index says {files[name]}")
    return out


@dataclasses.dataclass
class Finding:
    """One line of ``hpcckpt verify``: status "ok", "DAMAGED", "MISSING" or "note"."""
    status: str
    label: str
    message: str = ""
    path: str = ""

    def __str__(self):
        return f"{self.status:<7} {self.label}" + (f": {self.message}" if self.message else "")


def check(cat, partial=False, verbose=False, buffer_bytes=1 << 20):
    """Re-verify everything in a catalog. Returns (findings, counts): a Finding per damaged or
    missing part (and per intact one with ``verbose``), notes for what is not a checkpoint.

    A cache checkpoint is complete when every rank 0..world_size-1 has an intact manifest and
    data under the root; each rank part that is missing or damaged is reported (MISSING /
    DAMAGED) with what could rebuild it (a partner copy, parity, the pfs copy). With ``partial``
    the ranks absent from the root are a note, not damage (a node's own cache).
    """
    findings = []
    counts = collections.Counter()
    multi_job = len({f.job for f in cat.found} | {p.job for p in cat.pfs}) > 1

    def job_of(label, job):
        return f"{label} of job {job!r}" if multi_job else label

    for p in cat.problems:
        findings.append(Finding("DAMAGED", "directory" if p.step is None else f"step {p.step}", str(p), p.path))
        counts["damaged"] += 1
    problems = {}
    for f in cat.found:
        problems[id(f)] = verify(f, buffer_bytes)
    pfs_copies = {p.index.ckpt_id: p.path for p in cat.pfs if p.index is not None}
    for cs in cache_steps(cat):
        head = cs.label

        def label(f):
            return job_of(head + f.label[len(f"step {cs.step}"):], cs.job)

        for f in cs.ranks + cs.copies + cs.parities:
            problem = problems[id(f)]
            counts["files"] += 1
            if problem:
                counts["damaged"] += 1
                note = _rebuild_note(cs, f.rank, problems, cat.root, pfs_copies) if f.kind == "rank" else ""
                findings.append(Finding("DAMAGED", label(f), problem + note, f.path))
            else:
                counts["intact"] += 1
                if verbose:
                    findings.append(Finding("ok", label(f), f.shown_path, f.path))
        for f in cs.stale:
            counts["files"] += 1
            counts["damaged"] += 1
            m, r = f.manifest, cs.manifest
            findings.append(Finding("DAMAGED", label(f),
                                    f"{f.path}: belongs to another checkpoint (epoch {m.epoch}, id {m.ckpt_id[:12]}) "
                                    f"than the other ranks of its directory (epoch {r.epoch}, id {r.ckpt_id[:12]})",
                                    f.path))
        size = cs.world_size
        if size is None:
            if cs.pending and not cs.ranks:
                findings.append(Finding("note", job_of(head, cs.job),
                                        f"data of rank(s) {_ranks_text(cs.pending)} without a manifest: "
                                        "a write that never committed, not a checkpoint"))
            continue
        have = {f.rank for f in cs.ranks}
        absent = [r for r in range(size) if r not in have]
        if partial:
            if absent:
                findings.append(Finding("note", job_of(head, cs.job),
                                        f"rank(s) {_ranks_text(absent)} of {size} are not under {cat.root} "
                                        "(--partial: not checked)"))
            continue
        stale_ranks = {f.rank for f in cs.stale}
        lines = []
        for r in absent:
            counts["missing"] += 1
            why_text = "no manifest under " + cat.root
            if r in stale_ranks:
                why_text += " (a manifest of another checkpoint is in its place)"
            elif r in cs.pending:
                why_text += " (its data file is there without a manifest: its write never committed)"
            lines.append((r, why_text + _rebuild_note(cs, r, problems, cat.root, pfs_copies)))
        for first, last, text in _runs(lines, collapse=len(lines) > 16):
            who = f"rank {first}" if first == last else f"ranks {first}-{last}"
            findings.append(Finding("MISSING", job_of(f"{head} {who}", cs.job), text))
    for p in cat.pfs:
        label = job_of(p.label, p.job)
        if not p.committed or p.tmp:
            what = "being written, or abandoned by a crash" if p.tmp else "not committed (no COMMITTED.json)"
            findings.append(Finding("note", label, f"{p.path}: {what}: not a checkpoint, restart() ignores it"))
            continue
        counts["pfs"] += 1
        bad = verify_pfs(p)
        if bad:
            counts["damaged"] += 1
            counts["pfs_damaged"] += 1
            for msg in bad:
                findings.append(Finding("DAMAGED", label, msg, p.path))
        else:
            counts["pfs_intact"] += 1
            if verbose:
                findings.append(Finding("ok", label, p.path, p.path))
    return findings, counts


def _runs(lines, collapse):
    """(first, last, text) of (rank, text) lines: one per line, or (``collapse``) one per run of
    consecutive ranks with the same text."""
    out = []
    for r, text in lines:
        if collapse and out and out[-1][1] == r - 1 and out[-1][2] == text:
            out[-1] = (out[-1][0], r, text)
        else:
            out.append((r, r, text))
    return out


def _ranks_text(ranks, limit=16):
    ranks = sorted(ranks)
    text = ", ".join(map(str, ranks[:limit]))
    return text + (f" … ({len(ranks)} in all)" if len(ranks) > limit else "")


def _intact_rank(cs, rank, problems):
    return any(f.rank == rank and not problems[id(f)] for f in cs.reference or ())


def _rebuild_note(cs, rank, problems, root, pfs_copies=None):
    """' (rebuildable from …)' / ' (not rebuildable …)' for a missing or damaged rank part."""
    ckpt_id = cs.ckpt_id
    if ckpt_id in (pfs_copies or {}):
        return f" (the pfs copy of this checkpoint holds it: {pfs_copies[ckpt_id]})"
    for f in cs.copies:
        if f.rank == rank and not problems[id(f)] and (ckpt_id is None or f.manifest.ckpt_id == ckpt_id):
            return f" (rebuildable from its partner copy held by rank {f.holder})"
    notes = []
    for f in cs.parities:
        t = f.manifest
        if problems[id(f)] or rank not in (t or {}).get("group", ()) or (ckpt_id and t["ckpt_id"] != ckpt_id):
            continue
        good_parity = {g.holder for g in cs.parities if not problems[id(g)] and g.manifest["group"] == t["group"]}
        lost = [q for q in t["group"] if not (_intact_rank(cs, q, problems) and q in good_parity)]
        m, k = t["parity"], len(t["group"])
        if len(lost) <= m:
            return (f" (rebuildable from the {t['level']} parity of group {t['group']}: {len(lost)} of {k} "
                    f"members lost, {m} parit{'y' if m == 1 else 'ies'})")
        notes.append(f" (not rebuildable: group {t['group']} lost {len(lost)} of {k} members, its "
                     f"{t['level']} parity covers {m})")
    if notes:
        return notes[0]
    level = cs.manifest.level if cs.manifest else None
    if level in registry.redundant():
        return f" (no intact {level} redundancy for it under {root})"
    return ""
