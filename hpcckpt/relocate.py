"""Node-cache files that a relaunch left on another host than their rank's (collective, at restart).

A job relaunched on a different set or order of hosts (``hpcckpt run --exclude-failed-node``
when the first node failed: the remaining nodes move up one place; an allocation whose node
order changed) runs its ranks on other hosts than the ones whose node-local directories hold
their files. Each rank's files are its own data (``step_*/rank_<R>.*``) and what it holds for
others in its held folder (``step_*/held_<R>/``: the files a level says are its there,
``LevelFiles.held_file``, levels/files.py: partner copies, parity); they belong on the host that
now runs rank R. ``relocate`` finds such files and sends them there over MPI before the restart
looks for checkpoints, so that the restart and the redundancy levels' rebuild find them where
they look, whatever the hosts' order.

The success path is the split into hosts (``MPI_Comm_split_type``, as the topology's own)
between two fixed-size reductions, the second saying whether a node-cache directory that a host
(its lowest rank) can see holds files of a rank that runs on another host. Only then (a
relaunch on other or reordered hosts) do the ranks gather which host holds which ranks' files
(the failure path) and move them. The receiving rank takes a step's files of that rank
together, unless it holds a file of the same name in that step: then only when its own
manifest of that step is an earlier run's (a lower epoch), damaged or missing, and the offered
one a later run's, its files of that step being removed first; otherwise the offered files stay
where they are. Each taken file is sent whole, in chunks, written under a temporary name and
renamed, step by step with each step's manifests last, so an interrupted move never leaves a
manifest without its data. Once every rank has agreed that every move completed, the senders
remove what they sent, and only that. Every restored byte is still verified against its
manifest's checksum afterwards, as after any restart.

Hosts are MPI's shared-memory domains (``MPI.COMM_TYPE_SHARED``). A host sees the directories
of its nodes' indices and, when ``cache_dir`` names ``{node}``, those of the other indices too
(a host that ran node 3 before and runs node 2 now holds ``.../node3``).
"""
import glob
import logging
import os
import re

import numpy as np
from mpi4py import MPI

from . import manifest as mf, storage
from .comm import Collective, agree, signals_deferred
from .config import expand_cache_dir
from .errors import CheckpointWriteError, CorruptCheckpointError, HpcCkptError
from .levels.files import held_file
from .levels.local import Found, step_dirs

log = logging.getLogger("hpcckpt")

RANK_FILE = re.compile(r"^rank_(\d{6})\.")
CHUNK = 16 << 20
TAG_LIST, TAG_WANTED, TAG_DATA, TAG_STATUS = 7301, 7304, 7302, 7303
TEMP_SUFFIX = ".relocating"


def relocate(comm, cfg, topology, root):
    """Collective: move the node-cache files of ranks that now run on other hosts to those ranks'
    cache job directories (``root`` is this rank's). Returns the Found records ("incompatible")
    of the manifests this rank (a host's lowest) saw of ranks on other hosts written with another
    rank count or placement: those files stay where they are, and the restart weighs them as
    each rank's own (an IncompatibleCheckpointError when they are the newest). A move that fails
    on some rank raises on every rank (agreed); nothing is removed then."""
    agree(comm, None, "restart()")      # first, so that ranks making different calls find out (comm.agree)
    host_ranks, leader = _host(comm)
    with Collective(comm, "restart: looking for node caches of ranks on other hosts") as c:
        foreign, other_layout = _foreign_files(cfg, topology, host_ranks) if leader else ({}, [])
        c.words = [1 if foreign else 0]
    if not c.result[0]:
        return other_layout
    # failure path: which host holds which rank's files (one list per host), then the moves
    offers = comm.allgather(sorted(foreign))
    sender = {}
    for r, ranks in enumerate(offers):
        for q in ranks:
            sender.setdefault(q, r)
    moves = sorted((s, q) for q, s in sender.items())
    sent = []
    with Collective(comm, "restart: moving node-cache files to the hosts of their ranks") as c, signals_deferred():
        error, kept = None, 0
        for s, q in moves:         # in one global order: each pair waits only for earlier moves
            try:
                if comm.rank == s:
                    sent += _send(comm, q, foreign[q])
                elif comm.rank == q:
                    kept += _receive(comm, s, root, cfg)
            except Exception as e:     # noqa: BLE001 - every move completes its messages; the first error after all
                error = error or e
        if error is not None:
            raise error
        c.words = [min(kept, 1 << 62)]
    if comm.rank == 0:
        log.warning("restart: the node-cache files of rank(s) %s were on other hosts (the job runs on other or "
                    "reordered hosts now) and were moved to the hosts of their ranks%s",
                    sorted(sender)[:16] + (["..."] if len(sender) > 16 else []),
                    "; files whose names the destination held already (an earlier run's?) were left where they "
                    "were" if c.result[0] else "")
    _remove_sent(sent)
    return other_layout


