"""Checking the HDF5 files of a pfs step before trusting them (local, no MPI): damaged HDF5
metadata can crash libhdf5 itself, so every file is checked against the index before HDF5 opens
it (its size, the checksum of the master's bytes and of each node file's metadata), then its
attributes, links and datasets against the index; blocks are read and hashed through
``BlockReader``. Used by the pfs level's restore and verify (levels/pfs.py) and by
``hpcckpt verify`` (``verify_step``). The files' layout is levels/pfs_files.py.
"""
import os
import stat

import numpy as np

from .. import storage
from ..codecs.checksum import ALGORITHM, digest, new_hasher
from ..errors import CorruptCheckpointError, IncompatibleCheckpointError
from . import hdf5_layout as lay
from .pfs_files import FORMAT, NODE_FORMAT, extents_digest, file_digest, to_str
from .pfs_index import MASTER, MARKER, SHARED_LAYOUTS, VERSION, read_index


def open_node(step_dir, index, node, cache):
    """Validate node file ``node`` once (cached in ``cache``); return (path, {(rank, name):
    (offset, nbytes)})."""
    if node in cache:
        return cache[node]
    import h5py
    from h5py import h5d
    name = lay.node_file(node)
    path = os.path.join(step_dir, name)
    st = regular_file(path)
    if st.st_size != index.files.get(name):
        raise CorruptCheckpointError(f"{path}: size {st.st_size} bytes, the index says {index.files.get(name)} "
                                     f"({'truncated' if st.st_size < (index.files.get(name) or 0) else 'changed'})")
    meta = index.node_metadata.get(name)
    if meta is not None and extents_digest(path, meta[0]) != meta[1]:
        raise CorruptCheckpointError(f"{path}: its HDF5 metadata (the bytes outside the arrays' data) does not "
                                     "match the checksum in the index: damaged")
    where = {}
    try:
        with h5py.File(path, "r", locking=False) as f:
            check_root_attrs(f, index, NODE_FORMAT, path)
            if attr_int(f, "node", path) != node:
                raise CorruptCheckpointError(f"{path}: belongs to node {f.attrs.get('node')!r}")
            for r in (q for q, n in enumerate(index.node_of) if n == node):
                for e in index.arrays:
                    b = e.blocks[r]
                    if b is None:
                        continue
                    key = f"{lay.rank_group(r)}/{e.name}"
                    ds = f.get(key, getlink=True)
                    if not isinstance(ds, h5py.HardLink):
                        raise CorruptCheckpointError(f"{path}: {key} is missing or not a plain dataset")
                    ds = f[key]
                    if not isinstance(ds, h5py.Dataset) or ds.shape != b.shape or ds.dtype != np.dtype(e.dtype):
                        raise CorruptCheckpointError(f"{path}: {key} is not a {b.shape} {e.dtype} dataset")
                    if ds.id.get_create_plist().get_layout() != h5d.CONTIGUOUS:
                        raise CorruptCheckpointError(f"{path}: {key} is not stored contiguously")
                    if attr_str(ds, "checksum", path) != b.checksum:
                        raise CorruptCheckpointError(f"{path}: {key} has checksum attribute "
                                                     f"{ds.attrs.get('checksum')!r}, the index says {b.checksum}")
                    nbytes = e.nbytes(r)
                    off = ds.id.get_offset()
                    if nbytes and (off is None or off < 0 or off + nbytes > st.st_size):
                        raise CorruptCheckpointError(f"{path}: {key} lies outside the file")
                    where[(r, e.name)] = (off or 0, nbytes)
    except CorruptCheckpointError:
        raise
    except Exception as e:   # noqa: BLE001 - anything HDF5 says about a damaged file
        raise CorruptCheckpointError(f"{path}: cannot be read as a node file ({type(e).__name__}: {e})") from None
    cache[node] = (path, where)
    return cache[node]


