"""Find checkpoints on disk without MPI (local; used by the command line).

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
``cache_steps(catalog)`` groups what was found into checkpoints; catalog_verify.py re-verifies
them, catalog_inspect.py reads a rank part's state document; the CLI prints what they say.
"""
import collections
import dataclasses
import os
import re
import stat

from . import manifest as mf, storage
from .errors import HpcCkptError

MAX_DEPTH = 6
PFS_FILES_RE = re.compile(r"^(COMMITTED\.json|checkpoint\.h5|node_[0-9]{6}\.h5)$")
PFS_TMP_RE = re.compile(r"^(step_[0-9]{10,13})\.tmp-")


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


def not_regular(kind):
    """Local: what to say of an entry that is not a regular file, by its _kind ("link", "dir", "other")."""
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
                item.error = f"{e.path}: {not_regular(kind)}"
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
                item.error = f"{e.path}: {not_regular(kind)}"
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
                item.error = f"{e.path}: {not_regular(kind)}"
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
        item.error = f"{os.path.join(path, pfs_index.MARKER)}: {not_regular(kind)}"
    else:
        try:
            item.index = pfs_index.read_index(path, step=step, max_bytes=index_cap())
        except (HpcCkptError, OSError, ValueError, RecursionError) as err:
            item.error = _message(os.path.join(path, pfs_index.MARKER), err)
    return item


def index_cap():
    """The largest COMMITTED.json the command line reads (that of a job of 4096 ranks)."""
    from .levels import pfs_index
    return pfs_index.max_index_bytes(4096)


# ---------------------------------------------------------------------- checkpoints
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
