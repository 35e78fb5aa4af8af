"""Find and check checkpoints on disk without MPI (local; used by the command line)."""
import dataclasses
import os

from . import manifest as mf, storage
from .errors import HpcCkptError

MAX_DEPTH = 6


@dataclasses.dataclass
class Found:
    """One rank manifest file found under a directory: parsed, or the reason it is unreadable."""
    path: str
    step: int
    rank: int
    manifest: object = None   # RankManifest (rank, partner) or the encoded.json dict (parity)
    error: str = None
    kind: str = "rank"        # "rank": a rank's own part; "partner": a copy held for it; "parity"

    @property
    def data_path(self):
        if self.kind == "partner":
            return self.path[:-5] + ".dat"
        if self.kind == "parity":
            return os.path.join(os.path.dirname(self.path), "parity.dat")
        return os.path.join(os.path.dirname(self.path), mf.data_file_name(self.rank))

    @property
    def label(self):
        if self.kind == "partner":
            return f"step {self.step} rank {self.rank} (partner copy)"
        if self.kind == "parity":
            return f"step {self.step} rank {self.rank} (parity)"
        return f"step {self.step} rank {self.rank}"


def find(root):
    """Every rank manifest under ``root`` (a cache dir, a job dir, or above), sorted by step, rank."""
    if not os.path.isdir(root):
        raise HpcCkptError(f"{root}: not a directory")
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        depth = os.path.relpath(dirpath, root).count(os.sep)
        if depth >= MAX_DEPTH:
            dirnames[:] = []
        step = mf.parse_step_dir_name(os.path.basename(dirpath))
        if step is None:
            continue
        dirnames[:] = []  # level subfolders are described by the rank manifests
        for name in sorted(filenames):
            if not (name.startswith("rank_") and name.endswith(".json") and name[5:-5].isdigit()):
                continue
            path = os.path.join(dirpath, name)
            item = Found(path, step, int(name[5:-5]))
            try:
                item.manifest = mf.parse(storage.read_json(path), path)
                if item.manifest.step != step or item.manifest.rank != item.rank:
                    item.error = f"describes step {item.manifest.step} rank {item.manifest.rank}"
            except (HpcCkptError, OSError) as e:
                item.error = str(e)
            found.append(item)
        found.extend(_held(dirpath, step))
    return sorted(found, key=lambda f: (f.step, f.rank, f.kind, f.path))


def _held(step_dir, step):
    """Partner copies and parity kept in ``held_<H>`` folders of one step directory."""
    out = []
    for holder in sorted(os.listdir(step_dir)):
        path = os.path.join(step_dir, holder)
        if not (holder.startswith("held_") and holder[5:].isdigit()) or os.path.islink(path) or not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            if name.startswith("partner_") and name.endswith(".json") and name[8:-5].isdigit():
                item = Found(full, step, int(name[8:-5]), kind="partner")
                try:
                    item.manifest = mf.parse(storage.read_json(full), full)
                except (HpcCkptError, OSError) as e:
                    item.error = str(e)
                out.append(item)
            elif name == "encoded.json":
                item = Found(full, step, int(holder[5:]), kind="parity")
                try:
                    item.manifest = _parity_table(storage.read_json(full))
                except (HpcCkptError, OSError, ValueError, TypeError, KeyError) as e:
                    item.error = f"{full}: {e}"
                out.append(item)
    return out


def _parity_table(doc):
    m, piece, sums = doc["parity"], doc["piece"], doc["parity_checksums"]
    if not (isinstance(m, int) and isinstance(piece, int) and piece >= 8 and isinstance(sums, list) and len(sums) == m
            and all(isinstance(c, str) for c in sums)):
        raise ValueError("not an hpcckpt encoded-level file")
    return {"size": m * piece, "entries": [(f"parity {j}", j * piece, piece, c) for j, c in enumerate(sums)]}


def uncommitted_steps(root):
    """Step directories holding data files but no manifest of that rank: {step: [rank, ...]}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        step = mf.parse_step_dir_name(os.path.basename(dirpath))
        if step is None:
            continue
        dirnames[:] = []
        names = set(filenames)
        for name in filenames:
            if name.startswith("rank_") and name.endswith(".dat") and name[:-4] + ".json" not in names:
                out.setdefault(step, []).append(int(name[5:-4]))
    return out


def verify(item, buffer_bytes=1 << 20):
    """Re-hash one found manifest's data; return None when intact, else the reason."""
    import numpy as np
    if item.error:
        return item.error
    m = item.manifest
    if item.kind == "parity":
        size, entries = m["size"], m["entries"]
    else:
        size, entries = m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays]
    try:
        storage.verify_file(item.data_path, size, entries, np.empty(buffer_bytes, np.uint8))
    except HpcCkptError as e:
        return str(e)
    return None