class BlockReader:
    """Reads (and hashes) blocks of one pfs step from its node files (local)."""

    def __init__(self, step_dir, index, chunk):
        self.step_dir, self.index, self.chunk = step_dir, index, chunk
        self._nodes, self._fds = {}, {}
        self._buf = np.empty(chunk, np.uint8)

    def open(self, node):
        """(path, {(rank, name): (offset, nbytes)}) of node file ``node``, validated once."""
        return open_node(self.step_dir, self.index, node, self._nodes)

    def source(self, rank, name):
        """(fd, path, file offset, nbytes) of rank ``rank``'s block of array ``name``."""
        path, where = self.open(self.index.node_of[rank])
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        off, nbytes = where[(rank, name)]
        return self._fds[path], path, off, nbytes

    def verify(self, i, rank):
        """CorruptCheckpointError unless rank ``rank``'s block of array ``i`` matches its checksum."""
        e = self.index.arrays[i]
        fd, path, off, nbytes = self.source(rank, e.name)
        hasher = new_hasher()
        for start in range(0, nbytes, self._buf.nbytes):
            piece = self._buf[:min(self._buf.nbytes, nbytes - start)]
            storage.pread_into(fd, piece, off + start, path)
            hasher.update(piece)
        if hasher.hexdigest() != e.blocks[rank].checksum:
            raise CorruptCheckpointError(f"{path}: array {e.name!r} of rank {rank} fails its checksum "
                                         f"({hasher.hexdigest()} != {e.blocks[rank].checksum})")

    def read_verified(self, i, rank):
        """The bytes of one (small) block, checked against its checksum."""
        e = self.index.arrays[i]
        fd, path, off, nbytes = self.source(rank, e.name)
        out = np.empty(nbytes, np.uint8)
        storage.pread_into(fd, out, off, path)
        if digest(out) != e.blocks[rank].checksum:
            raise CorruptCheckpointError(f"{path}: array {e.name!r} of rank {rank} fails its checksum")
        return out

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def check_master(step_dir, index):
    """The master file matches the index and points only at node files of the step."""
    import h5py
    path = os.path.join(step_dir, MASTER)
    regular_file(path)
    # damaged HDF5 metadata can crash libhdf5 itself: check the bytes before HDF5 reads them
    if file_digest(path) != index.master_checksum:
        raise CorruptCheckpointError(f"{path}: does not match its checksum in {MARKER}")
    try:
        with h5py.File(path, "r", locking=False) as f:
            check_root_attrs(f, index, FORMAT, path)
            for r in range(index.world_size):
                link = f.get(lay.rank_group(r), getlink=True)
                if not isinstance(link, h5py.ExternalLink):
                    raise CorruptCheckpointError(f"{path}: /{lay.rank_group(r)} is not an external link")
                check_link(link, lay.node_file(index.node_of[r]), "/" + lay.rank_group(r), path)
            for e in index.arrays:
                if e.global_shape is None and e.layout not in SHARED_LAYOUTS:
                    continue
                link = f.get(e.name, getlink=True)
                if isinstance(link, h5py.ExternalLink):
                    r = next(r for r, b in enumerate(e.blocks) if b is not None and
                             (e.layout in SHARED_LAYOUTS or lay.volume(b.shape) > 0))
                    check_link(link, lay.node_file(index.node_of[r]), f"/{lay.rank_group(r)}/{e.name}", path)
                    continue
                ds = f[e.name] if isinstance(link, h5py.HardLink) else None
                if not isinstance(ds, h5py.Dataset) or ds.shape != e.global_shape or \
                        ds.dtype != np.dtype(e.dtype):
                    raise CorruptCheckpointError(f"{path}: /{e.name} is not a {e.global_shape} {e.dtype} dataset")
                checks = [to_str(c) for c in ds.attrs.get("block_checksums", [])]
                if checks != [b.checksum for b in e.blocks]:
                    raise CorruptCheckpointError(f"{path}: /{e.name} block checksums differ from the index")
                if ds.is_virtual:
                    for m in ds.virtual_sources():
                        try:
                            lay.check_safe_source(m.file_name)
                        except ValueError as err:
                            raise CorruptCheckpointError(f"{path}: /{e.name}: {err}") from None
                        if not m.dset_name.startswith("/rank_") or not m.dset_name.endswith("/" + e.name):
                            raise CorruptCheckpointError(f"{path}: /{e.name} maps {m.dset_name!r}")
    except CorruptCheckpointError:
        raise
    except Exception as e:   # noqa: BLE001
        raise CorruptCheckpointError(f"{path}: cannot be read as a master file ({type(e).__name__}: {e})") from None


