"""The index of a pfs checkpoint: ``COMMITTED.json``, its schema, and the listing of a job's
committed steps (local, pure apart from reading files; no MPI, no HDF5).

The index is the commit marker of a pfs step, written last. It names every array with its
layout and one block per rank that holds it (``null`` for a rank that does not), the node file
sizes, the checksum of the master file, the run's epoch, and a checksum over itself: a damaged
index that still parses is detected (and the step falls back) instead of being believed.
Version 1 (no epoch, no layouts, no self-checksum) is still read. See docs/PFS.md.
"""
import dataclasses
import math
import os
import stat

import numpy as np

from .. import manifest as mf, storage
from ..codecs.checksum import ALGORITHM
from ..errors import CorruptCheckpointError, HpcCkptError, IncompatibleCheckpointError
from . import hdf5_layout as lay

FORMAT = "hpcckpt-pfs"
VERSION = 2
MASTER = "checkpoint.h5"
MARKER = "COMMITTED.json"
TRASH = ".trash"                  # retired step directories while their files are removed
SPARE = ".spare"                  # reuse_files: one retired node file per node, overwritten next
LAYOUTS = mf.LAYOUTS
GLOBAL_LAYOUTS = ("block", "rows")       # stored as one global dataset (a virtual dataset in the master)
SHARED_LAYOUTS = ("replicated", "root")  # stored once, by rank 0


def max_index_bytes(world_size):
    """The largest index a job of ``world_size`` ranks reads: generous for a checkpoint written
    by many more ranks, yet bounded by the job (a crafted huge index is refused before parsing)."""
    return (4 << 20) + (64 << 10) * max(1, int(world_size))


@dataclasses.dataclass(frozen=True)
class Block:
    """One rank's part of an array: its local shape, its global offset (block and rows layouts
    only) and its checksum."""
    shape: tuple
    offset: tuple
    checksum: str


@dataclasses.dataclass(frozen=True)
class Entry:
    """One array of a checkpoint. ``blocks[r]`` is rank r's Block, None where rank r has none;
    ``global_shape`` is set for the block and rows layouts."""
    name: str
    dtype: str
    layout: str
    global_shape: tuple
    blocks: tuple

    @property
    def itemsize(self):
        return np.dtype(self.dtype).itemsize

    def nbytes(self, rank):
        b = self.blocks[rank]
        return 0 if b is None else lay.volume(b.shape) * self.itemsize

    def holders(self):
        return [r for r, b in enumerate(self.blocks) if b is not None]


@dataclasses.dataclass(frozen=True)
class Index:
    """The content of COMMITTED.json (validated)."""
    name: str
    step: int
    ckpt_id: str
    world_size: int
    created: float
    node_of: tuple
    files: dict            # node file name -> size in bytes
    arrays: tuple          # Entries
    master_checksum: str = ""   # XXH3-64 of checkpoint.h5's bytes, checked before HDF5 opens it
    epoch: int = 1
    state_keys: dict = dataclasses.field(default_factory=dict)   # state dict key -> layout kind
    # node file name -> (extents ((start, length), ...) outside its datasets' bytes, XXH3-64 of
    # their bytes): the HDF5 metadata, checked before HDF5 opens the file ({} in older indexes)
    node_metadata: dict = dataclasses.field(default_factory=dict)

    def entry(self, name):
        return next((e for e in self.arrays if e.name == name), None)

    def to_json(self):
        return mf.sign({
            "format": FORMAT, "version": VERSION, "name": self.name, "step": self.step, "epoch": self.epoch,
            "ckpt_id": self.ckpt_id, "world_size": self.world_size, "created": self.created,
            "checksum_algorithm": ALGORITHM, "master": MASTER, "node_of": list(self.node_of),
            "files": dict(self.files), "master_checksum": self.master_checksum, "state_keys": dict(self.state_keys),
            "node_metadata": {f: {"extents": [list(x) for x in ext], "checksum": c}
                              for f, (ext, c) in self.node_metadata.items()},
            "arrays": [{"name": e.name, "dtype": e.dtype, "layout": e.layout,
                        "global_shape": None if e.global_shape is None else list(e.global_shape),
                        "blocks": [None if b is None else
                                   dict({"shape": list(b.shape), "checksum": b.checksum},
                                        **({} if b.offset is None else {"offset": list(b.offset)}))
                                   for b in e.blocks]}
                       for e in self.arrays]})


def id_ok(text):
    """A checkpoint id: 1-64 letters, digits, '-' or '_'."""
    return isinstance(text, str) and 0 < len(text) <= 64 and all(ch.isascii() and (ch.isalnum() or ch in "-_")
                                                                 for ch in text)


