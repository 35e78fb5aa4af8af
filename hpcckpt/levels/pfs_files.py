"""Laying out the HDF5 files of a pfs step (local, no MPI), and the checksums of their bytes that the
index keeps. Used by the pfs level's protocol (levels/pfs.py); checking the files before they are
trusted is levels/pfs_check.py.

``node_<n>.h5``: one group ``/rank_<R>`` per rank of node n, one contiguous, pre-allocated
dataset per array that rank holds (its bytes are written with pwrite at the dataset's offset).
``checkpoint.h5``: the master — ``/rank_<R>`` external links to every rank's group, each global
array (block and rows layouts) as a virtual dataset over the ranks' blocks, each replicated or
root array as a link to rank 0's dataset. Damaged HDF5 metadata can crash libhdf5 itself, so
the index keeps the size of every file, the checksum of the master's bytes and of each node
file's metadata (its bytes outside the datasets' data: metadata_extents, extents_digest).
"""
import os

import numpy as np

from .. import storage
from ..codecs.checksum import ALGORITHM, digest, new_hasher
from ..errors import CheckpointWriteError, CorruptCheckpointError
from . import hdf5_layout as lay
from .pfs_index import SHARED_LAYOUTS, VERSION

NODE_FORMAT = "hpcckpt-pfs-node"
FORMAT = "hpcckpt-pfs"
LIBVER = ("earliest", "v110")          # readable by HDF5 1.10 tools (h5dump of Debian 12)