def verify_step(step_dir, name=None, chunk=1 << 20, max_bytes=None):
    """Local: re-check everything of one committed pfs step (index, master, every block of every
    node file). Returns (index or None, [problem, ...]): one problem per damaged part."""
    try:
        index = read_index(step_dir, name, max_bytes)
    except (CorruptCheckpointError, IncompatibleCheckpointError) as e:
        return None, [str(e)]
    problems = []
    try:
        check_master(step_dir, index)
    except CorruptCheckpointError as e:
        problems.append(str(e))
    reader = BlockReader(step_dir, index, chunk)
    bad_nodes = set()
    try:
        for node in sorted(set(index.node_of)):       # a node file that cannot be used: said once
            try:
                reader.open(node)
            except CorruptCheckpointError as err:
                problems.append(str(err))
                bad_nodes.add(node)
        for i, e in enumerate(index.arrays):
            for r in e.holders():
                if index.node_of[r] not in bad_nodes:
                    try:
                        reader.verify(i, r)
                    except CorruptCheckpointError as err:
                        problems.append(str(err))
    finally:
        reader.close()
    return index, problems


def attr_str(obj, key, path):
    v = to_str(obj.attrs.get(key))
    if v is None:
        raise CorruptCheckpointError(f"{path}: attribute {key!r} is missing or not a string")
    return v


def attr_int(obj, key, path):
    v = obj.attrs.get(key)
    if isinstance(v, np.ndarray) and v.shape == ():
        v = v[()]
    if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
        raise CorruptCheckpointError(f"{path}: attribute {key!r} is missing or not an integer ({v!r})")
    return int(v)


def check_root_attrs(f, index, fmt, path):
    if attr_str(f, "format", path) != fmt:
        raise CorruptCheckpointError(f"{path}: format {f.attrs.get('format')!r}, expected {fmt!r}")
    version = attr_int(f, "version", path)
    if version > VERSION:
        raise IncompatibleCheckpointError(f"{path}: format version {version} is newer than this hpcckpt ({VERSION})")
    for key, want in (("step", index.step), ("world_size", index.world_size)):
        if attr_int(f, key, path) != want:
            raise CorruptCheckpointError(f"{path}: attribute {key} is {f.attrs.get(key)!r}, the index says {want}")
    for key, want in (("name", index.name), ("ckpt_id", index.ckpt_id), ("checksum_algorithm", ALGORITHM)):
        if attr_str(f, key, path) != want:
            raise CorruptCheckpointError(f"{path}: attribute {key} is {f.attrs.get(key)!r}, the index says {want!r}")


def regular_file(path):
    """lstat of ``path``; CorruptCheckpointError unless it is a regular file (no links)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path}: missing") from None
    except OSError as e:
        raise CorruptCheckpointError(f"{path}: cannot be examined ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise CorruptCheckpointError(f"{path}: not a regular file")
    return st


def check_link(link, want_file, want_path, path):
    try:
        lay.check_safe_source(link.filename)
    except ValueError as err:
        raise CorruptCheckpointError(f"{path}: {err}") from None
    if link.filename != want_file or link.path != want_path:
        raise CorruptCheckpointError(f"{path}: link to {link.filename}:{link.path}, expected {want_file}:{want_path}")