def parse_index(doc, where):
    """Local, pure: validate a COMMITTED.json document; return an Index."""
    def bad(msg):
        return CorruptCheckpointError(f"{where}: {msg}")

    mf.check_header(doc, where, FORMAT, VERSION)
    version = doc["version"]
    if version >= 2 and doc.get("manifest_checksum") != mf.self_checksum(doc):
        raise bad("the index does not match its checksum (damaged)")
    if doc.get("master") != MASTER:
        raise bad(f"master must be {MASTER!r}")
    step, size = doc.get("step"), doc.get("world_size")
    if not mf._is_int(step) or not 0 <= step <= mf.MAX_STEP:
        raise bad(f"bad step {step!r}")
    if not mf._is_int(size) or not 1 <= size <= 1 << 24:
        raise bad(f"bad world_size {size!r}")
    epoch = doc.get("epoch", 1) if version >= 2 else 1
    if not mf._is_int(epoch) or not 1 <= epoch <= mf.MAX_STEP:
        raise bad(f"bad epoch {epoch!r}")
    for key in ("name", "ckpt_id"):
        v = doc.get(key)
        if not isinstance(v, str) or not v or len(v) > 256:
            raise bad(f"{key} must be a short non-empty string, got {v!r}")
    if not id_ok(doc["ckpt_id"]):
        raise bad(f"bad ckpt_id {doc['ckpt_id']!r}")
    created = doc.get("created")
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not math.isfinite(created):
        raise bad(f"bad creation time {created!r}")
    node_of = doc.get("node_of")
    if not isinstance(node_of, list) or len(node_of) != size or not all(mf._is_int(n) and n >= 0 for n in node_of):
        raise bad(f"node_of must list the node of each of the {size} ranks")
    nnodes = max(node_of) + 1
    if set(node_of) != set(range(nnodes)):
        raise bad("node_of must use the node indices 0..n-1")
    files = doc.get("files")
    want_files = {lay.node_file(n) for n in range(nnodes)}
    if not isinstance(files, dict) or set(files) != want_files or \
            not all(mf._is_int(v) and 0 <= v <= mf.MAX_BYTES for v in files.values()):
        raise bad(f"files must give the size of each of {sorted(want_files)[:4]}…")
    master_checksum = doc.get("master_checksum")
    if not isinstance(master_checksum, str) or not mf._HEX_RE.match(master_checksum):
        raise bad("master_checksum must be a hex string")
    node_metadata = _node_metadata(doc.get("node_metadata", {}), files, bad)
    state_keys = doc.get("state_keys", {}) if version >= 2 else {}
    if not isinstance(state_keys, dict) or not all(isinstance(k, str) and v in LAYOUTS for k, v in state_keys.items()):
        raise bad("state_keys must map state keys to layouts")
    arrays = doc.get("arrays")
    if not isinstance(arrays, list) or not arrays or len(arrays) > 1_000_000:
        raise bad("arrays must be a non-empty list")
    entries, names = [], set()
    for k, a in enumerate(arrays):
        entry = _parse_entry(a, size, version, lambda msg, k=k: bad(f"arrays[{k}]: {msg}"))
        if entry.name in names:
            raise bad(f"array {entry.name!r} appears twice")
        names.add(entry.name)
        entries.append(entry)
    return Index(name=doc["name"], step=step, ckpt_id=doc["ckpt_id"], world_size=size, created=float(created),
                 node_of=tuple(node_of), files=dict(files), arrays=tuple(entries), master_checksum=master_checksum,
                 epoch=epoch, state_keys=dict(state_keys), node_metadata=node_metadata)


def _node_metadata(doc, files, bad):
    """The index's node_metadata: for some of ``files``, ascending non-overlapping extents inside
    the file and a hex checksum."""
    if not isinstance(doc, dict) or not set(doc) <= set(files):
        raise bad("node_metadata must map node files to their metadata extents")
    out = {}
    for name, meta in doc.items():
        extents = meta.get("extents") if isinstance(meta, dict) else None
        checksum = meta.get("checksum") if isinstance(meta, dict) else None
        if not isinstance(extents, list) or len(extents) > 1 << 24 or not isinstance(checksum, str) \
                or not mf._HEX_RE.match(checksum):
            raise bad(f"node_metadata[{name!r}] must give extents and a hex checksum")
        at = 0
        for x in extents:
            if not (isinstance(x, list) and len(x) == 2 and all(mf._is_int(v) for v in x)
                    and x[0] >= at and x[1] > 0 and x[0] + x[1] <= files[name]):
                raise bad(f"node_metadata[{name!r}]: bad extent {x!r}")
            at = x[0] + x[1]
        out[name] = (tuple(tuple(x) for x in extents), checksum)
    return out


