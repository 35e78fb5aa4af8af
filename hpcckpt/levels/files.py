"""``LevelFiles``: how a level tells ``hpcckpt list/verify/inspect`` (catalog.py, catalog_verify.py,
cli.py) and ``relocate`` about its files. Local, no MPI: pure file reading.

Every checkpoint is first a local one, so the catalog reads the node cache's rank files itself
(``step_<S>/rank_<R>.json/.dat``). What a level adds it finds by asking ``Level.files`` (an
instance of a LevelFiles subclass) of every registered level, cheapest first (``registered``);
nothing outside ``hpcckpt/levels/`` parses a level's file names. A level keeps files in:

- a rank's held folder of the node cache, ``step_<S>/held_<H>/`` (redundant levels: partner
  copies, parity). ``held_file(name)`` says which entries are the level's: relocate moves them
  with their holder H, and the catalog hands them to ``held_items``, which returns them as
  ``catalog.Found`` items (its data file, the delta file of an incremental step, a label);
  ``verify`` re-checks one and ``rebuild_note`` says whether a lost rank part can be rebuilt
  from them;
- directories of its own (pfs: ``<pfs_dir>/<name>/step_<S>/``). ``step_items`` claims entries
  of a step directory the walk meets (returning ``Stored`` records), ``other_item`` an entry of
  any other directory (a step being written); ``check``, ``row`` and ``inspect`` say what
  verify, list and inspect print of a record, and ``rebuild_note`` what a copy of a whole
  checkpoint holds.

Entries come as (name, path, kind) with kind "file", "dir", "link" or "other" (entry_kind): a
level never follows a link nor opens what is not a regular file (a FIFO would block). Levels
that share files share one LevelFiles object (xor and rs: parity), asked once.
"""
import dataclasses
import os
import stat

from .. import manifest as mf, storage
from ..errors import HpcCkptError


def why(e):
    """The reason of an OSError, without Python's '[Errno n]' prefix and never 'None'."""
    return e.strerror or str(e) or type(e).__name__


def entry_kind(entry):
    """'dir', 'file', 'link' or 'other' (FIFO, socket, device) of an os.DirEntry, without following links."""
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
    """What to say of an entry that is not a regular file, by its entry_kind ("link", "dir", "other")."""
    return {"link": "is a symbolic link; refusing to follow it", "dir": "is a directory, not a file",
            "other": "is not a regular file (a FIFO, socket or device)"}[kind]


def message(path, err):
    """One line naming ``path`` (once) and what is wrong."""
    text = f"cannot be read ({why(err)})" if isinstance(err, OSError) else str(err) or type(err).__name__
    if isinstance(err, KeyError):
        text = f"key {err} is missing"
    return text if text.startswith(path) else f"{path}: {text}"


def read_rank_manifest(path, kind, step, rank):
    """(RankManifest, None) of the rank manifest (or copy of one) at ``path``, else (None, the
    reason): not a regular file, unreadable, or describing another step or rank."""
    if kind != "file":
        return None, f"{path}: {not_regular(kind)}"
    try:
        m = mf.parse(storage.read_json(path), path)
    except (HpcCkptError, OSError, ValueError, RecursionError) as err:
        return None, message(path, err)
    if m.step != step or m.rank != rank:
        return m, f"{path}: describes step {m.step} rank {m.rank}, not step {step} rank {rank}"
    return m, None


def verify_data(path, size, entries, buffer_bytes=1 << 20):
    """None when ``path`` is a regular file of ``size`` bytes whose ``entries`` [(name, offset,
    nbytes, checksum)] match their checksums, else the reason (a line naming the file)."""
    import numpy as np
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


def held_delta(data_path):
    """The delta file an incremental step holds instead of held file ``data_path`` (levels/delta.py:
    ``<stem>.delta`` and its index ``<stem>.delta.json``), or None when it holds the file itself."""
    stem = data_path[:-4]
    if not os.path.lexists(data_path) and os.path.lexists(stem + ".delta.json"):
        return stem + ".delta"
    return None


def verify_held(item, size, entries, buffer_bytes=1 << 20):
    """None when a held item's data (``item.data_path``, or with ``item.delta_path`` the data
    rebuilt in memory from the base step's file and the delta) matches ``entries``, else the reason."""
    if item.delta_path is None:
        return verify_data(item.data_path, size, entries, buffer_bytes)
    import xxhash
    from .delta import materialize_held
    path = item.data_path
    try:
        data = materialize_held(os.path.dirname(path), os.path.basename(path), size)
    except (HpcCkptError, OSError, ValueError) as e:
        return f"{item.delta_path}: incremental, its base and delta cannot be applied ({e})"
    for name, offset, nbytes, checksum in entries:
        if xxhash.xxh3_64_hexdigest(data[offset:offset + nbytes]) != checksum:
            return f"{item.delta_path}: incremental, {name} rebuilt from its base and delta does not match its checksum"
    return None


