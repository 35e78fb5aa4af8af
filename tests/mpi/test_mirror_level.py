"""The proof that a level is one module behind the Level interface: ``MirrorLevel``, defined here
and registered from here (by a job or the command line, which import this module; in pytest's
process by a fixture, for this module's tests only), with no file of hpcckpt/ knowing it.

The mirror keeps a copy of each committed cache step in a directory of its own (its setting
``dir``: ``[mirror] dir = ...`` in the TOML file, ``HPCCKPT_MIRROR_DIR``; by default
``<pfs_dir>/.mirror``): ``<dir>/<name>/step_<S>/rank_<R>.dat`` and ``rank_<R>.json`` (the data
first, the manifest last, each a temporary file renamed; a ``MIRROR`` marker says the directory is
the mirror's), and restores from it directly, as the pfs level does, on the same rank count. Its
files (``MirrorFiles``) tell ``hpcckpt list/verify/inspect`` about them. The MPI jobs and the command line import this module
through ``HPCCKPT_LEVEL_MODULES=test_mirror_level`` (``PYTHONPATH`` naming tests/mpi).

The tests run it through a checkpoint, a killed rank and its node's cache lost, the restart from
the mirror, the command line, the placement warning, and the conformance tests and faults
(test_level_conformance.py).
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from hpcckpt import data_file, manifest as mf, state as st, storage
from hpcckpt.config import expand_cache_dir
from hpcckpt.errors import CorruptCheckpointError, HpcCkptError, MismatchError
from hpcckpt.levels.base import Level
from hpcckpt.levels.options import Setting
from hpcckpt.levels import registry

from hpcckpt.levels.files import LevelFiles, Row, Stored, read_rank_manifest, verify_data

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = "MIRROR"          # in each of the mirror's step directories: they are the mirror's, not a node cache's


def mirror_root(config, options):
    """Local, pure: ``<dir>/<name>``, the mirror's directory of this job."""
    return os.path.join(options.get("dir") or os.path.join(config.pfs_dir, ".mirror"), config.name)


