"""Application state as codes hold it: state dicts, layouts, and their JSON document (local, pure).

``checkpoint(step, state)`` takes a dict and saves what it holds at the call:

- every NumPy array, at any depth, becomes an array of the checkpoint, named by its path of keys
  joined with ``"."`` (``{"p": {"pos": a}}`` -> ``"p.pos"``);
- everything else (Python ints of any size, floats bit for bit, bools, str, None, bytes, complex,
  NumPy scalars, and lists, tuples and dicts of them) goes into the **state document**: the dict's
  whole structure as JSON (keys in the dict's order), arrays referred to by name. Nothing is
  pickled. What would come back as another type (subclasses of those types, ndarray subclasses
  such as masked arrays) is refused with a ProtectError.

``restart(state)`` matches a saved document against the dict and plans every change before any is
made (``plan_restore``): an array of the same shape and dtype is filled in place (the same object),
any other array entry is replaced by a new array, other values are replaced, nested dicts are
updated in place. The keys must be the same at every depth; a difference is a MismatchError that
names the keys.

A **layout** says how a top-level name is spread over the ranks, for the ``pfs`` level's restarts
on another rank count (docs/PORTING.md): ``PER_RANK`` (the default: each rank its own value; a
restart needs the same rank count), ``Block(global_shape, offset)`` (this rank's block of a global
array), ``ROWS`` (the rows of a global array concatenated in rank order, any number of rows per
rank: particles; on another rank count each rank gets an even share, the leftover rows one
each to the lowest ranks, as ``np.array_split``), ``REPLICATED`` (the same
value on every rank: saved once, restored on every rank) and ``ROOT`` (held by rank 0 only).
"""
import dataclasses
import json
import re
import struct

import numpy as np

try:                                    # [low, high) of the addresses an array's elements occupy
    from numpy.lib.array_utils import byte_bounds       # NumPy 2
except ImportError:                     # pragma: no cover - NumPy 1.x
    byte_bounds = np.byte_bounds

from .errors import CorruptCheckpointError, MismatchError, ProtectError
from .manifest import check_array, check_dtype, is_plain_array

STATE_ENTRY = "__state__"            # the array of the checkpoint that holds the state document
STATE_PAD = 4096                      # the state document's bytes are padded to a multiple of this
FORMAT = "hpcckpt-state"
VERSION = 1
KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")     # top-level names of a state dict
PATH_KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")         # nested keys on the way to an array
MAX_DEPTH = 64
MAX_NAME = 1024
_INT_HEX_RE = re.compile(r"^-?[0-9a-f]+$")
KINDS = ("rank", "block", "rows", "replicated", "root")


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one top-level name is spread over the ranks (see the module docstring)."""
    kind: str = "rank"
    global_shape: tuple = None
    offset: tuple = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ProtectError(f"unknown layout {self.kind!r}; layouts are {', '.join(KINDS)}")

    @property
    def global_ok(self):
        """True when a pfs restart on another rank count can place this value."""
        return self.kind != "rank"

    def to_json(self):
        d = {"kind": self.kind}
        if self.kind == "block":
            d["global_shape"], d["offset"] = list(self.global_shape), list(self.offset)
        return d


PER_RANK = Layout("rank")
REPLICATED = Layout("replicated")
ROOT = Layout("root")
ROWS = Layout("rows")


def Block(global_shape, offset):   # noqa: N802 - reads like a type, as the layouts do
    """The layout of this rank's block of a global array: ``global_shape`` and its ``offset``."""
    return Layout("block", _int_tuple(global_shape, "global_shape"), _int_tuple(offset, "offset"))


def as_layout(value):
    """A Layout from a Layout or one of the names "rank", "rows", "replicated", "root"."""
    if isinstance(value, Layout):
        return value
    if isinstance(value, str) and value in KINDS and value != "block":
        return Layout(value)
    raise ProtectError(f"layout must be hpcckpt.PER_RANK, ROWS, REPLICATED, ROOT, Block(global_shape, offset) "
                       f"or one of 'rank', 'rows', 'replicated', 'root'; got {value!r}")