def rank_ranges(ranks):
    """'0-3, 5' for a sorted list of ranks."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)


@dataclasses.dataclass
class Stored:
    """One step of a level's own directory tree (a pfs step directory): a checkpoint of that
    level, or (``note``) something that is not one, which restart() ignores."""
    files: object             # the LevelFiles that found it
    level: str                # its level's name
    path: str                 # its directory
    step: int
    job: str                  # the job name (as its files say, else its directory)
    ckpt_id: str = None       # the checkpoint it holds, when readable
    error: str = None         # why it cannot be used (damage)
    note: str = None          # what it is when not a checkpoint ("being written, or abandoned by a crash")

    @property
    def job_dir(self):
        return os.path.dirname(self.path)

    @property
    def label(self):
        return f"step {self.step} ({self.level})"


@dataclasses.dataclass
class Row:
    """What ``hpcckpt list`` prints of a Stored record (None: '-')."""
    state: str
    epoch: int = None
    ranks: int = None         # ranks whose part is here
    world_size: int = None
    nbytes: int = None
    created: float = None     # a time.time()


class LevelFiles:
    """A level's files, for the catalog, verify and relocate (every method local, no MPI). The
    defaults: no files."""

    # ------------------------------------------------------------------ held folders
    def held_file(self, name):
        """Pure: whether entry ``name`` of a held folder ``step_<S>/held_<H>/`` is this level's
        (relocate moves it with its holder H; the catalog hands it to held_items)."""
        return False

    def held_items(self, path, step, holder, entries):
        """[catalog.Found] of the ``entries`` (name, path, kind) it claimed in held folder ``path``
        of ``step``, kept by rank ``holder``: ``kind`` (its word: "partner"), ``rank`` (the
        rank it covers), ``manifest`` and ``ckpt`` (its checkpoint id) when readable, else
        ``error``; ``data``/``delta`` (its data file, the delta held instead), ``what`` (the
        label's tail)."""
        return []

    def verify(self, item, buffer_bytes=1 << 20):
        """None when held item ``item`` (readable: no ``error``) is intact, else the reason."""
        return f"{item.path}: no check for it"

    # ------------------------------------------------------------------ directories of its own
    def step_items(self, path, step, entries):
        """([Stored], {names it claims}) of step directory ``path`` (any ``step_<S>`` the walk
        meets) from its ``entries`` [(name, path, kind)]; claimed names are not read as the node
        cache's."""
        return [], set()

    def other_item(self, path, name, kind):
        """The Stored record entry ``name`` (at ``path``) of a directory that is not a step
        directory is (pfs: a step being written), or None."""
        return None

    def check(self, item):
        """[problem, ...] of a Stored record without ``error`` nor ``note`` (empty: intact),
        re-hashing everything (``hpcckpt verify``)."""
        return []

    def row(self, item):
        """The Row ``hpcckpt list`` prints of a Stored record (cheap checks only)."""
        return Row(item.note or item.error or "")

    def inspect(self, item):
        """(lines, damaged) that ``hpcckpt inspect`` prints of a Stored record, or None to
        leave it out."""
        return [f"{item.label} ({item.path}): {item.note or item.error or ''}"], bool(item.error)

    # ------------------------------------------------------------------ both
    def rebuild_note(self, rank, cs, cat, ok):
        """Whether rank ``rank``'s missing or damaged part of cache checkpoint ``cs``
        (catalog.CacheStep: its ``held`` items, ``reference`` manifests, ``ckpt_id``) can be
        had from this level's files in catalog ``cat``: (True, " (rebuildable from …)"),
        (False, " (not rebuildable: …)"), or None when they say nothing of it. ``ok(f)``:
        whether a held item or rank part verified intact."""
        return None


def registered():
    """[LevelFiles] of the registered levels, cheapest first, each once."""
    from .registry import classes
    out = []
    for cls in classes().values():
        if cls.files is not None and all(f is not cls.files for f in out):
            out.append(cls.files)
    return out


def held_file(name):
    """Pure: whether entry ``name`` of a held folder is a file some registered level keeps there."""
    return any(f.held_file(name) for f in registered())