class MirrorStep(Stored):
    """A mirror step directory: its rank manifests ({rank: RankManifest}) and their problems."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.manifests, self.bad = {}, []

class MirrorFiles(LevelFiles):
    """The mirror's files for ``hpcckpt list/verify/inspect`` (local, no MPI): the step
    directories holding MARKER, their ``rank_<R>.json`` and ``rank_<R>.dat``."""

    def step_items(self, path, step, entries):
        if (MARKER, os.path.join(path, MARKER), "file") not in entries:
            return [], set()
        item = MirrorStep(self, "mirror", path, step, os.path.basename(os.path.dirname(path)))
        claimed = {MARKER}
        for name, where, kind in entries:
            if name.startswith("rank_") and name.endswith(".json") and name[5:-5].isdigit():
                rank = int(name[5:-5])
                claimed |= {name, mf.data_file_name(rank)}
                m, error = read_rank_manifest(where, kind, step, rank)
                if error:
                    item.bad.append(error)
                else:
                    item.manifests[rank] = m
        ids = {m.ckpt_id for m in item.manifests.values()}
        item.ckpt_id = ids.pop() if len(ids) == 1 else None
        if item.bad:
            item.error = item.bad[0]
        return [item], claimed

    def check(self, item):
        out = []
        for rank, m in sorted(item.manifests.items()):
            problem = verify_data(os.path.join(item.path, mf.data_file_name(rank)), m.data_size,
                                  [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays])
            out += [problem] if problem else []
        ms = list(item.manifests.values())
        if ms and len(ms) != ms[0].world_size:
            out.append(f"{item.path}: copies of {len(ms)} of {ms[0].world_size} ranks")
        return out

    def row(self, item):
        ms = list(item.manifests.values())
        if not ms:
            return Row(item.error or "no rank copies")
        state = "committed" if len(ms) == ms[0].world_size else "incomplete"
        return Row(state, ms[0].epoch, len(ms), ms[0].world_size, sum(m.data_size for m in ms), ms[0].created)

    def inspect(self, item):
        lines = [f"mirror step {item.step} ({item.path}): {len(item.manifests)} rank copies"]
        for rank, m in sorted(item.manifests.items()):
            lines += [f"  rank {rank}: {a.name} {a.dtype} {tuple(a.shape)}" for a in m.arrays]
        return lines, bool(item.error)

    def rebuild_note(self, rank, cs, cat, ok):
        for s in cat.stored:
            if s.files is self and s.ckpt_id == cs.ckpt_id and rank in s.manifests:
                return True, f" (the mirror copy of this checkpoint holds it: {s.path})"
        return None


class MirrorLevel(Level):
    """A copy of every rank's committed step in a directory of its own; restores from it."""
    name, order, restores, survives = "mirror", 45, True, "node"
    settings = {"dir": Setting("", str, doc="where the mirror keeps its copies (default: <pfs_dir>/.mirror)")}
    files = MirrorFiles()

    def __init__(self, ctx):
        super().__init__(ctx)
        self.cfg, self.comm = ctx.config, ctx.comm
        self.root = mirror_root(self.cfg, ctx.options)
        self.locked = False

    def _paths(self, step, rank):
        d = os.path.join(self.root, mf.step_dir_name(step))
        return d, os.path.join(d, mf.data_file_name(rank)), os.path.join(d, mf.manifest_file_name(rank))

    def _lock(self):
        """Collective (first use): rank 0 creates and locks the mirror directory of this job."""
        from hpcckpt.comm import Collective      # here: pytest imports this module without MPI
        if self.locked:
            return
        with Collective(self.comm, f"locking {self.root}"):
            if self.comm.rank == 0:
                storage.makedirs(self.root, self.cfg.dir_mode)
                if self.ctx.lock is not None:
                    self.ctx.lock(os.path.join(self.root, ".lock"), f"job name {self.cfg.name!r} in {self.root}")
        self.locked = True

    # ------------------------------------------------------------------ per checkpoint
    def protect(self, manifest, pending=None):
        """Collective: copy this rank's data file, then its manifest, of the committed step."""
        self._lock()
        d, data, meta = self._paths(manifest.step, manifest.rank)
        storage.makedirs(d, self.cfg.dir_mode)
        storage.atomic_write_bytes(os.path.join(d, MARKER), b"", self.cfg.file_mode, fsync=False)
        storage.remove_file(meta)                 # a copy of an earlier attempt is no copy of this one
        tmp = f"{data}.tmp.{os.getpid()}"
        try:
            shutil.copyfile(self.ctx.cache.data_path(manifest.step), tmp, follow_symlinks=False)
            os.replace(tmp, data)
        finally:
            storage.remove_file(tmp)
        storage.atomic_write_json(meta, manifest.to_json(), self.cfg.file_mode, self.cfg.cache_fsync)

    def retire(self, manifest, clear_others=False):
        """Collective (rank 0 works): keep this run's newest ``keep`` steps up to this one."""
        if self.comm.rank == 0:
            self._remove(lambda step, epoch: epoch != manifest.epoch if clear_others else False,
                         keep=(manifest.epoch, manifest.step))

    def clear_earlier(self, epoch):
        """Collective (rank 0 works): remove the copies of earlier runs."""
        if self.comm.rank == 0:
            self._remove(lambda step, e: e != epoch)

    def _remove(self, other, keep=None):
        ours = []
        for step, epoch in self._steps():
            if other(step, epoch) or keep is not None and epoch is None and step < keep[1]:
                storage.remove_tree(self._paths(step, 0)[0])          # (no manifest: a copy never completed)
            elif keep is not None and epoch == keep[0] and step <= keep[1]:
                ours.append(step)
        for step in sorted(ours)[:-self.cfg.keep]:
            storage.remove_tree(self._paths(step, 0)[0])

    def _steps(self):
        """Local: (step, epoch) of the step directories: the epoch of the lowest rank's readable
        copy (None: none is)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        steps = sorted(s for n in names if (s := mf.parse_step_dir_name(n)) is not None)
        return [(s, next((m.epoch for r in range(self.comm.size) if (m := self._manifest(s, r))), None))
                for s in steps]

    def _manifest(self, step, rank):
        """Local: this step's manifest of ``rank`` in the mirror, parsed and checked, or None."""
        _, data, meta = self._paths(step, rank)
        try:
            m = mf.parse(storage.read_json(meta), meta)
        except (HpcCkptError, OSError):
            return None
        ok = (m.step, m.rank, m.name) == (step, rank, self.cfg.name) and os.path.isfile(data) \
            and not os.path.islink(data) and os.path.getsize(data) == m.data_size
        return m if ok else None

    # ------------------------------------------------------------------ per restart
    def offers(self, skipped=None):
        """Local (rank 0): the steps whose every rank's copy is there, of this rank count."""
        out = {}
        for step, _ in self._steps():
            ms = [self._manifest(step, r) for r in range(self.comm.size)]
            if any(m is None for m in ms) or len({(m.epoch, m.ckpt_id, m.world_size) for m in ms}) != 1 \
                    or ms[0].world_size != self.comm.size:
                if skipped is not None:
                    skipped.append((step, "the mirror's copy is incomplete or of another rank count"))
                continue
            out[step] = (ms[0].epoch, ms[0].ckpt_id)
        return out

    def restore(self, step, protected, state, layouts):
        """Collective: verify this rank's copy on every rank, then fill the arrays and the state."""
        from hpcckpt.comm import Collective
        with Collective(self.comm, f"restoring mirror step {step}: checking the copies"):
            _, data, meta = self._paths(step, self.comm.rank)
            m = self._manifest(step, self.comm.rank)
            if m is None or m.world_size != self.comm.size:
                raise CorruptCheckpointError(f"{meta}: no usable copy of step {step} of rank {self.comm.rank}")
            storage.verify_file(data, m.data_size, [(a.name, a.offset, a.nbytes, a.checksum) for a in m.arrays],
                                np.empty(1 << 20, np.uint8))
            entries = {a.name: a for a in m.arrays}
            for name, array, _ in protected:
                a = entries.get(name)
                if a is None or tuple(array.shape) != a.shape or array.dtype.str != a.dtype:
                    raise MismatchError(f"mirror step {step}: the protected array {name!r} is not in it as "
                                        f"{tuple(array.shape)} {array.dtype.str}")
            plan = st.Plan([], [])
            if st.STATE_ENTRY in entries:
                e = entries[st.STATE_ENTRY]
                buf = np.empty(e.shape, np.dtype(e.dtype))
                data_file.read_into(data, m.data_size, [(buf, e.offset)], self.cfg.io_chunk)
                doc = st.parse_document(buf.tobytes(), data)
                if state is None:
                    raise MismatchError(f"mirror step {step} holds a state dict: pass restart(state=...)")
                plan = st.plan_restore(state, doc["items"], {a.name: (a.shape, a.dtype) for a in m.arrays},
                                       f"mirror step {step}")
            elif state:
                raise MismatchError(f"mirror step {step} holds no state dict, but restart() was given one")
        with Collective(self.comm, f"restoring mirror step {step}: reading"):
            targets = [(name, array) for name, array, _ in protected] + plan.reads
            direct = [(a if a.flags.c_contiguous else np.empty(a.shape, a.dtype), entries[n].offset)
                      for n, a in targets]
            data_file.read_into(data, m.data_size, direct, self.cfg.io_chunk)
            for (_, a), (b, _) in zip(targets, direct):
                if a is not b:
                    np.copyto(a, b)
            plan.apply()

    # ------------------------------------------------------------------ the rest
    def close(self):
        self.locked = False

    @classmethod
    def placement_warnings(cls, node_of, options, config):
        """Local, pure: the mirror inside a node's cache is lost with that node."""
        root = os.path.realpath(mirror_root(config, options))
        for node in sorted(set(node_of)):
            cache = os.path.realpath(expand_cache_dir(config, node))
            if os.path.commonpath([root, cache]) == cache:
                return [f"the mirror level's dir {root} is inside the node cache of node {node} ({cache}): "
                        f"its copies are lost with that node"]
        return []


