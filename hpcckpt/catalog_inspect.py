"""What ``hpcckpt inspect`` reads inside a rank part (local, no MPI): its state document (the
``__state__`` array, checked against its checksum) and a short description of each value."""
import os
import stat

from .catalog import why

MAX_STATE_DOCUMENT = 64 << 20           # a state document larger than this is not read by inspect



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