def _int_tuple(value, what):
    try:
        t = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ProtectError(f"{what} must be a sequence of integers, got {value!r}") from None
    if any(v < 0 for v in t):
        raise ProtectError(f"{what} must not be negative, got {value!r}")
    return t


# ---------------------------------------------------------------------- saving
@dataclasses.dataclass
class Flat:
    """A state dict taken apart: its arrays (name, C-contiguous array, top-level key) and its
    document (None when there was no state dict)."""
    arrays: list
    document: dict


def flatten(state):
    """Local: take a state dict apart (see the module docstring); ProtectError on what cannot be
    saved, naming its path. Arrays are not copied unless they are not C-contiguous."""
    if not isinstance(state, dict):
        raise ProtectError(f"state must be a dict, got {type(state).__name__}")
    arrays, items = [], {}
    for key, value in state.items():
        if not isinstance(key, str) or not KEY_RE.match(key):
            raise ProtectError(f"state key {key!r}: use 1-128 letters, digits, '_' or '-', starting with a "
                               "letter or '_' (it names the value in the checkpoint)")
        if key == STATE_ENTRY:
            raise ProtectError(f"state key {key!r} is reserved by hpcckpt")
        items[key] = _encode(value, key, key, arrays, 0)
    return Flat(arrays, {"format": FORMAT, "version": VERSION, "items": items})


# Python types saved as they are; a subclass of one (an IntEnum, a namedtuple, an OrderedDict)
# would come back as the base type, so it is refused instead.
_BASE_TYPES = (bool, int, float, complex, str, bytes, list, tuple, dict)
BIG_INT_BITS = 4096       # larger ints are stored in hex (JSON decimals stop at 4300 digits in Python)