def _host(comm):
    """Collective: (the ranks of ``comm`` on this rank's host, whether this rank is the host's
    lowest). The ranks come from translating the host communicator's group: no message."""
    host = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    groups = [host.Get_group(), comm.Get_group()]
    try:
        ranks = MPI.Group.Translate_ranks(groups[0], list(range(host.size)), groups[1])
        return set(ranks), host.rank == 0
    finally:
        for g in groups:
            g.Free()
        host.Free()


def _candidate_roots(cfg, topology, host_ranks):
    """Local: the cache job directories this host can see: its nodes' and, when cache_dir names
    {node}, every other node index's that exists here."""
    roots = {os.path.join(expand_cache_dir(cfg, topology.node_of[r]), cfg.name) for r in host_ranks}
    if "{node}" in cfg.cache_dir:
        marker = "\0node\0"
        pattern = os.path.join(expand_cache_dir(cfg, marker), cfg.name)
        head, tail = pattern.split(marker, 1) if pattern.count(marker) == 1 else (None, None)
        if head is not None:
            for path in glob.glob(glob.escape(head) + "*" + glob.escape(tail)):
                if path[len(head):len(path) - len(tail)].isdigit():
                    roots.add(path)
    return sorted(r for r in roots if os.path.isdir(r) and not os.path.islink(r))


def _foreign_files(cfg, topology, host_ranks):
    """Local (a host's lowest rank): ({rank: [(path, relative path, size)]} of the files in the
    cache job directories this host sees that belong to ranks of the job running on other hosts,
    [Found records of the manifests there of ranks on other hosts that are of another rank count
    or placement]). Such a rank's files of that step are not moved (a relaunch on their own
    layout finds them where they are)."""
    out, other_layout, placement = {}, [], mf.placement_digest(topology.node_of)
    for root in _candidate_roots(cfg, topology, host_ranks):
        try:
            steps = step_dirs(root)
        except OSError:
            continue
        for step in steps:
            step_path = os.path.join(root, mf.step_dir_name(step))
            try:
                entries = list(os.scandir(step_path))
            except OSError:
                continue
            layout = {}      # rank -> whether its files of this step are to be offered
            for e in entries:
                try:
                    is_file = e.is_file(follow_symlinks=False)
                    m = RANK_FILE.match(e.name) if is_file else None
                    q = int(m.group(1)) if m else \
                        mf.parse_held_dir_name(e.name) if e.is_dir(follow_symlinks=False) else None
                    if q is None or q in host_ranks or e.name.endswith(TEMP_SUFFIX):
                        continue
                    if q not in layout:
                        found = _other_layout(os.path.join(step_path, mf.manifest_file_name(q)), step, q, cfg,
                                              topology, placement)
                        layout[q] = found is None and q < topology.size
                        other_layout += [found] if found is not None else []
                    if not layout[q]:
                        continue
                    rel = f"{mf.step_dir_name(step)}/{e.name}"
                    found = [(e.path, rel, e.stat(follow_symlinks=False).st_size)] if is_file else \
                        [(p, f"{rel}/{os.path.basename(p)}", size) for p, size in _held_files(e.path)]
                except OSError:          # gone meanwhile: not ours to move
                    continue
                out.setdefault(q, []).extend(found)
    return {q: files for q, files in out.items() if files}, other_layout