# ---------------------------------------------------------------------- writing
def create_node_file(path, index, node, node_ranks, file_mode):
    """The node file with contiguous pre-allocated datasets and attributes; returns
    {(rank, array name): file offset of the dataset's bytes}."""
    import h5py
    from h5py import h5d, h5p, h5s
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, file_mode)
    os.close(fd)
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_layout(h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
    dcpl.set_obj_track_times(False)
    offsets = {}
    with h5py.File(path, "w", libver=LIBVER, locking=False, alignment_threshold=storage.PAGE_ALIGN_MIN,
                   alignment_interval=storage.DIRECT_ALIGN) as f:     # large datasets start on a 4 KiB boundary
        root_attrs(f, index, NODE_FORMAT)
        f.attrs["node"] = np.int64(node)
        f.attrs["ranks"] = np.asarray(node_ranks, np.int64)
        types = {e.name: h5_type(np.dtype(e.dtype)) for e in index.arrays}
        for r in node_ranks:
            g = f.create_group(lay.rank_group(r))
            g.attrs["rank"] = np.int64(r)
            for e in index.arrays:
                b = e.blocks[r]
                if b is None:
                    continue
                space = h5s.create(h5s.SCALAR) if b.shape == () else h5s.create_simple(b.shape)
                dsid = h5d.create(g.id, e.name.encode(), types[e.name], space, dcpl=dcpl)
                _dataset_attrs(g[e.name], e, b)
                off = dsid.get_offset()
                if off is None and e.nbytes(r) > 0:
                    raise CheckpointWriteError(f"{path}: HDF5 did not allocate {e.name!r} of rank {r}")
                offsets[(r, e.name)] = off
    return offsets


def _dataset_attrs(ds, e, b):
    """The attributes of rank block ``b`` of index entry ``e`` on dataset ``ds``."""
    ds.attrs["checksum"] = b.checksum if b.checksum is not None else ""   # set_checksums fills it
    ds.attrs["layout"] = e.layout
    for key, value in (("global_shape", e.global_shape), ("global_offset", b.offset)):
        if e.global_shape is not None:
            ds.attrs[key] = np.asarray(value, np.int64)
        elif key in ds.attrs:
            del ds.attrs[key]


def reuse_node_file(path, index, node, node_ranks):
    """A retired node file (a ``reuse_files`` spare, moved to ``path``) made the node file of
    ``index`` when its datasets are exactly the ones needed (groups, names, shapes, types,
    contiguous and allocated): its attributes are rewritten for the new step and the
    {(rank, array name): file offset} returned, as create_node_file does; the bytes are then
    overwritten in place (no block allocation). None when its layout is another one (the file
    is left as it is: relayout_node_file) or it cannot be read (the file is removed)."""
    import h5py
    from h5py import h5d
    offsets = {}
    try:
        with h5py.File(path, "r+", locking=False) as f:
            want = {lay.rank_group(r).lstrip("/") for r in node_ranks}
            if set(f.keys()) != want or to_str(f.attrs.get("format", "")) != NODE_FORMAT:
                raise _NotReusable()
            for r in node_ranks:
                g = f[lay.rank_group(r)]
                blocks = {e.name: (e, e.blocks[r]) for e in index.arrays if e.blocks[r] is not None}
                if set(g.keys()) != set(blocks):
                    raise _NotReusable()
                for name, (e, b) in blocks.items():
                    ds = g[name]
                    dsid = ds.id
                    if not isinstance(ds, h5py.Dataset) or ds.shape != tuple(b.shape) \
                            or dsid.get_type() != h5_type(np.dtype(e.dtype)) \
                            or dsid.get_create_plist().get_layout() != h5d.CONTIGUOUS:
                        raise _NotReusable()
                    off = dsid.get_offset()
                    if off is None and e.nbytes(r) > 0:
                        raise _NotReusable()
                    offsets[(r, name)] = off
            root_attrs(f, index, NODE_FORMAT)
            f.attrs["node"] = np.int64(node)
            for r in node_ranks:
                g = f[lay.rank_group(r)]
                for e in index.arrays:
                    if e.blocks[r] is not None:
                        _dataset_attrs(g[e.name], e, e.blocks[r])
        return offsets
    except _NotReusable:
        return None
    except (OSError, KeyError, ValueError, TypeError):
        storage.remove_file(path)
        return None


class _NotReusable(Exception):
    """reuse_node_file: the spare's layout is not the one needed."""


def relayout_node_file(path, index, node, node_ranks, file_mode):
    """A retired node file of another layout (a ``reuse_files`` spare moved to ``path``: arrays
    that grew, shrank, came or went) made the node file of ``index``: create_node_file makes that
    file beside it (its datasets allocated but not written: sparse), its bytes outside the
    datasets — HDF5's metadata, zeros in the gaps — are written over the spare's at the same
    offsets, the spare is cut to its size and the fresh file removed. Once the datasets' bytes
    are written the spare is that file byte for byte, on blocks it already had (overwritten, not
    allocated anew). Returns create_node_file's offsets, or None (``path`` removed) when that
    fails."""
    fresh = path + ".layout"
    try:
        offsets = create_node_file(fresh, index, node, node_ranks, file_mode)
        size = os.path.getsize(fresh)
        extents = metadata_extents(size, [(off, index.entry(name).nbytes(r)) for (r, name), off in offsets.items()
                                          if off is not None])
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            with open(fresh, "rb") as src:
                for start, length in extents:
                    src.seek(start)
                    storage.pwrite_all(fd, np.frombuffer(src.read(length), np.uint8), start)
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        return offsets
    except (OSError, CheckpointWriteError):
        storage.remove_file(path)
        return None
    finally:
        storage.remove_file(fresh)


def set_checksums(path, checksums):
    """The checksum attributes of a node file laid out before its data was hashed:
    ``checksums`` is {rank: {array name: checksum}}."""
    import h5py
    with h5py.File(path, "r+", locking=False) as f:
        for r, sums in checksums.items():
            g = f[lay.rank_group(r)]
            for name, checksum in sums.items():
                g[name].attrs["checksum"] = checksum


def write_master(path, index, file_mode):
    """The master file: rank links, global arrays as virtual datasets, shared arrays as links."""
    import h5py
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, file_mode)
    os.close(fd)
    with h5py.File(path, "w", libver=LIBVER, locking=False) as f:
        root_attrs(f, index, FORMAT)
        f.attrs["nnodes"] = np.int64(max(index.node_of) + 1)
        f.attrs["node_of"] = np.asarray(index.node_of, np.int64)
        f.attrs["arrays"] = [e.name for e in index.arrays]
        for r in range(index.world_size):
            f[lay.rank_group(r)] = h5py.ExternalLink(lay.node_file(index.node_of[r]), "/" + lay.rank_group(r))
        for e in index.arrays:
            if e.layout in SHARED_LAYOUTS:
                f[e.name] = h5py.ExternalLink(lay.node_file(index.node_of[0]), f"/{lay.rank_group(0)}/{e.name}")
                continue
            if e.global_shape is None:
                continue
            dtype = h5_dtype(np.dtype(e.dtype))
            owners = [r for r, b in enumerate(e.blocks) if lay.volume(b.shape) > 0]
            if e.global_shape == ():
                r = owners[0]
                f[e.name] = h5py.ExternalLink(lay.node_file(index.node_of[r]), f"/{lay.rank_group(r)}/{e.name}")
                continue
            if lay.volume(e.global_shape) == 0:
                obj = f.create_dataset(e.name, e.global_shape, dtype)
            else:
                layout = h5py.VirtualLayout(e.global_shape, dtype)
                for r in owners:
                    b = e.blocks[r]
                    src = h5py.VirtualSource(lay.node_file(index.node_of[r]), f"/{lay.rank_group(r)}/{e.name}",
                                             shape=b.shape, dtype=dtype)
                    layout[tuple(slice(o, o + n) for o, n in zip(b.offset, b.shape))] = src
                obj = f.create_virtual_dataset(e.name, layout)
            obj.attrs["layout"] = e.layout
            obj.attrs["block_offsets"] = np.asarray([b.offset for b in e.blocks], np.int64).reshape(
                index.world_size, len(e.global_shape))
            obj.attrs["block_shapes"] = np.asarray([b.shape for b in e.blocks], np.int64).reshape(
                index.world_size, len(e.global_shape))
            obj.attrs["block_checksums"] = [b.checksum for b in e.blocks]
    storage.fsync_file(path)

