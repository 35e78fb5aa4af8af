"""Find checkpoints on disk without MPI (local; used by the command line).

``scan(root)`` walks a directory (a cache dir, a level's own directory such as the pfs dir, a
job dir, or any directory above them, up to MAX_DEPTH levels down) and returns a Catalog of
everything that looks like a checkpoint part:

- cache steps (``<cache_dir>/<name>/step_<S>/``): every rank manifest, data files left without
  a manifest, and what the levels keep in a rank's held folder ``held_<H>/`` (partner copies,
  parity), found by asking each registered level's ``files`` (levels/files.py);
- the steps a level keeps in directories of its own (the pfs level's step directories, and
  those being written), as the level's ``files`` reads them (``Stored`` records);
- problems: what could not be examined (a directory that cannot be listed, a step or held
  directory that is a symbolic link or not a directory, a manifest that is not a regular file).

Nothing here opens a FIFO or follows a symbolic link below ``root``, and nothing parses a
level's file names but the node cache's own (``rank_<R>.json/.dat``, ``held_<H>``).
``cache_steps(catalog)`` groups what was found into checkpoints; catalog_verify.py re-verifies
them, catalog_inspect.py reads a rank part's state document; the CLI prints what they say.
"""
import collections
import dataclasses
import os
import stat

from . import manifest as mf
from .errors import HpcCkptError
from .levels.files import entry_kind, read_rank_manifest, registered, why

MAX_DEPTH = 6


