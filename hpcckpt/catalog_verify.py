"""Re-verify the checkpoints a catalog found (local, no MPI; ``hpcckpt verify``): ``verify``
re-hashes one rank part or held item (a level's partner copy or parity, which its level's
``files`` checks); ``check`` every checkpoint of a catalog, as Findings naming each damaged or
missing part and what could rebuild it (the levels' ``rebuild_note``: a partner copy, parity, the
pfs copy), and each step a level keeps in its own directories (its ``files.check``)."""
import collections
import dataclasses

from .catalog import cache_steps
from .levels import registry
from .levels.files import registered, verify_data


def verify(item, buffer_bytes=1 << 20):
    """Re-hash one found manifest's data; return None when intact, else the reason."""
    if item.error:
        return item.error
    if item.files is not None:
        return item.files.verify(item, buffer_bytes)
    m = item.manifest
    return verify_data(item.data_path, m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays],
                       buffer_bytes)


def verify_stored(item):
    """[problem, ...] of one step a level keeps in its own directories (empty when intact)."""
    if item.error:
        return [item.error if item.error.startswith(item.path) else f"{item.path}: {item.error}"]
    return item.files.check(item)


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
    DAMAGED) with what could rebuild it (the levels' ``rebuild_note``). With ``partial``
    the ranks absent from the root are a note, not damage (a node's own cache).
    """
    findings = []
    counts = collections.Counter()
    multi_job = len({f.job for f in cat.found} | {s.job for s in cat.stored}) > 1

    def job_of(label, job):
        return f"{label} of job {job!r}" if multi_job else label

    for p in cat.problems:
        findings.append(Finding("DAMAGED", "directory" if p.step is None else f"step {p.step}", str(p), p.path))
        counts["damaged"] += 1
    problems = {}
    for f in cat.found:
        problems[id(f)] = verify(f, buffer_bytes)
    levels = registered()

    def ok(f):
        return not problems[id(f)]

    for cs in cache_steps(cat):
        head = cs.label

        def label(f):
            return job_of(head + f.label[len(f"step {cs.step}"):], cs.job)

        for f in cs.ranks + cs.held:
            problem = problems[id(f)]
            counts["files"] += 1
            if problem:
                counts["damaged"] += 1
                note = _rebuild_note(cs, f.rank, cat, ok, levels) if f.files is None else ""
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
            lines.append((r, why_text + _rebuild_note(cs, r, cat, ok, levels)))
        for first, last, text in _runs(lines, collapse=len(lines) > 16):
            who = f"rank {first}" if first == last else f"ranks {first}-{last}"
            findings.append(Finding("MISSING", job_of(f"{head} {who}", cs.job), text))
    for s in cat.stored:
        label = job_of(s.label, s.job)
        if s.note:
            findings.append(Finding("note", label, f"{s.path}: {s.note}: not a checkpoint, restart() ignores it"))
            continue
        counts[("steps", s.level)] += 1
        bad = verify_stored(s)
        if bad:
            counts["damaged"] += 1
            for msg in bad:
                findings.append(Finding("DAMAGED", label, msg, s.path))
        else:
            counts[("intact", s.level)] += 1
            if verbose:
                findings.append(Finding("ok", label, s.path, s.path))
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


def _rebuild_note(cs, rank, cat, ok, levels):
    """' (rebuildable from …)' / ' (not rebuildable …)' for a missing or damaged rank part: the
    first level whose files can rebuild it, else the first that says it cannot."""
    notes = [n for n in (files.rebuild_note(rank, cs, cat, ok) for files in levels) if n is not None]
    for can, text in notes:
        if can:
            return text
    if notes:
        return notes[0][1]
    level = cs.manifest.level if cs.manifest else None
    if level in registry.redundant():
        return f" (no intact {level} redundancy for it under {cat.root})"
    return ""
