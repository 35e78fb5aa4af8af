"""The versioned JSON manifest of one rank's part of a checkpoint (local, pure).

A manifest is the commit marker: data without a manifest is not a checkpoint. Everything read
back is validated strictly before use; nothing is unpickled. See docs/FORMAT.md.
"""
import dataclasses
import json
import math
import re

import numpy as np

from .codecs.checksum import ALGORITHM, digest
from .errors import CorruptCheckpointError, IncompatibleCheckpointError, ProtectError

FORMAT = "hpcckpt-rank"
VERSION = 2               # 2: epoch (the run lineage) and a layout per array; version 1 is still read
ARRAY_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,1023}$")
LAYOUTS = ("rank", "block", "rows", "replicated", "root")
MAX_STEP = (1 << 40) - 1  # steps and epochs are ordered as one 64-bit key: epoch << 40 | step
ALLOWED_DTYPE_KINDS = "biufcSUmM"
MAX_DIMS = 32             # as HDF5 (H5S_MAX_RANK)
MAX_DTYPE_TEXT = 16       # the longest dtype string a manifest holds ('<M8[...]' with a unit multiple)
MAX_BYTES = 1 << 50
_HEX_RE = re.compile(r"^[0-9a-f]{1,64}$")


@dataclasses.dataclass(frozen=True)
class ArrayEntry:
    """One protected array inside a rank's data file."""
    name: str
    dtype: str
    shape: tuple
    offset: int
    nbytes: int
    checksum: str
    global_shape: tuple = None
    global_offset: tuple = None
    layout: str = "rank"      # see hpcckpt.state: rank, block (global_shape + global_offset), rows, ...

    def to_json(self):
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset,
             "nbytes": self.nbytes, "checksum": self.checksum, "layout": self.layout}
        if self.global_shape is not None:
            d["global_shape"] = list(self.global_shape)
            d["global_offset"] = list(self.global_offset)
        return d


@dataclasses.dataclass(frozen=True)
class RankManifest:
    """What one rank wrote for one step."""
    name: str
    world_size: int
    rank: int
    node: int
    step: int
    level: str
    ckpt_id: str
    created: float
    data_file: str
    data_size: int
    arrays: tuple
    epoch: int = 1            # the run lineage: a run that starts afresh writes a higher epoch
    placement: str = ""       # digest of the job's rank -> node map ("" in version 1 files)
    base: tuple = None        # (step, ckpt_id) of the full step an incremental redundancy refers to

    @property
    def key(self):
        """The order of checkpoints: newer epoch first, then newer step."""
        return order_key(self.epoch, self.step)

    def to_json(self):
        doc = {"format": FORMAT, "version": VERSION, "name": self.name, "world_size": self.world_size,
               "rank": self.rank, "node": self.node, "step": self.step, "epoch": self.epoch,
               "placement": self.placement,
               "level": self.level,
               "ckpt_id": self.ckpt_id, "created": self.created, "checksum_algorithm": ALGORITHM,
               "data_file": self.data_file, "data_size": self.data_size,
               "arrays": [a.to_json() for a in self.arrays]}
        if self.base is not None:    # optional (incremental redundancy): absent from full steps
            doc["base"] = {"step": self.base[0], "ckpt_id": self.base[1]}
        return sign(doc)

    def array(self, name):
        for a in self.arrays:
            if a.name == name:
                return a
        return None