@dataclasses.dataclass
class Found:
    """One rank manifest found in a cache step directory (``kind`` "rank"), or an item a level
    keeps in a held folder (``files``: the level's LevelFiles): parsed, or the reason it is unreadable."""
    path: str
    step: int
    rank: int                 # the rank whose part it is (a copy of), or covers (parity: its holder)
    manifest: object = None   # RankManifest (a rank's, a copy's), or what the level read (the parity table)
    error: str = None
    kind: str = "rank"        # "rank": a rank's own part; else the level's word for it ("partner", "parity")
    holder: int = None        # held items: the rank whose held_<H> folder keeps it
    files: object = None      # held items: the LevelFiles that found it (verify asks it)
    data: str = None          # held items: its data file
    delta: str = None         # held items of an incremental step: the delta file held instead of the data
    what: str = ""            # held items: the tail of its label
    ckpt: str = None          # held items: the checkpoint it belongs to, when readable

    @property
    def step_dir(self):
        d = os.path.dirname(self.path)
        return d if self.files is None else os.path.dirname(d)

    @property
    def job_dir(self):
        return os.path.dirname(self.step_dir)

    @property
    def job(self):
        """The job name as the directory says it (``<cache_dir>/<name>/step_<S>``)."""
        return os.path.basename(os.path.abspath(self.job_dir))

    @property
    def data_path(self):
        return self.data or os.path.join(os.path.dirname(self.path), mf.data_file_name(self.rank))

    @property
    def delta_path(self):
        """A held item of an incremental step: its delta file (held instead of the full file,
        levels/delta.py); None otherwise."""
        return self.delta

    @property
    def shown_path(self):
        """The file that holds this item's data: the delta of an incremental step, else the data file."""
        return self.delta_path or self.data_path

    @property
    def ckpt_id(self):
        """The checkpoint it belongs to; None when it is unreadable."""
        if self.error or self.manifest is None:
            return None
        return self.manifest.ckpt_id if self.files is None else self.ckpt

    @property
    def label(self):
        return f"step {self.step} rank {self.rank}{self.what}"


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
    stored: list = dataclasses.field(default_factory=list)      # levels/files.Stored (pfs steps), sorted by step
    problems: list = dataclasses.field(default_factory=list)    # Problem
    pending: dict = dataclasses.field(default_factory=dict)     # (step dir, step) -> [rank] of data without manifest

    def empty(self):
        return not (self.found or self.stored or self.problems or self.pending)

    def only_step(self, step):
        """A copy restricted to one step (problems of unknown step are kept)."""
        return Catalog(self.root, [f for f in self.found if f.step == step], [s for s in self.stored if s.step == step],
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
    _walk(cat, root, 0, max_depth, registered())
    cat.found.sort(key=lambda f: (f.step, f.rank, f.kind, f.path))
    cat.stored.sort(key=lambda s: (s.step, s.path))
    return cat


def find(root):
    """Every rank manifest and held item (partner copy, parity) under ``root``, sorted by step, rank."""
    return scan(root).found


def uncommitted_steps(root):
    """Step directories holding data files but no manifest of that rank: {step: [rank, ...]}."""
    out = {}
    for (_, step), ranks in scan(root).pending.items():
        out.setdefault(step, []).extend(ranks)
    return {s: sorted(r) for s, r in out.items()}


def _entries(cat, path, step=None):
    """[(name, path, kind)] of a directory sorted by name (kind: levels/files.entry_kind), or None
    (a Problem recorded) if it cannot be listed."""
    try:
        with os.scandir(path) as it:
            return [(e.name, e.path, entry_kind(e)) for e in sorted(it, key=lambda e: e.name)]
    except OSError as e:
        cat.problems.append(Problem(path, f"cannot be read ({why(e)})", step))
        return None


def _walk(cat, path, depth, max_depth, levels):
    step = mf.parse_step_dir_name(os.path.basename(os.path.normpath(path)))
    if step is not None:
        _step_dir(cat, path, step, levels)
        return
    for name, epath, kind in _entries(cat, path) or ():
        estep = mf.parse_step_dir_name(name)
        item = next((i for i in (f.other_item(epath, name, kind) for f in levels) if i is not None), None)
        if item is not None:
            cat.stored.append(item)
        elif estep is not None and kind != "dir":
            what = "is a symbolic link; not followed" if kind == "link" else "is not a directory"
            cat.problems.append(Problem(epath, "named like a step directory but " + what, estep))
        elif kind == "dir" and depth + 1 <= max_depth:
            _walk(cat, epath, depth + 1, max_depth, levels)


def _step_dir(cat, path, step, levels):
    entries = _entries(cat, path, step)
    if entries is None:
        return
    for files in levels:            # a level's own step directory: the names it claims are its
        items, claimed = files.step_items(path, step, entries)
        cat.stored.extend(items)
        entries = [e for e in entries if e[0] not in claimed]
    data, manifests = set(), set()
    for name, epath, kind in entries:
        if name.startswith("rank_") and name.endswith(".json") and name[5:-5].isdigit():
            rank = int(name[5:-5])
            manifests.add(rank)
            item = Found(epath, step, rank)
            item.manifest, item.error = read_rank_manifest(epath, kind, step, rank)
            cat.found.append(item)
        elif name.startswith("rank_") and name.endswith(".dat") and name[5:-4].isdigit():
            data.add(int(name[5:-4]))
        elif (holder := mf.parse_held_dir_name(name)) is not None:
            if kind == "dir":
                _held(cat, epath, step, holder, levels)
            else:
                cat.problems.append(Problem(epath, "a held-redundancy folder that " + (
                    "is a symbolic link; not followed" if kind == "link" else "is not a directory"), step))
    if data - manifests:
        cat.pending[(path, step)] = sorted(data - manifests)


def _held(cat, path, step, holder, levels):
    """What the levels keep in one ``held_<H>`` folder of a step directory (each entry goes to
    the first level whose files claim it)."""
    entries = _entries(cat, path, step) or []
    for files in levels:
        mine = [e for e in entries if files.held_file(e[0])]
        entries = [e for e in entries if not files.held_file(e[0])]
        if mine:
            cat.found.extend(files.held_items(path, step, holder, mine))


# ---------------------------------------------------------------------- checkpoints
@dataclasses.dataclass
class CacheStep:
    """One checkpoint (one ckpt_id) of one step of one job in the cache, as found under the root
    (its ranks spread over every node's directory), or the unreadable parts of a step that no
    readable manifest claims (``reference`` empty)."""
    job: str
    step: int
    ranks: list = dataclasses.field(default_factory=list)      # Found (kind rank): its own and unreadable ones
    held: list = dataclasses.field(default_factory=list)       # Found held items (partner copies, parity) of it
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
        for f in self.held:         # a held copy of a rank's manifest
            if isinstance(f.manifest, mf.RankManifest) and not f.error:
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


def cache_steps(cat):
    """The cache checkpoints of a catalog, in (job, step) order.

    The readable rank manifests of one job and step are grouped by ckpt_id: each group is one
    checkpoint, wherever its ranks' directories are. A group whose every directory also holds
    ranks of a larger (else newer) group is not a checkpoint but stale pieces: its files are
    that group's ``stale``. Unreadable manifests, held items (partner copies, parity) and data without a
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
            if f.files is None and f.ckpt_id:
                groups[f.ckpt_id].append(f)
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
            if f.files is None and f.ckpt_id is None:
                home(f).ranks.append(f)
            elif f.files is not None:
                home(f, f.ckpt_id).held.append(f)
        for step_dir, ranks in pending_by.get((job, step), {}).items():
            target = next((steps[k] for k in kept if step_dir in dirs[k]), orphans)
            target.pending = sorted(set(target.pending) | set(ranks))
        found = [steps[c] for c in kept]
        if orphans.ranks or orphans.held or orphans.pending:
            found.append(orphans)
        for cs in found:
            cs.shared = len(kept) > 1
            cs.ranks.sort(key=lambda f: (f.rank, f.path))
        out.extend(found)
    return out
