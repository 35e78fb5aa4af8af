"""Find and check checkpoints on disk without MPI (local; used by the command line).

``scan(root)`` walks a directory (a cache dir, a pfs dir, a job dir, or any directory above
them, up to MAX_DEPTH levels down) and returns a Catalog of everything that looks like a
checkpoint part:

- cache steps (``<cache_dir>/<name>/step_<S>/``): every rank manifest, every partner copy and
  parity a rank holds for others (``held_<H>/``), and data files left without a manifest;
- pfs steps (``<pfs_dir>/<name>/step_<S>/`` with ``COMMITTED.json`` / ``checkpoint.h5`` /
  ``node_<n>.h5``, and ``step_<S>.tmp-<id>/`` being written or abandoned), with their index;
- problems: what could not be examined (a directory that cannot be listed, a step or held
  directory that is a symbolic link or not a directory, a manifest that is not a regular file).

Nothing here opens a FIFO or follows a symbolic link below ``root``; nothing imports mpi4py.
``check(catalog)`` re-verifies everything and returns Findings; the CLI prints them.
"""
import collections
import dataclasses
import os
import re
import stat

from . import manifest as mf, storage
from .errors import HpcCkptError

MAX_DEPTH = 6
MAX_STATE_DOCUMENT = 64 << 20           # a state document larger than this is not read by inspect
PFS_FILES_RE = re.compile(r"^(COMMITTED\.json|checkpoint\.h5|node_[0-9]{6}\.h5)$")
PFS_TMP_RE = re.compile(r"^(step_[0-9]{10,13})\.tmp-")
REDUNDANCY = ("partner", "xor", "rs")


def why(e):
    """The reason of an OSError, without Python's '[Errno n]' prefix and never 'None'."""
    return e.strerror or str(e) or type(e).__name__


@dataclasses.dataclass
class Found:
    """One rank manifest file found under a directory: parsed, or the reason it is unreadable."""
    path: str
    step: int
    rank: int
    manifest: object = None   # RankManifest (rank, partner) or the encoded.json table (parity)
    error: str = None
    kind: str = "rank"        # "rank": a rank's own part; "partner": a copy held for it; "parity"
    holder: int = None        # partner / parity: the rank whose held_<H> folder keeps it

    @property
    def step_dir(self):
        d = os.path.dirname(self.path)
        return d if self.kind == "rank" else os.path.dirname(d)

    @property
    def job_dir(self):
        return os.path.dirname(self.step_dir)

    @property
    def job(self):
        """The job name as the directory says it (``<cache_dir>/<name>/step_<S>``)."""
        return os.path.basename(os.path.abspath(self.job_dir))

    @property
    def data_path(self):
        if self.kind == "partner":
            return self.path[:-5] + ".dat"
        if self.kind == "parity":
            return os.path.join(os.path.dirname(self.path), "parity.dat")
        return os.path.join(os.path.dirname(self.path), mf.data_file_name(self.rank))

    @property
    def delta_path(self):
        """A partner copy or parity of an incremental step: its delta file (held instead of the
        full file, levels/delta.py); None otherwise."""
        if self.kind in ("partner", "parity"):
            data = self.data_path
            if not os.path.lexists(data) and os.path.lexists(data[:-4] + ".delta.json"):
                return data[:-4] + ".delta"
        return None

    @property
    def shown_path(self):
        """The file that holds this item's data: the delta of an incremental step, else the data file."""
        return self.delta_path or self.data_path

    @property
    def label(self):
        if self.kind == "partner":
            return f"step {self.step} rank {self.rank} (partner copy held by rank {self.holder})"
        if self.kind == "parity":
            return f"step {self.step} rank {self.rank} (parity)"
        return f"step {self.step} rank {self.rank}"