def self_checksum(doc):
    """Checksum of a manifest document's canonical JSON, without its own ``manifest_checksum``."""
    body = {k: v for k, v in doc.items() if k != "manifest_checksum"}
    return digest(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def sign(doc):
    """Local: set ``doc["manifest_checksum"]`` (a damaged manifest is then detected, not
    mistaken for a checkpoint of other arrays); returns doc."""
    doc["manifest_checksum"] = self_checksum(doc)
    return doc


def check_array_name(name):
    """Raise ProtectError unless ``name`` is a safe array name (it becomes a dataset name)."""
    if not isinstance(name, str) or not ARRAY_NAME_RE.match(name):
        raise ProtectError(f"array name {name!r}: use 1-1024 letters, digits, '_', '.' or '-', "
                           "starting with a letter or '_'")


def check_dtype(dtype):
    """Raise ProtectError unless the dtype can be stored (plain numbers, bools, strings, times)."""
    if dtype.kind not in ALLOWED_DTYPE_KINDS or dtype.fields is not None or dtype.hasobject:
        raise ProtectError(f"dtype {dtype} cannot be checkpointed: only plain bool, integer, float, "
                           "complex, bytes/str and datetime dtypes (no object or structured dtypes)")
    if len(dtype.str) > MAX_DTYPE_TEXT:
        raise ProtectError(f"dtype {dtype.str!r} cannot be checkpointed: its name is longer than "
                           f"{MAX_DTYPE_TEXT} characters")


def is_plain_array(value):
    """Local: True for a plain ndarray or np.memmap, what is stored and read back as it is (a
    subclass such as a masked array or np.matrix would come back as something else)."""
    return type(value) is np.ndarray or isinstance(value, np.memmap)


def check_array(array):
    """Raise ProtectError unless ``array`` (an ndarray) can be stored and read back as it is: a
    plain ndarray (or np.memmap, ``is_plain_array``) of a storable dtype with at most MAX_DIMS
    dimensions."""
    if not is_plain_array(array):
        raise ProtectError(f"a {type(array).__name__} (a subclass of numpy.ndarray) cannot be checkpointed: it "
                           "would come back as a plain ndarray" + (" without its mask; pass its .data and "
                           ".mask as two arrays" if isinstance(array, np.ma.MaskedArray) else
                           "; pass np.asarray(value)"))
    check_dtype(array.dtype)
    if array.ndim > MAX_DIMS:
        raise ProtectError(f"an array of {array.ndim} dimensions cannot be checkpointed (at most {MAX_DIMS}, "
                           "as in HDF5)")


def check_header(doc, where, expected_format, max_version):
    """Local: a JSON object of ``expected_format``, a version this hpcckpt reads, our checksums."""
    if not isinstance(doc, dict):
        raise CorruptCheckpointError(f"{where}: not a JSON object")
    if doc.get("format") != expected_format:
        raise CorruptCheckpointError(f"{where}: format is {doc.get('format')!r}, expected {expected_format!r}")
    version = doc.get("version")
    if not _is_int(version) or version < 1:
        raise CorruptCheckpointError(f"{where}: bad version {version!r}")
    if version > max_version:
        raise IncompatibleCheckpointError(f"{where}: format version {version} is newer than this "
                                          f"hpcckpt understands ({max_version}); upgrade hpcckpt")
    if doc.get("checksum_algorithm") != ALGORITHM:
        raise CorruptCheckpointError(f"{where}: unknown checksum algorithm {doc.get('checksum_algorithm')!r}")


def parse(doc, where):
    """Validate a manifest document loaded from JSON; return a RankManifest."""
    def bad(msg):
        return CorruptCheckpointError(f"{where}: {msg}")

    check_header(doc, where, FORMAT, VERSION)
    if doc.get("manifest_checksum") != self_checksum(doc):
        raise bad("the manifest does not match its manifest_checksum (damaged)")
    ints = {}
    for key in ("world_size", "rank", "node", "step", "data_size"):
        v = doc.get(key)
        if not _is_int(v) or v < 0 or v > MAX_BYTES:
            raise bad(f"{key} must be a non-negative integer, got {v!r}")
        ints[key] = v
    epoch = doc.get("epoch", 1) if doc["version"] >= 2 else 1
    placement = doc.get("placement", "") if doc["version"] >= 2 else ""
    if not isinstance(placement, str) or (placement and not _HEX_RE.match(placement)):
        raise bad(f"bad placement {placement!r}")
    if not _is_int(epoch) or not 1 <= epoch <= MAX_STEP or ints["step"] > MAX_STEP:
        raise bad(f"bad epoch {epoch!r} or step {ints['step']!r}")
    if ints["world_size"] < 1 or ints["rank"] >= ints["world_size"]:
        raise bad(f"rank {ints['rank']} does not fit world size {ints['world_size']}")
    strs = {}
    for key in ("name", "level", "ckpt_id", "data_file"):
        v = doc.get(key)
        if not isinstance(v, str) or not v or len(v) > 256:
            raise bad(f"{key} must be a short non-empty string, got {v!r}")
        strs[key] = v
    if strs["data_file"] != data_file_name(ints["rank"]):
        raise bad(f"data_file {strs['data_file']!r} is not {data_file_name(ints['rank'])!r}")
    created = doc.get("created")
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not math.isfinite(created):
        raise bad(f"bad creation time {created!r}")
    arrays = doc.get("arrays")
    if not isinstance(arrays, list) or len(arrays) > 100000:
        raise bad("arrays must be a list")
    entries, names, end = [], set(), 0
    for i, a in enumerate(arrays):
        entry = _parse_array(a, f"{where}: arrays[{i}]", doc["version"])
        if entry.name in names:
            raise bad(f"array {entry.name!r} appears twice")
        if entry.offset < end:
            raise bad(f"array {entry.name!r} overlaps the previous one")
        end = entry.offset + entry.nbytes
        if end > ints["data_size"]:
            raise bad(f"array {entry.name!r} ends at byte {end}, past the data size {ints['data_size']}")
        names.add(entry.name)
        entries.append(entry)
    base = doc.get("base")
    if base is not None:
        if (not isinstance(base, dict) or not _is_int(base.get("step")) or not 0 <= base["step"] < ints["step"]
                or not isinstance(base.get("ckpt_id"), str) or not base["ckpt_id"] or len(base["ckpt_id"]) > 256):
            raise bad(f"bad base {base!r}")
        base = (base["step"], base["ckpt_id"])
    return RankManifest(name=strs["name"], world_size=ints["world_size"], rank=ints["rank"], node=ints["node"],
                        step=ints["step"], level=strs["level"], ckpt_id=strs["ckpt_id"], created=float(created),
                        data_file=strs["data_file"], data_size=ints["data_size"], arrays=tuple(entries),
                        epoch=epoch, placement=placement, base=base)


def _parse_array(a, where, version=VERSION):
    def bad(msg):
        return CorruptCheckpointError(f"{where}: {msg}")

    if not isinstance(a, dict):
        raise bad("not an object")
    name = a.get("name")
    if not isinstance(name, str) or not ARRAY_NAME_RE.match(name):
        raise bad(f"bad array name {name!r}")
    dtype_text = a.get("dtype")
    dtype = parse_dtype(dtype_text, bad)
    shape = _int_tuple(a.get("shape"), bad, "shape")
    count = 1
    for n in shape:
        count *= n
    if count * dtype.itemsize > MAX_BYTES:
        raise bad(f"shape {shape} is absurdly large")
    offset, nbytes = a.get("offset"), a.get("nbytes")
    if not _is_int(offset) or not 0 <= offset <= MAX_BYTES:
        raise bad(f"bad offset {offset!r}")
    if nbytes != count * dtype.itemsize:
        raise bad(f"nbytes {nbytes!r} does not match shape {shape} of {dtype_text}")
    checksum = a.get("checksum")
    if not isinstance(checksum, str) or not _HEX_RE.match(checksum):
        raise bad(f"bad checksum {checksum!r}")
    gshape = goffset = None
    if "global_shape" in a or "global_offset" in a:
        gshape = _int_tuple(a.get("global_shape"), bad, "global_shape")
        goffset = _int_tuple(a.get("global_offset"), bad, "global_offset")
        check_global_layout(shape, gshape, goffset, bad)
    layout = a.get("layout", "rank") if version >= 2 else ("block" if gshape is not None else "rank")
    if layout not in LAYOUTS or (layout == "block") != (gshape is not None) or (layout == "rows" and not shape):
        raise bad(f"bad layout {layout!r}")
    return ArrayEntry(name, dtype_text, shape, offset, nbytes, checksum, gshape, goffset, layout)


def parse_dtype(dtype_text, bad):
    """The NumPy dtype of a dtype string read from a file; ``bad(msg)`` makes the error to raise
    unless it is the canonical string of an allowed plain dtype."""
    if not isinstance(dtype_text, str) or len(dtype_text) > MAX_DTYPE_TEXT:
        raise bad(f"bad dtype {dtype_text!r}")
    try:
        dtype = np.dtype(dtype_text)
    except (TypeError, ValueError):
        raise bad(f"bad dtype {dtype_text!r}") from None
    if dtype.str != dtype_text or dtype.kind not in ALLOWED_DTYPE_KINDS or dtype.fields is not None:
        raise bad(f"dtype {dtype_text!r} is not allowed")
    return dtype


def check_global_layout(shape, global_shape, offset, make_error):
    """The local block of ``shape`` at ``offset`` must lie inside ``global_shape``."""
    if len(global_shape) != len(shape) or len(offset) != len(shape):
        raise make_error(f"global_shape {global_shape} and offset {offset} must have {len(shape)} "
                         f"dimensions like the local shape {shape}")
    for n, g, o in zip(shape, global_shape, offset):
        if o + n > g:
            raise make_error(f"the local block {shape} at offset {offset} does not fit in global_shape {global_shape}")


def _int_tuple(v, bad, what):
    if not isinstance(v, list) or len(v) > MAX_DIMS or not all(_is_int(n) and 0 <= n <= MAX_BYTES for n in v):
        raise bad(f"bad {what} {v!r}")
    return tuple(v)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def placement_digest(node_of):
    """The digest of a rank -> node map that manifests record: a restart with ranks on other
    nodes (another ranks_per_node, other hosts) is recognised, not mistaken for lost data."""
    return digest(",".join(map(str, node_of)).encode())


def foreign_reason(m, path, name, world_size, node, placement):
    """Local: why rank manifest ``m`` (read from ``path``) is not of this job's layout (job
    ``name``, ``world_size`` ranks, its rank on ``node``, the rank -> node map of digest
    ``placement``), or None when it is."""
    if m.name != name:
        return f"{path}: belongs to job {m.name!r}, not {name!r}"
    if m.world_size != world_size:
        return (f"{path}: step {m.step} was written by {m.world_size} ranks, this job has {world_size}; "
                "only the pfs level restarts on another rank count")
    if m.node != node or (m.placement and m.placement != placement):
        here = (f"rank {m.rank} was on node {m.node}, now node {node}" if m.node != node else
                f"rank {m.rank} is on node {node} in both, other ranks moved")
        return (f"{path}: step {m.step} was written with the ranks placed on other nodes ({here}): another "
                "ranks_per_node or other hosts")
    return None


def order_key(epoch, step):
    """One integer that orders checkpoints: by epoch, then by step (both <= MAX_STEP)."""
    return (int(epoch) << 40) | int(step)


def split_key(key):
    """(epoch, step) of an order_key."""
    return key >> 40, key & MAX_STEP


def step_dir_name(step):
    return f"step_{step:010d}"


def parse_step_dir_name(name):
    """The step number of a step directory's name (step_dir_name's: at least ten digits, more only
    for steps of 10**10 and over), or None for any other name."""
    digits = name[5:]
    if not name.startswith("step_") or not 10 <= len(digits) <= 13 or not digits.isascii() or not digits.isdigit():
        return None
    step = int(digits)
    return step if step <= MAX_STEP and step_dir_name(step) == name else None


def held_dir_name(rank):
    """The folder of a step directory where rank ``rank`` keeps what levels hold for others."""
    return f"held_{rank:06d}"


def parse_held_dir_name(name):
    """The rank of a held folder's name (held_dir_name's), or None for any other name."""
    digits = name[5:]
    if not name.startswith("held_") or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)


def data_file_name(rank):
    return f"rank_{rank:06d}.dat"


def manifest_file_name(rank):
    return f"rank_{rank:06d}.json"