def _other_layout(path, step, q, cfg, topology, placement):
    """Local: a Found record ("incompatible") when rank ``q``'s manifest of ``step`` at ``path``
    is of another rank count or placement than this job's; None when it is of this job's
    layout, missing or damaged (the receiver of a move judges those)."""
    try:
        m = mf.parse(storage.read_json(path), path)
    except (HpcCkptError, OSError, ValueError):
        return None
    if m.rank != q or m.step != step:
        return None
    node = topology.node_of[q] if q < topology.size else None
    reason = mf.foreign_reason(m, path, cfg.name, topology.size, node, placement)
    return Found(step, "incompatible", m, reason) if reason is not None else None


def _held_files(path):
    """Local: [(path, size)] of the files in held folder ``path`` that a level keeps there
    (levels/files.held_file; not an interrupted move's leftover)."""
    try:
        return [(e.path, e.stat(follow_symlinks=False).st_size) for e in os.scandir(path)
                if e.is_file(follow_symlinks=False) and held_file(e.name) and not e.name.endswith(TEMP_SUFFIX)]
    except OSError:
        return []


def _manifests_last(files):
    """Step by step, each step's manifests after its data (the order of the renames too: an
    interrupted move leaves whole steps and no manifest without its data)."""
    return sorted(files, key=lambda f: (f[1].split("/")[0], f[1].endswith(".json"), f[1]))


def _send(comm, dest, files):
    """Local half of one move: offer ``files`` to rank ``dest`` (their list, each relative path
    once), send the bytes of those it wants (a file it holds already is not wanted), then whether
    every read succeeded (a file that cannot be read is sent as zeros and the move fails).
    Returns the files sent: the only ones to remove once every move is agreed complete."""
    unique = {}
    for f in files:
        unique.setdefault(f[1], f)      # a rank's files seen in two {node} directories: the first
    files = _manifests_last(unique.values())
    epochs = {rel.split("/")[0]: _epoch(path) for path, rel, _ in files if RANK_FILE.match(os.path.basename(rel))
              and rel.endswith(".json") and rel.count("/") == 1}
    comm.send(([(rel, size) for _, rel, size in files], epochs), dest=dest, tag=TAG_LIST)
    wanted = comm.recv(source=dest, tag=TAG_WANTED)
    files = [f for f, want in zip(files, wanted) if want]
    buf = np.empty(min(CHUNK, max((size for _, _, size in files), default=0)) or 1, np.uint8)
    error = None
    for path, rel, size in files:
        fd = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            error = error or f"cannot read {path}: {e.strerror}"
        try:
            for at in range(0, size, buf.size):
                piece = buf[:min(buf.size, size - at)]
                if fd is not None and error is None:
                    try:
                        storage.pread_into(fd, piece, at, path)
                    except Exception as e:       # noqa: BLE001 - reported to the receiver, raised below
                        error = f"cannot read {path}: {e}"
                if error is not None:
                    piece[:] = 0
                comm.Send(piece, dest=dest, tag=TAG_DATA)
        finally:
            if fd is not None:
                os.close(fd)
    comm.send(error, dest=dest, tag=TAG_STATUS)
    if error is not None:
        raise CorruptCheckpointError(error)
    return files