@dataclasses.dataclass
class PfsStep:
    """One step directory under a pfs job directory."""
    path: str
    step: int
    index: object = None      # pfs_index.Index when COMMITTED.json is readable
    error: str = None         # why the index cannot be used
    committed: bool = False   # COMMITTED.json exists
    tmp: bool = False         # step_<S>.tmp-<id>: being written, or abandoned by a crash

    @property
    def job_dir(self):
        return os.path.dirname(self.path)

    @property
    def job(self):
        return self.index.name if self.index else os.path.basename(os.path.abspath(self.job_dir))

    @property
    def label(self):
        return f"step {self.step} (pfs)"


@dataclasses.dataclass
class Problem:
    """Something under the root that could not be examined."""
    path: str
    message: str
    step: int = None          # the step it belongs to, when known

    def __str__(self):
        return f"{self.path}: {self.message}"


@dataclasses.dataclass
class Catalog:
    root: str
    found: list = dataclasses.field(default_factory=list)       # Found, sorted by step, rank
    pfs: list = dataclasses.field(default_factory=list)         # PfsStep, sorted by step
    problems: list = dataclasses.field(default_factory=list)    # Problem
    pending: dict = dataclasses.field(default_factory=dict)     # (step dir, step) -> [rank] of data without manifest

    def empty(self):
        return not (self.found or self.pfs or self.problems or self.pending)

    def only_step(self, step):
        """A copy restricted to one step (problems of unknown step are kept)."""
        return Catalog(self.root, [f for f in self.found if f.step == step], [p for p in self.pfs if p.step == step],
                       [p for p in self.problems if p.step in (None, step)],
                       {k: v for k, v in self.pending.items() if k[1] == step})