def _parse_entry(a, size, version, bad):
    if not isinstance(a, dict):
        raise bad("not an object")
    name = a.get("name")
    if not isinstance(name, str) or not mf.ARRAY_NAME_RE.match(name) or lay.RANK_GROUP_RE.match(name):
        raise bad(f"bad array name {name!r}")
    dtype_text = a.get("dtype")
    dtype = mf.parse_dtype(dtype_text, bad)
    gshape = a.get("global_shape")
    if gshape is not None:
        gshape = _shape(gshape, bad, "global_shape")
    layout = a.get("layout") if version >= 2 else ("block" if gshape is not None else "rank")
    if layout not in LAYOUTS or (layout in GLOBAL_LAYOUTS) != (gshape is not None):
        raise bad(f"bad layout {layout!r} (global_shape {gshape})")
    blocks = a.get("blocks")
    if not isinstance(blocks, list) or len(blocks) != size:
        raise bad(f"blocks must list one block (or null) for each of the {size} ranks")
    out = []
    for r, b in enumerate(blocks):
        if b is None and version >= 2:
            out.append(None)
            continue
        if not isinstance(b, dict):
            raise bad(f"block {r}: not an object")
        shape = _shape(b.get("shape"), bad, f"block {r} shape")
        if lay.volume(shape) * dtype.itemsize > mf.MAX_BYTES:
            raise bad(f"block {r}: shape {shape} is absurdly large")
        checksum = b.get("checksum")
        if not isinstance(checksum, str) or not mf._HEX_RE.match(checksum):
            raise bad(f"block {r}: bad checksum {checksum!r}")
        offset = None
        if gshape is not None:
            offset = _shape(b.get("offset"), bad, f"block {r} offset")
        elif "offset" in b:
            raise bad(f"block {r}: an offset without a global shape")
        out.append(Block(shape, offset, checksum))
    holders = [r for r, b in enumerate(out) if b is not None]
    if not holders:
        raise bad(f"array {name!r}: no rank holds it")
    if layout in SHARED_LAYOUTS and holders != [0]:
        raise bad(f"array {name!r}: a {layout} array is held by rank 0 alone")
    if gshape is not None:
        if holders != list(range(size)):
            raise bad(f"array {name!r}: every rank must hold a block of a global array")
        problem = lay.tiling_problem(gshape, [(b.offset, b.shape) for b in out])
        if problem:
            raise bad(f"array {name!r}: {problem}")
    return Entry(name, dtype_text, layout, gshape, tuple(out))


def _shape(v, bad, what):
    if not isinstance(v, list) or len(v) > mf.MAX_DIMS or not all(mf._is_int(n) and 0 <= n <= mf.MAX_BYTES for n in v):
        raise bad(f"bad {what} {v!r}")
    return tuple(v)


def read_index(step_dir, name=None, max_bytes=None, step=None):
    """Local: the validated index of the committed step in ``step_dir``. CorruptCheckpointError
    when it is missing, damaged or larger than ``max_bytes``; IncompatibleCheckpointError when it
    belongs to another job name than ``name``, or a newer format."""
    path = os.path.join(step_dir, MARKER)
    try:
        doc = storage.read_json(path, max_bytes or max_index_bytes(1 << 20))
    except FileNotFoundError:
        raise CorruptCheckpointError(f"pfs step {step if step is not None else step_dir} is not committed "
                                     f"({path} is missing)") from None
    except OSError as e:
        raise CorruptCheckpointError(f"{path}: cannot read ({e.strerror})") from None
    index = parse_index(doc, path)
    if step is not None and index.step != step:
        raise CorruptCheckpointError(f"{path}: describes step {index.step}, not {step}")
    if name is not None and index.name != name:
        raise IncompatibleCheckpointError(f"{path}: belongs to job {index.name!r}, not {name!r}")
    return index


def committed_steps(root):
    """Local: the step numbers under a job's pfs directory that have a commit marker, ascending."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for entry in names:
        step = mf.parse_step_dir_name(entry)
        if step is None or os.path.islink(os.path.join(root, entry)):
            continue
        try:
            st = os.lstat(os.path.join(root, entry, MARKER))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(step)
    return sorted(out)


_LISTING_CACHE = {}


def listing(root, name=None, max_bytes=None, skipped=None):
    """Local: {step: (epoch, ckpt_id)} of the committed steps under ``root`` whose index is
    readable (and names job ``name``). Indexes are parsed once per (path, size, mtime). The
    committed steps whose index cannot be used are appended to the list ``skipped`` as (step,
    reason), when given."""
    out = {}
    for step in committed_steps(root):
        step_dir = os.path.join(root, mf.step_dir_name(step))
        path = os.path.join(step_dir, MARKER)
        try:
            st = os.lstat(path)
            key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
            if key not in _LISTING_CACHE:
                if len(_LISTING_CACHE) > 4096:
                    _LISTING_CACHE.clear()
                index = read_index(step_dir, name, max_bytes, step)
                _LISTING_CACHE[key] = (index.epoch, index.ckpt_id)
            out[step] = _LISTING_CACHE[key]
        except (HpcCkptError, OSError) as e:
            if skipped is not None:
                skipped.append((step, str(e)))
    return out