def _encode(v, path, top, arrays, depth):
    if depth > MAX_DEPTH:
        raise ProtectError(f"state[{path!r}]: nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, np.ndarray):
        if path is None:
            raise ProtectError(f"state: an array inside a list or tuple cannot be checkpointed (found under "
                               f"{top!r}); put arrays in dicts")
        if len(path) > MAX_NAME:
            raise ProtectError(f"state[{path!r}]: the key path is longer than {MAX_NAME} characters")
        try:
            check_array(v)
        except ProtectError as e:
            raise ProtectError(f"state[{path!r}]: {e}") from None
        arrays.append((path, v if v.flags.c_contiguous else np.ascontiguousarray(v), top))
        return {"$array": path}
    if isinstance(v, np.generic):           # before str and float: np.str_ and np.float64 subclass them
        try:
            check_dtype(v.dtype)
        except ProtectError as e:
            raise ProtectError(f"state[{path or top!r}]: {e}") from None
        raw = value_bytes(np.asarray(v)).tobytes() if v.dtype.itemsize else b""   # np.str_("").tobytes() is not empty
        return {"$scalar": [v.dtype.str, raw.hex()]}
    kind = type(v)
    if v is None or kind in (bool, str):
        return v
    if kind is int:
        return v if v.bit_length() <= BIG_INT_BITS else {"$int": format(v, "x")}
    if kind is float:
        return {"$float": _float_hex(v)}
    if kind is complex:
        return {"$complex": [_float_hex(v.real), _float_hex(v.imag)]}
    if kind is bytes:
        return {"$bytes": v.hex()}
    if kind in (list, tuple):
        enc = [_encode(x, None, top, arrays, depth + 1) for x in v]
        return enc if kind is list else {"$tuple": enc}
    if kind is dict:
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise ProtectError(f"state[{path or top!r}]: dict keys must be str, got {k!r}")
            sub = None
            if path is not None and PATH_KEY_RE.match(k):
                sub = f"{path}.{k}"
            elif path is not None and _holds_array(x):
                raise ProtectError(f"state[{path!r}]: key {k!r} leads to an array, so it must be 1-128 letters, "
                                   "digits, '_' or '-'")
            out[k] = _encode(x, sub, top, arrays, depth + 1)
        return {"$dict": out}
    base = next((b for b in _BASE_TYPES if isinstance(v, b)), None)
    if base is not None:
        raise ProtectError(f"state[{path or top!r}]: {kind.__name__} is a subclass of {base.__name__} and would "
                           f"come back as a plain {base.__name__}; pass {base.__name__}(value)")
    raise ProtectError(f"state[{path or top!r}]: a {kind.__name__} cannot be checkpointed; use NumPy "
                       "arrays, numbers, str, bool, None, bytes, and lists/tuples/dicts of them")


def overlapping(state, names):
    """Local: the ``names`` (protected arrays) that a state dict also holds, at the same path of
    keys (``"a"``, or ``"n.x"`` for ``state["n"]["x"]``)."""
    found = []
    for name in names:
        d = state
        for part in name.split("."):
            if not isinstance(d, dict) or part not in d:
                break
            d = d[part]
        else:
            found.append(name)
    return found


def _holds_array(v):
    if isinstance(v, np.ndarray):
        return True
    if isinstance(v, dict):
        return any(_holds_array(x) for x in v.values())
    return False


def _float_hex(x):
    return struct.pack(">d", x).hex()


def document_bytes(document):
    """The state document as the bytes stored in the checkpoint (canonical JSON)."""
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def document_array(document):
    """The state document as the uint8 array stored in the checkpoint: UTF-8 JSON bytes, padded
    with spaces (JSON allows trailing whitespace) to a multiple of STATE_PAD bytes, so that a value
    whose encoding changes length by a few bytes (a generator's state) leaves the data file's size
    as it was and an incremental checkpoint stays incremental. In an HDF5 file
    ``bytes(f["rank_000000/__state__"][()]).decode()`` reads it back."""
    data = document_bytes(document)
    return np.frombuffer(data + b" " * (-len(data) % STATE_PAD), np.uint8)


def parse_document(data, where):
    """Local: validate the bytes of a state document; CorruptCheckpointError when it is not one."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"{where}: the state document is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("items"), dict):
        raise CorruptCheckpointError(f"{where}: not an hpcckpt state document")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise CorruptCheckpointError(f"{where}: state document version {doc.get('version')!r} is not one this "
                                     f"hpcckpt reads ({VERSION})")
    layouts = doc.setdefault("layouts", {})
    if not isinstance(layouts, dict) or not all(
            isinstance(v, dict) and v.get("kind") in KINDS and k in doc["items"] for k, v in layouts.items()):
        raise CorruptCheckpointError(f"{where}: the layouts of the state document are damaged")
    for key, enc in doc["items"].items():
        if not KEY_RE.match(key):
            raise CorruptCheckpointError(f"{where}: bad state key {key!r}")
        try:
            _check_encoded(enc, 0)
        except (ValueError, TypeError, RecursionError, ProtectError) as e:
            raise CorruptCheckpointError(f"{where}: state[{key!r}] is damaged ({e})") from None
    return doc


def _check_encoded(enc, depth):
    if depth > MAX_DEPTH + 1:
        raise ValueError("nested too deep")
    if enc is None or isinstance(enc, (bool, str, int)):
        return
    if isinstance(enc, list):
        for x in enc:
            _check_encoded(x, depth + 1)
        return
    if not isinstance(enc, dict) or len(enc) != 1:
        raise ValueError(f"unexpected {type(enc).__name__}")
    (tag, body), = enc.items()
    if tag == "$array":
        if not isinstance(body, str) or not body or len(body) > MAX_NAME:
            raise ValueError("bad array reference")
    elif tag == "$int":
        if not isinstance(body, str) or not _INT_HEX_RE.match(body):
            raise ValueError("bad int")
    elif tag in ("$float", "$bytes"):
        _hex(body, 16 if tag == "$float" else None)
    elif tag == "$complex":
        if not isinstance(body, list) or len(body) != 2:
            raise ValueError("bad complex")
        for h in body:
            _hex(h, 16)
    elif tag == "$scalar":
        if not isinstance(body, list) or len(body) != 2 or not isinstance(body[0], str):
            raise ValueError("bad scalar")
        dtype = np.dtype(body[0])
        check_dtype(dtype)
        if len(_hex(body[1], None)) != dtype.itemsize:
            raise ValueError("scalar size does not match its dtype")
    elif tag == "$tuple":
        if not isinstance(body, list):
            raise ValueError("bad tuple")
        for x in body:
            _check_encoded(x, depth + 1)
    elif tag == "$dict":
        if not isinstance(body, dict):
            raise ValueError("bad dict")
        for x in body.values():
            _check_encoded(x, depth + 1)
    else:
        raise ValueError(f"unknown tag {tag!r}")


def _hex(text, length):
    if not isinstance(text, str) or (length is not None and len(text) != length):
        raise ValueError("bad hex value")
    return bytes.fromhex(text)


def decode(enc, arrays):
    """Local: the Python value of an encoded item; ``arrays`` maps array names to arrays."""
    if enc is None or isinstance(enc, (bool, str, int)):
        return enc
    if isinstance(enc, list):
        return [decode(x, arrays) for x in enc]
    (tag, body), = enc.items()
    if tag == "$array":
        return arrays[body]
    if tag == "$int":
        return int(body, 16)
    if tag == "$float":
        return struct.unpack(">d", bytes.fromhex(body))[0]
    if tag == "$complex":
        return complex(*(struct.unpack(">d", bytes.fromhex(h))[0] for h in body))
    if tag == "$bytes":
        return bytes.fromhex(body)
    if tag == "$scalar":
        return _scalar(np.dtype(body[0]), bytes.fromhex(body[1]))
    if tag == "$tuple":
        return tuple(decode(x, arrays) for x in body)
    return {k: decode(x, arrays) for k, x in body.items()}


def _scalar(dtype, raw):
    """The NumPy scalar of ``dtype`` whose bytes are ``raw``. np.bytes_ and np.str_ are made from
    their bytes directly: an array's item would drop trailing NULs."""
    if dtype.kind == "S":
        return np.bytes_(raw)
    if dtype.kind == "U":
        return np.str_(raw.decode("utf-32-be" if dtype.str[0] == ">" else "utf-32-le", "surrogatepass"))
    return np.frombuffer(raw, dtype)[0]


def array_refs(enc):
    """The names of the arrays an encoded item refers to."""
    if isinstance(enc, list):
        return [n for x in enc for n in array_refs(x)]
    if not isinstance(enc, dict):
        return []
    (tag, body), = enc.items()
    if tag == "$array":
        return [body]
    if tag in ("$tuple",):
        return [n for x in body for n in array_refs(x)]
    if tag == "$dict":
        return [n for x in body.values() for n in array_refs(x)]
    return []


# ---------------------------------------------------------------------- restoring
@dataclasses.dataclass
class Plan:
    """What restart() will do to one rank's state dict, decided before anything is touched.

    ``reads``: (array name, target ndarray) — targets are the state's own arrays (filled in place)
    or new arrays; ``apply()`` then puts the new values into the dicts."""
    reads: list
    _assign: list

    def apply(self):
        for fn in self._assign:
            fn()


def plan_restore(state, items, shapes, where):
    """Local: plan restoring ``items`` ({key: encoded value}) into the dict ``state``.

    ``shapes`` maps every array name of the checkpoint to (shape tuple, dtype str). MismatchError
    naming the keys when the state and the checkpoint hold different keys."""
    if not isinstance(state, dict):
        raise MismatchError(f"{where}: state must be a dict, got {type(state).__name__}")
    reads, assign = [], []
    _plan_dict(state, items, shapes, reads, assign, "", where)
    _refuse_shared_targets(reads, where)
    return Plan(reads, assign)


def _overlap(x, y):
    try:
        return np.shares_memory(x, y, max_work=1000)
    except np.exceptions.TooHardError:      # strided views too intricate to decide: accepted
        return False


def _refuse_shared_targets(reads, where):
    """ProtectError when two values would be read into the same memory (restart({"u": t,
    "u_old": t})): the second would overwrite the first. The arrays are swept in address order:
    only those whose address ranges meet are compared (not every pair)."""
    targets = sorted(((byte_bounds(arr), name, arr) for name, arr in reads if arr.size), key=lambda t: t[0])
    reaching = []        # (end, name, array) of the arrays so far whose range goes on past the current start
    for (low, high), b, y in targets:
        reaching = [t for t in reaching if t[0] > low]
        for _, a, x in reaching:
            if _overlap(x, y):
                raise ProtectError(f"{where}: state[{a!r}] and state[{b!r}] share memory: each value needs a "
                                   "buffer of its own (the second would overwrite the first)")
        reaching.append((high, b, y))


def _plan_dict(target, items, shapes, reads, assign, prefix, where):
    missing = sorted(set(items) - set(target))
    extra = sorted(set(target) - set(items))
    if missing or extra:
        hint = (" (a dict whose keys change from run to run, such as a growing history, can be given as None: it "
                "is replaced)") if prefix and missing else ""
        raise key_mismatch(where, missing and f"the checkpoint has {[prefix + k for k in missing]} which the state "
                           f"lacks{hint}",
                           extra and f"the state has {[prefix + k for k in extra]} which the checkpoint lacks")
    for key, enc in items.items():
        current = target[key]
        if isinstance(enc, dict) and "$dict" in enc and isinstance(current, dict):
            _plan_dict(current, enc["$dict"], shapes, reads, assign, f"{prefix}{key}.", where)
            continue
        if isinstance(enc, dict) and "$array" in enc:
            name = enc["$array"]
            shape, dtype = shapes[name]
            if is_plain_array(current) and current.shape == shape and current.dtype.str == dtype \
                    and current.flags.writeable:
                reads.append((name, current))           # filled in place: the same object
                continue
            new = np.empty(shape, np.dtype(dtype))
            reads.append((name, new))
            assign.append(_setter(target, key, new))
            continue
        new_arrays = {}
        for name in array_refs(enc):
            shape, dtype = shapes[name]
            new_arrays[name] = np.empty(shape, np.dtype(dtype))
            reads.append((name, new_arrays[name]))
        assign.append(_deferred_setter(target, key, enc, new_arrays))


def _float_size(dtype):
    """Bytes of one float of ``dtype`` (half of a complex)."""
    return dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize


def has_padding(dtype):
    """Local: True for x87 extended precision (np.longdouble / np.clongdouble on x86: 80
    significant bits in a 12- or 16-byte slot, the other bytes whatever was in memory)."""
    return dtype.kind in "fc" and _float_size(dtype) in (12, 16) and np.finfo(dtype).nmant == 63


def value_bytes(array):
    """Local: the bytes of ``array``'s values as a uint8 array: its own bytes (a view when it is
    contiguous), or, for a dtype with padding (has_padding), a copy with the padding zeroed, so
    that equal values have equal bytes."""
    dt = array.dtype
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if not has_padding(dt):
        return raw
    part = _float_size(dt)
    slots = raw.reshape(-1, part).copy()
    if dt.byteorder == ">":
        slots[:, :part - 10] = 0
    else:
        slots[:, 10:] = 0
    return slots.reshape(-1)


def key_mismatch(where, *parts):
    """The MismatchError for keys (or names) that one side has and the other lacks: ``parts``
    are the sentences that apply (empty ones are left out)."""
    return MismatchError(f"{where}: " + " and ".join(p for p in parts if p))


def _setter(target, key, value):
    def run():
        target[key] = value
    return run


def _deferred_setter(target, key, enc, arrays):
    def run():
        target[key] = decode(enc, arrays)   # after the reads: the arrays hold their data
    return run