# ---------------------------------------------------------------------- finding
def scan(root, max_depth=MAX_DEPTH):
    """Everything checkpoint-like under ``root`` (see the module docstring). HpcCkptError when
    ``root`` itself is not a directory that can be read."""
    try:
        st = os.stat(root)          # root itself may be a symbolic link: the user named it
    except OSError as e:
        raise HpcCkptError(f"{root}: {'no such directory' if isinstance(e, FileNotFoundError) else why(e)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise HpcCkptError(f"{root}: not a directory")
    cat = Catalog(root)
    try:
        os.close(os.open(root, os.O_RDONLY | os.O_DIRECTORY))
        os.listdir(root)
    except OSError as e:
        raise HpcCkptError(f"{root}: cannot be read ({why(e)})") from None
    _walk(cat, root, 0, max_depth)
    cat.found.sort(key=lambda f: (f.step, f.rank, f.kind, f.path))
    cat.pfs.sort(key=lambda p: (p.step, p.tmp, p.path))
    return cat


def find(root):
    """Every rank manifest, partner copy and parity under ``root``, sorted by step, rank."""
    return scan(root).found


def uncommitted_steps(root):
    """Step directories holding data files but no manifest of that rank: {step: [rank, ...]}."""
    out = {}
    for (_, step), ranks in scan(root).pending.items():
        out.setdefault(step, []).extend(ranks)
    return {s: sorted(r) for s, r in out.items()}


def _entries(cat, path, step=None):
    """The entries of a directory sorted by name, or None (a Problem recorded) if it cannot be listed."""
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        cat.problems.append(Problem(path, f"cannot be read ({why(e)})", step))
        return None


def _kind(entry):
    """'dir', 'file', 'link' or 'other' (FIFO, socket, device), without following links."""
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "other"


def _not_regular(kind):
    return {"link": "is a symbolic link; refusing to follow it", "dir": "is a directory, not a file",
            "other": "is not a regular file (a FIFO, socket or device)"}[kind]


def _walk(cat, path, depth, max_depth):
    step = mf.parse_step_dir_name(os.path.basename(os.path.normpath(path)))
    if step is not None:
        _step_dir(cat, path, step)
        return
    entries = _entries(cat, path)
    for e in entries or ():
        kind = _kind(e)
        estep = mf.parse_step_dir_name(e.name)
        tmp = PFS_TMP_RE.match(e.name)
        tmp_step = mf.parse_step_dir_name(tmp.group(1)) if tmp else None
        if tmp_step is not None and kind == "dir":
            cat.pfs.append(PfsStep(e.path, tmp_step, tmp=True))
        elif estep is not None and kind != "dir":
            what = "is a symbolic link; not followed" if kind == "link" else "is not a directory"
            cat.problems.append(Problem(e.path, "named like a step directory but " + what, estep))
        elif kind == "dir" and depth + 1 <= max_depth:
            _walk(cat, e.path, depth + 1, max_depth)


def _step_dir(cat, path, step):
    entries = _entries(cat, path, step)
    if entries is None:
        return
    pfs_names = {}
    data, manifests = set(), set()
    for e in entries:
        name, kind = e.name, _kind(e)
        if PFS_FILES_RE.match(name):
            pfs_names[name] = kind
        elif name.startswith("rank_") and name.endswith(".json") and name[5:-5].isdigit():
            rank = int(name[5:-5])
            manifests.add(rank)
            item = Found(e.path, step, rank)
            if kind != "file":
                item.error = f"{e.path}: {_not_regular(kind)}"
            else:
                try:
                    item.manifest = mf.parse(storage.read_json(e.path), e.path)
                    if item.manifest.step != step or item.manifest.rank != rank:
                        item.error = (f"{e.path}: describes step {item.manifest.step} rank {item.manifest.rank}, "
                                      f"not step {step} rank {rank}")
                except (HpcCkptError, OSError, ValueError, RecursionError) as err:
                    item.error = _message(e.path, err)
            cat.found.append(item)
        elif name.startswith("rank_") and name.endswith(".dat") and name[5:-4].isdigit():
            data.add(int(name[5:-4]))
        elif name.startswith("held_") and name[5:].isdigit():
            if kind == "dir":
                _held(cat, e.path, step, int(name[5:]))
            else:
                cat.problems.append(Problem(e.path, "a held-redundancy folder that " + (
                    "is a symbolic link; not followed" if kind == "link" else "is not a directory"), step))
    if data - manifests:
        cat.pending[(path, step)] = sorted(data - manifests)
    if pfs_names:
        cat.pfs.append(_pfs_step(path, step, pfs_names))


def _held(cat, path, step, holder):
    """Partner copies and parity kept in one ``held_<H>`` folder of a step directory."""
    entries = _entries(cat, path, step)
    for e in entries or ():
        name, kind = e.name, _kind(e)
        if name.startswith("partner_") and name.endswith(".json") and name[8:-5].isdigit():
            item = Found(e.path, step, int(name[8:-5]), kind="partner", holder=holder)
            if kind != "file":
                item.error = f"{e.path}: {_not_regular(kind)}"
            else:
                try:
                    item.manifest = mf.parse(storage.read_json(e.path), e.path)
                    if item.manifest.step != step or item.manifest.rank != item.rank:
                        item.error = (f"{e.path}: describes step {item.manifest.step} rank {item.manifest.rank}, "
                                      f"not step {step} rank {item.rank}")
                except (HpcCkptError, OSError, ValueError, RecursionError) as err:
                    item.error = _message(e.path, err)
            cat.found.append(item)
        elif name == "encoded.json":
            item = Found(e.path, step, holder, kind="parity", holder=holder)
            if kind != "file":
                item.error = f"{e.path}: {_not_regular(kind)}"
            else:
                try:
                    item.manifest = _parity_table(storage.read_json(e.path), holder)
                except (HpcCkptError, OSError, ValueError, TypeError, KeyError, RecursionError) as err:
                    item.error = _message(e.path, err)
            cat.found.append(item)


def _message(path, err):
    """One line naming ``path`` (once) and what is wrong."""
    text = f"cannot be read ({why(err)})" if isinstance(err, OSError) else str(err) or type(err).__name__
    if isinstance(err, KeyError):
        text = f"key {err} is missing; not an hpcckpt encoded-level file"
    return text if text.startswith(path) else f"{path}: {text}"


def _parity_table(doc, holder):
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
    from .levels.delta import SEGMENTS_ONLY, parity_entries, segment_sums_ok
    if m and any(c == SEGMENTS_ONLY for c in sums) and not segment_sums_ok(doc, m, piece, doc.get("segment")):
        raise ValueError("bad segment checksums")     # an incremental step's parity: one checksum per segment
    return {"size": m * piece, "entries": parity_entries(doc),
            "group": list(group), "parity": m, "level": doc["level"], "ckpt_id": doc["ckpt_id"]}


def _pfs_step(path, step, names):
    from .levels import pfs_index
    item = PfsStep(path, step, committed=pfs_index.MARKER in names)
    kind = names.get(pfs_index.MARKER)
    if kind is None:
        item.error = f"not committed ({pfs_index.MARKER} is missing)"
    elif kind != "file":
        item.error = f"{os.path.join(path, pfs_index.MARKER)}: {_not_regular(kind)}"
    else:
        try:
            item.index = pfs_index.read_index(path, step=step, max_bytes=index_cap())
        except (HpcCkptError, OSError, ValueError, RecursionError) as err:
            item.error = _message(os.path.join(path, pfs_index.MARKER), err)
    return item


# ---------------------------------------------------------------------- checking
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
        return f"{path}: {_not_regular(kind)}"
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


def index_cap():
    """The largest COMMITTED.json the command line reads (that of a job of 4096 ranks)."""
    from .levels import pfs_index
    return pfs_index.max_index_bytes(4096)


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


@dataclasses.dataclass
class CacheStep:
    """One checkpoint (one ckpt_id) of one step of one job in the cache, as found under the root
    (its ranks spread over every node's directory), or the unreadable parts of a step that no
    readable manifest claims (``reference`` empty)."""
    job: str
    step: int
    ranks: list = dataclasses.field(default_factory=list)      # Found (kind rank): its own and unreadable ones
    copies: list = dataclasses.field(default_factory=list)     # Found (kind partner) of this checkpoint
    parities: list = dataclasses.field(default_factory=list)   # Found (kind parity) of this checkpoint
    pending: list = dataclasses.field(default_factory=list)    # ranks with data but no manifest in its directories
    reference: list = dataclasses.field(default_factory=list)  # its readable rank manifests (one ckpt_id)
    stale: list = dataclasses.field(default_factory=list)      # manifests of another checkpoint in its directories
    shared: bool = False      # another checkpoint of the same job and step was found too

    @property
    def manifest(self):
        return self.reference[0].manifest if self.reference else None

    @property
    def world_size(self):
        if self.reference:
            return self.manifest.world_size
        for f in self.copies:
            if f.manifest and not f.error:
                return f.manifest.world_size
        return None

    @property
    def ckpt_id(self):
        return self.manifest.ckpt_id if self.reference else None

    @property
    def label(self):
        if self.shared and self.ckpt_id:
            return f"step {self.step} (checkpoint {self.ckpt_id[:12]})"
        return f"step {self.step}"


def _ckpt_of(f):
    """The ckpt_id a readable Found belongs to, else None."""
    if f.error or f.manifest is None:
        return None
    return f.manifest["ckpt_id"] if f.kind == "parity" else f.manifest.ckpt_id


def cache_steps(cat):
    """The cache checkpoints of a catalog, in (job, step) order.

    The readable rank manifests of one job and step are grouped by ckpt_id: each group is one
    checkpoint, wherever its ranks' directories are. A group whose every directory also holds
    ranks of a larger (else newer) group is not a checkpoint but stale pieces: its files are
    that group's ``stale``. Unreadable manifests, partner copies, parity and data without a
    manifest go with the checkpoint whose directory (or ckpt_id) they share."""
    by_step = collections.defaultdict(list)
    for f in cat.found:
        by_step[(f.job, f.step)].append(f)
    pending_by = collections.defaultdict(dict)
    for (step_dir, step), ranks in cat.pending.items():
        pending_by[(os.path.basename(os.path.abspath(os.path.dirname(step_dir))), step)][step_dir] = ranks
        by_step.setdefault((os.path.basename(os.path.abspath(os.path.dirname(step_dir))), step), [])
    out = []
    for (job, step), items in sorted(by_step.items()):
        groups = collections.defaultdict(list)
        for f in items:
            if f.kind == "rank" and _ckpt_of(f):
                groups[_ckpt_of(f)].append(f)
        order = sorted(groups, key=lambda c: (len(groups[c]), groups[c][0].manifest.epoch,
                                              groups[c][0].manifest.created, c), reverse=True)
        dirs = {c: {f.step_dir for f in groups[c]} for c in order}
        kept, stale = [], []
        for c in order:
            if kept and all(any(d in dirs[k] for k in kept) for d in dirs[c]):
                stale.append(c)
            else:
                kept.append(c)
        steps = {c: CacheStep(job, step, ranks=list(groups[c]), reference=list(groups[c])) for c in kept}
        orphans = CacheStep(job, step)

        def home(f, c=None):
            """The checkpoint a part belongs to: by ckpt_id, else by directory."""
            if c in steps:
                return steps[c]
            return next((steps[k] for k in kept if f.step_dir in dirs[k]), orphans)

        for c in stale:
            for f in groups[c]:
                home(f).stale.append(f)
        for f in items:
            if f.kind == "rank" and _ckpt_of(f) is None:
                home(f).ranks.append(f)
            elif f.kind == "partner":
                home(f, _ckpt_of(f)).copies.append(f)
            elif f.kind == "parity":
                home(f, _ckpt_of(f)).parities.append(f)
        for step_dir, ranks in pending_by.get((job, step), {}).items():
            target = next((steps[k] for k in kept if step_dir in dirs[k]), orphans)
            target.pending = sorted(set(target.pending) | set(ranks))
        found = [steps[c] for c in kept]
        if orphans.ranks or orphans.copies or orphans.parities or orphans.pending:
            found.append(orphans)
        for cs in found:
            cs.shared = len(kept) > 1
            cs.ranks.sort(key=lambda f: (f.rank, f.path))
        out.extend(found)
    return out


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
    if level in REDUNDANCY:
        return f" (no intact {level} redundancy for it under {root})"
    return ""


# ---------------------------------------------------------------------- inspecting
def state_document(item, max_bytes=MAX_STATE_DOCUMENT):
    """The parsed state document of one rank part (its ``__state__`` array), None when it has
    none; CorruptCheckpointError when it is damaged (checksum, size, content)."""
    from .codecs.checksum import digest
    from .errors import CorruptCheckpointError
    from .state import STATE_ENTRY, parse_document
    a = item.manifest.array(STATE_ENTRY)
    if a is None:
        return None
    path = item.data_path
    where = f"{path}: {STATE_ENTRY}"
    if a.nbytes > max_bytes:
        raise CorruptCheckpointError(f"{where}: {a.nbytes} bytes, more than inspect reads ({max_bytes})")
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptCheckpointError(f"{path}: not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = os.pread(fd, a.nbytes, a.offset)
        finally:
            os.close(fd)
    except OSError as e:
        raise CorruptCheckpointError(f"{path}: cannot be read ({why(e)})") from None
    if len(data) != a.nbytes or digest(data) != a.checksum:
        raise CorruptCheckpointError(f"{where}: fails its checksum (damaged)")
    return parse_document(data, where)


def describe_value(enc):
    """A short description of an encoded state item: 'array u', 'float', 'dict (4 keys)', …"""
    if enc is None:
        return "None"
    if isinstance(enc, bool):
        return "bool"
    if isinstance(enc, int):
        return "int"
    if isinstance(enc, str):
        return "str"
    if isinstance(enc, list):
        return f"list ({len(enc)} items)"
    (tag, body), = enc.items()
    if tag == "$array":
        return f"array {body}"
    if tag == "$scalar":
        return f"NumPy scalar {body[0]}"
    if tag == "$tuple":
        return f"tuple ({len(body)} items)"
    if tag == "$dict":
        return f"dict ({len(body)} keys)"
    return tag[1:]
