"""The pfs level's files as ``hpcckpt list/verify/inspect`` see them (local, no MPI; h5py only
when ``verify`` re-hashes a step): ``<pfs_dir>/<name>/step_<S>/`` with ``COMMITTED.json`` (the
index, levels/pfs_index.py), ``checkpoint.h5`` and ``node_<n>.h5``, and ``step_<S>.tmp-<id>/``,
a step being written or abandoned by a crash (levels/pfs.py, docs/PFS.md)."""
import collections
import dataclasses
import os
import re
import stat

from .. import manifest as mf
from ..errors import HpcCkptError
from ..state import STATE_ENTRY
from ..units import format_size
from .files import LevelFiles, Row, Stored, message, not_regular, rank_ranges, why

FILES_RE = re.compile(r"^(COMMITTED\.json|checkpoint\.h5|node_[0-9]{6}\.h5)$")
TMP_RE = re.compile(r"^(step_[0-9]{10,13})\.tmp-")


def index_cap():
    """The largest COMMITTED.json the command line reads (that of a job of 4096 ranks)."""
    from .pfs_index import max_index_bytes
    return max_index_bytes(4096)


@dataclasses.dataclass
class PfsStep(Stored):
    """One step directory under a pfs job directory."""
    index: object = None      # pfs_index.Index when COMMITTED.json is readable
    committed: bool = False   # COMMITTED.json exists
    tmp: bool = False         # step_<S>.tmp-<id>: being written, or abandoned by a crash


class PfsFiles(LevelFiles):
    """pfs step directories."""

    def step_items(self, path, step, entries):
        from . import pfs_index
        names = {name: kind for name, _, kind in entries if FILES_RE.match(name)}
        if not names:
            return [], set()
        item = PfsStep(self, "pfs", path, step, os.path.basename(os.path.dirname(os.path.abspath(path))),
                       committed=pfs_index.MARKER in names)
        kind = names.get(pfs_index.MARKER)
        if kind is None:
            item.note = f"not committed (no {pfs_index.MARKER})"
        elif kind != "file":
            item.error = f"{os.path.join(path, pfs_index.MARKER)}: {not_regular(kind)}"
        else:
            try:
                item.index = pfs_index.read_index(path, step=step, max_bytes=index_cap())
                item.job, item.ckpt_id = item.index.name, item.index.ckpt_id
            except (HpcCkptError, OSError, ValueError, RecursionError) as err:
                item.error = message(os.path.join(path, pfs_index.MARKER), err)
        return [item], set(names)

    def other_item(self, path, name, kind):
        tmp = TMP_RE.match(name)
        step = mf.parse_step_dir_name(tmp.group(1)) if tmp else None
        if step is None or kind != "dir":
            return None
        return PfsStep(self, "pfs", path, step, os.path.basename(os.path.dirname(os.path.abspath(path))),
                       note="being written, or abandoned by a crash", tmp=True)

    def check(self, item):
        """Its index, master file and every block, re-hashed (pfs_check.verify_step)."""
        from . import pfs_check, pfs_index
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

    def row(self, item):
        ix = item.index
        if ix is None:
            state = (f"being written, or abandoned by a crash ({os.path.basename(item.path)})" if item.tmp else
                     "uncommitted (no COMMITTED.json)" if not item.committed else f"unreadable index: {item.error}")
            return Row(state)
        problems = file_problems(item)
        bad_files = {w.split(" ", 1)[0] for w in problems}
        ranks = sum(1 for r in range(ix.world_size) if f"node_{ix.node_of[r]:06d}.h5" not in bad_files)
        return Row("committed" + (f"; {'; '.join(problems[:4])}" if problems else ""), ix.epoch, ranks, ix.world_size,
                   sum(ix.files.values()), ix.created)

    def inspect(self, item):
        """Read from COMMITTED.json; the node files are only looked at (file_problems)."""
        if item.tmp:
            return None
        ix = item.index
        if ix is None:
            return [f"pfs step {item.step} ({item.path}): {item.error or item.note}"], item.committed
        nnodes = len(ix.files)
        lines = [f"job {ix.name!r}, step {ix.step}, epoch {ix.epoch}, level pfs ({item.path}), written by "
                 f"{ix.world_size} ranks on {nnodes} node(s); {format_size(sum(ix.files.values()))} in {nnodes} "
                 "node file(s)"]
        problems = file_problems(item)
        lines += [f"  {w}" for w in problems]
        lines.append(f"{'array':<20} {'dtype':<6} {'layout':<11} shape")
        for e in ix.arrays:
            if e.name == STATE_ENTRY:       # the state dict's document: its keys are listed below
                continue
            if e.global_shape is not None:
                shape = f"{e.global_shape} global, in {len(e.holders())} block(s)"
            else:
                by_shape = collections.defaultdict(list)
                for r in e.holders():
                    by_shape[e.blocks[r].shape].append(r)
                shapes = [f"{s} on rank{'s' if len(rs) > 1 else ''} {rank_ranges(rs)}" for s, rs in by_shape.items()]
                shape = "; ".join(shapes[:8]) + (f"; … ({len(shapes)} shapes)" if len(shapes) > 8 else "")
            lines.append(f"{e.name:<20} {e.dtype:<6} {e.layout:<11} {shape}")
        if ix.state_keys:
            lines.append("state dict keys: " + ", ".join(f"{k} ({v})" for k, v in ix.state_keys.items()))
        return lines, bool(problems)

    def rebuild_note(self, rank, cs, cat, ok):
        for s in cat.stored:
            if s.files is self and s.ckpt_id is not None and s.ckpt_id == cs.ckpt_id:
                return True, f" (the pfs copy of this checkpoint holds it: {s.path})"
        return None


def file_problems(item):
    """Cheap checks of a committed pfs step's files (no hashing): each node file and the master
    exist as regular files, node files of the size the index says. [problem, ...]"""
    from .pfs_index import MASTER
    out = []
    files = dict(item.index.files) if item.index else {}
    for name in [MASTER] + sorted(files):
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

