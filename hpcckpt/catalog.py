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
    manifest: object = None   # RankManifest or None
    error: str = None

    @property
    def data_path(self):
        return os.path.join(os.path.dirname(self.path), mf.data_file_name(self.rank))


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
    return sorted(found, key=lambda f: (f.step, f.rank, f.path))


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
    try:
        storage.verify_file(item.data_path, m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays],
                            np.empty(buffer_bytes, np.uint8))
    except HpcCkptError as e:
        return str(e)
    return None