# ---------------------------------------------------------------------- small helpers
def h5_dtype(dtype):
    """The dtype h5py stores: NumPy's own, or an opaque tag for str/datetime/timedelta."""
    import h5py
    return h5py.opaque_dtype(dtype) if dtype.kind in "UmM" else dtype


def h5_type(dtype):
    from h5py import h5t
    return h5t.py_create(h5_dtype(dtype), logical=True)


def root_attrs(f, index, fmt):
    f.attrs["format"] = fmt
    f.attrs["version"] = np.int64(VERSION)
    f.attrs["name"] = index.name
    f.attrs["step"] = np.int64(index.step)
    f.attrs["epoch"] = np.int64(index.epoch)
    f.attrs["ckpt_id"] = index.ckpt_id
    f.attrs["world_size"] = np.int64(index.world_size)
    f.attrs["checksum_algorithm"] = ALGORITHM


def to_str(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def metadata_extents(size, data_ranges):
    """Local, pure: the (start, length) ranges of a file of ``size`` bytes outside its datasets'
    bytes ``data_ranges`` ((offset, nbytes) pairs): HDF5's superblock, object headers and
    attributes, and the alignment gaps."""
    out, at = [], 0
    for off, n in sorted(r for r in data_ranges if r[1] > 0):
        if off > at:
            out.append((at, off - at))
        at = max(at, off + n)
    if size > at:
        out.append((at, size - at))
    return out


def extents_digest(path, extents):
    """XXH3-64 (hex) of the bytes of ``extents`` of the file at ``path``, one after the other
    (CorruptCheckpointError when the file is shorter)."""
    h = new_hasher()
    with open(path, "rb") as f:
        for start, length in extents:
            f.seek(start)
            data = f.read(length)
            if len(data) != length:
                raise CorruptCheckpointError(f"{path}: shorter than the index says")
            h.update(data)
    return h.hexdigest()


def file_digest(path):
    """XXH3-64 (hex) of a small file's bytes."""
    with open(path, "rb") as f:
        return digest(f.read())