def _receive(comm, source, root, cfg):
    """Local half of one move: choose which of the files rank ``source`` offers to take (a
    step's files, unless this rank's ``root`` holds a file of the same name in that step and
    its own manifest of that step is not of an earlier epoch than the offered one (or damaged,
    or missing: an interrupted move's leftovers)),
    write them under temporary names, and rename them (in the order sent: manifests last), the
    earlier run's files of a replaced step removed first, once the sender reported every read
    whole. Returns how many offered files were not taken."""
    files, epochs = comm.recv(source=source, tag=TAG_LIST)
    targets, clash = [], set()
    for rel, size in files:
        try:
            target = storage.safe_join(root, *rel.split("/"))
        except CorruptCheckpointError:      # a name that would leave the directory: not taken
            target = None
        targets.append(target)
        if target is None or os.path.lexists(target):
            clash.add(rel.split("/")[0])
    # a step's files of that rank are taken together or not at all: over files of the same names
    # only when they are an earlier run's (their manifest of a lower epoch, or unreadable) and
    # the offered ones a later run's; never half of them beside another run's
    rank = comm.rank             # the files offered are this rank's
    replace = set()
    for step in clash:      # no manifest of its own beside those files: an interrupted move's, replaced
        here = _epoch(os.path.join(root, step, mf.manifest_file_name(rank)))
        if epochs.get(step) is not None and epochs[step] > (here or 0):
            replace.add(step)
    targets = [None if rel.split("/")[0] in clash - replace else t for t, (rel, _) in zip(targets, files)]
    comm.send([t is not None for t in targets], dest=source, tag=TAG_WANTED)
    taken = [(t, size) for t, (_, size) in zip(targets, files) if t is not None]
    buf = np.empty(min(CHUNK, max((size for _, size in taken), default=0)) or 1, np.uint8)
    written, error = [], None
    for target, size in taken:
        fd = None
        if error is None:
            try:
                storage.makedirs(os.path.dirname(target), cfg.dir_mode)
                fd = os.open(target + TEMP_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                             cfg.file_mode)
            except OSError as e:              # the rest is drained, then raised
                error = f"cannot write {target}: {e.strerror}"
        try:
            for at in range(0, size, buf.size):
                piece = buf[:min(buf.size, size - at)]
                comm.Recv(piece, source=source, tag=TAG_DATA)
                if fd is not None and error is None:
                    try:
                        storage.pwrite_all(fd, piece, at)
                    except OSError as e:
                        error = f"cannot write {target}: {e.strerror}"
        finally:
            if fd is not None:
                os.close(fd)
                written.append(target)
    error = comm.recv(source=source, tag=TAG_STATUS) or error
    try:
        if error is None:
            for step in sorted(replace):      # the earlier run's files of that rank and step go first
                _remove_rank_step(os.path.join(root, step), rank)
            for target in written:
                os.replace(target + TEMP_SUFFIX, target)
    except OSError as e:
        error = f"cannot rename {e.filename}: {e.strerror}"
    if error is not None:
        for target in written:
            storage.remove_file(target + TEMP_SUFFIX)
        raise CheckpointWriteError(error)
    return len(files) - len(taken)


def _epoch(path):
    """Local: the epoch of the rank manifest at ``path``; None when there is none, 0 when it
    cannot be read (damaged: any readable one is later)."""
    if not os.path.lexists(path):
        return None
    try:
        return mf.parse(storage.read_json(path), path).epoch
    except (HpcCkptError, OSError, ValueError):
        return 0


def _remove_rank_step(step_dir, rank):
    """Local: remove ``rank``'s files from ``step_dir`` (its data, its manifest, what it holds
    for others), except the temporary files of the move that replaces them."""
    held = os.path.join(step_dir, mf.held_dir_name(rank))
    for d in (step_dir, held):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            ours = d == held or (RANK_FILE.match(name) and int(RANK_FILE.match(name).group(1)) == rank)
            if ours and not name.endswith(TEMP_SUFFIX) and os.path.isfile(path) and not os.path.islink(path):
                storage.remove_file(path)


def _remove_sent(files):
    """Local: remove the files a completed move sent, and the held and step directories that
    leaves empty."""
    dirs = set()
    for path, _, _ in files:
        storage.remove_file(path)
        d = os.path.dirname(path)
        dirs.update((d, os.path.dirname(d)) if mf.parse_held_dir_name(os.path.basename(d)) is not None else (d,))
    for d in sorted(dirs, key=len, reverse=True):
        storage.remove_dir_if_empty(d)