if __name__ in os.environ.get(registry.MODULES_ENV, "").split(","):
    registry.register(MirrorLevel)   # a job or the command line imports this module: the level is there for good


# ---------------------------------------------------------------------- the tests
# (imported after the level: a job imports this module to register it, and the conformance module
# asks the registry while it is imported)
import pytest  # noqa: E402

import test_level_conformance as conformance  # noqa: E402
from harness import outputs, restart_step, run_mpi  # noqa: E402
from test_level_conformance import crashed, reference  # noqa: E402,F401 - the fixtures, shared

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True, scope="module")
def mirror_registered():
    """In pytest's process the mirror is registered for this module's tests only (the other
    tests see the built-in levels; tests/unit/test_level_files.py registers a "mirror" of its own).
    """
    registry.classes()                  # the built-in levels first
    registry.register(MirrorLevel)
    yield MirrorLevel
    registry.unregister(MirrorLevel.name)
NPROCS, STEPS, EVERY, CRASH = 4, 20, 5, 12        # committed: 4 and 9 (keep = 2)


def job_env(**more):
    """The environment that lets a job (and the command line) import this level."""
    path = os.pathsep.join([HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {"HPCCKPT_LEVEL_MODULES": "test_mirror_level", "PYTHONPATH": path, **more}


def app(root, *args, config=None, env=None, expect_ok=True):
    cfg = {"ranks_per_node": 1, "keep": 2, **(config or {})}
    res = run_mpi(NPROCS, "app.py", "--cache", os.path.join(root, "cache", "node{node}"), "--steps", STEPS,
                  "--every", EVERY, "--uneven", "--level", "mirror", "--config-json", json.dumps(cfg), *args,
                  env=job_env(**(env or {})))
    assert (res.returncode == 0) == expect_ok, str(res)
    return res


def mirror_steps(mdir):
    """{step: ranks} of the manifests in the mirror directory ``mdir`` (job name "app")."""
    out = {}
    for p in glob.glob(os.path.join(mdir, "app", "step_*", "rank_*.json")):
        out.setdefault(int(os.path.basename(os.path.dirname(p))[5:]), set()).add(int(os.path.basename(p)[5:11]))
    return {s: sorted(r) for s, r in sorted(out.items())}


def test_a_lost_node_restarts_from_the_mirror(tmp_path, reference):
    """The mirror's own setting from the TOML file; a rank killed, its node's cache lost: the
    restart restores step 9 from the mirror, bitwise."""
    root, mdir = str(tmp_path), str(tmp_path / "mirror")
    toml = tmp_path / "run.toml"
    toml.write_text(f'[mirror]\ndir = "{mdir}"\n')
    app(root, "--crash-at", CRASH, "--crash-rank", NPROCS - 1, config={"config": str(toml)}, expect_ok=False)
    assert mirror_steps(mdir) == {4: [0, 1, 2, 3], 9: [0, 1, 2, 3]}     # keep = 2
    shutil.rmtree(os.path.join(root, "cache", f"node{NPROCS - 1}"))
    res = app(root, "--out", os.path.join(root, "out"), config={"config": str(toml)})
    assert restart_step(res) == 9, str(res)
    assert outputs(os.path.join(root, "out")) == reference
    assert mirror_steps(mdir) == {14: [0, 1, 2, 3], 19: [0, 1, 2, 3]}


def test_the_setting_from_the_environment(tmp_path, reference):
    """``HPCCKPT_MIRROR_DIR``: the copies go there."""
    root, mdir = str(tmp_path), str(tmp_path / "elsewhere")
    app(root, "--out", os.path.join(root, "out"), "--no-restart", env={"HPCCKPT_MIRROR_DIR": mdir})
    assert outputs(os.path.join(root, "out")) == reference
    assert mirror_steps(mdir) == {14: [0, 1, 2, 3], 19: [0, 1, 2, 3]}


def test_the_placement_warning(tmp_path):
    """The mirror's dir inside node 0's cache: rank 0 warns once that it does not survive that node."""
    root = str(tmp_path)
    mdir = os.path.join(root, "cache", "node0", "mirror")
    res = app(root, "--no-restart", config={"mirror": {"dir": mdir}})
    assert mirror_steps(mdir) == {14: [0, 1, 2, 3], 19: [0, 1, 2, 3]}
    assert res.stderr.count("the mirror level's dir") == 1, str(res)
    assert "inside the node cache of node 0" in res.stderr


def test_the_default_dir_without_a_warning(tmp_path, reference):
    root = str(tmp_path)
    res = app(root, "--no-restart")
    assert mirror_steps(os.path.join(root, "cache", "pfs", ".mirror")) == {14: [0, 1, 2, 3], 19: [0, 1, 2, 3]}
    assert "the mirror level's dir" not in res.stderr


def test_placement_warnings_are_pure():
    from hpcckpt.config import Config
    cfg = Config.load(name="app", cache_dir="/c/node{node}", pfs_dir="/p")
    assert MirrorLevel.placement_warnings([0, 1], {"dir": "/m"}, cfg) == []
    assert MirrorLevel.placement_warnings([0, 1], {"dir": ""}, cfg) == []
    (text,) = MirrorLevel.placement_warnings([0, 1], {"dir": "/c/node1/m"}, cfg)
    assert "node 1" in text


def test_a_rank_killed_while_mirroring_leaves_no_usable_copy(tmp_path, reference):
    """Rank 3 killed as the mirror's protect of step 9 begins, then its node lost: step 9 has no
    copy of rank 3 in the mirror, so the restart takes step 4 from it (never a partial step 9)."""
    root, mdir = str(tmp_path), str(tmp_path / "mirror")
    app(root, config={"mirror": {"dir": mdir}}, env={"_HPCCKPT_LEVEL_FAULT": "mirror:protect:3:9:kill"},
        expect_ok=False)
    assert 3 not in mirror_steps(mdir).get(9, []) and mirror_steps(mdir)[4] == [0, 1, 2, 3]
    shutil.rmtree(os.path.join(root, "cache", f"node{NPROCS - 1}"))
    res = app(root, "--out", os.path.join(root, "out"), config={"mirror": {"dir": mdir}})
    assert restart_step(res) == 4, str(res)
    assert outputs(os.path.join(root, "out")) == reference


# the conformance tests of every level (test_level_conformance.py), on this one
@pytest.mark.parametrize("fault", ["crash", "node-lost", "damaged"])
def test_the_level_contract(fault, reference, crashed, tmp_path):
    conformance.test_level_contract("mirror", fault, reference, crashed, tmp_path)


@pytest.mark.parametrize("level,phase", conformance.fault_cases([MirrorLevel], conformance.SAVE_PHASES))
def test_a_save_phase_fails_on_one_rank(level, phase, reference, tmp_path):
    conformance.test_a_save_phase_fails_on_one_rank(level, phase, reference, tmp_path)


@pytest.mark.parametrize("level,phase", conformance.fault_cases([MirrorLevel], conformance.RESTART_PHASES))
def test_a_restart_phase_fails_on_one_rank(level, phase, reference, crashed, tmp_path):
    conformance.test_a_restart_phase_fails_on_one_rank(level, phase, reference, crashed, tmp_path)


@pytest.mark.skipif(LevelFiles is None, reason="levels/files.py (the files protocol) is not on this branch yet")
def test_list_verify_inspect_see_the_mirror(tmp_path):
    """The command line imports the level (HPCCKPT_LEVEL_MODULES) and asks its files: the mirror's
    steps are listed, verified (a damaged byte is named) and inspected."""
    root, mdir = str(tmp_path), str(tmp_path / "mirror")
    app(root, "--no-restart", config={"mirror": {"dir": mdir}})
    env = {**os.environ, **job_env()}

    def cli(*args):
        res = subprocess.run([sys.executable, "-m", "hpcckpt", *map(str, args)], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL, env=env)
        assert "Traceback" not in res.stderr, res.stderr
        return res
    res = cli("list", root)
    rows = [ln.split() for ln in res.stdout.splitlines()[1:] if ln.strip()[:1].isdigit()]
    assert res.returncode == 0 and [(r[0], r[1], r[3], r[5]) for r in rows if r[3] != "cache"] == \
        [("14", "mirror", "mirror", "4/4"), ("19", "mirror", "mirror", "4/4")], res.stdout     # "in": its dir
    res = cli("verify", root)
    assert res.returncode == 0 and "mirror: 2 of 2 steps intact" in res.stdout, res.stdout + res.stderr
    res = cli("inspect", root, 19)
    assert res.returncode == 0 and "mirror step 19" in res.stdout and "rank 3: u <f8" in res.stdout, res.stdout
    (data,) = glob.glob(os.path.join(mdir, "app", "step_0000000019", "rank_000002.dat"))
    with open(data, "r+b") as f:
        f.seek(64)
        b = f.read(1)
        f.seek(64)
        f.write(bytes([b[0] ^ 1]))
    res = cli("verify", root)
    assert res.returncode != 0 and data in res.stdout, res.stdout + res.stderr
