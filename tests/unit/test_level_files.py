"""A level registered from outside hpcckpt ("mirror", defined here) tells ``hpcckpt list/verify/
inspect`` about its files through its ``LevelFiles`` (levels/files.py): its steps are listed,
verified (a damaged byte is named) and inspected, and its rank files are not taken for the node
cache's. And the command, as a process of its own, never initializes MPI although the level
modules import mpi4py. (Files written by hand; no MPI job.)"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from hpcckpt import catalog, catalog_verify, manifest as mf
from hpcckpt.levels import registry
from hpcckpt.levels.base import Level
from hpcckpt.levels.files import LevelFiles, Row, Stored, held_file, read_rank_manifest, verify_data

from test_catalog import CKPT_ID, run, write_rank, write_step

MARKER = "MIRROR.json"


class MirrorStep(Stored):
    """A mirror step directory: its rank manifests ({rank: RankManifest}) and their problems."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.manifests, self.bad = {}, []


class MirrorFiles(LevelFiles):
    """``<mirror_dir>/<name>/step_<S>/``: ``MIRROR.json`` and a copy of each rank's
    ``rank_<R>.json`` and ``rank_<R>.dat``."""

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
        return out

    def row(self, item):
        ms = list(item.manifests.values())
        if not ms:
            return Row(item.error or "no rank copies")
        return Row("committed", ms[0].epoch, len(ms), ms[0].world_size, sum(m.data_size for m in ms), ms[0].created)

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
    """Only its files matter here."""
    name, order = "mirror", 60
    files = MirrorFiles()


@pytest.fixture
def mirror():
    registry.classes()                 # the built-in levels first
    registry.register(MirrorLevel)
    yield MirrorLevel
    registry.unregister(MirrorLevel.name)


def write_mirror(root, step, world=4, **kw):
    """The mirror level's copy of a step: ``<root>/mirror/job/step_<S>/``."""
    scratch = os.path.join(root, "scratch")
    for r in range(world):
        write_rank(scratch, step, r, world, ranks_per_node=world, **kw)
    step_dir = os.path.join(root, "mirror", "job", mf.step_dir_name(step))
    os.makedirs(os.path.dirname(step_dir), exist_ok=True)
    shutil.move(os.path.join(scratch, "node0", "job", mf.step_dir_name(step)), step_dir)
    shutil.rmtree(scratch)
    with open(os.path.join(step_dir, MARKER), "w") as f:
        json.dump({"step": step}, f)
    return step_dir


def test_an_outside_level_is_listed_verified_and_inspected_through_its_files(tmp_path, mirror):
    cache_dirs = write_step(tmp_path / "cache", 9)
    step_dir = write_mirror(tmp_path, 9)
    cat = catalog.scan(tmp_path)
    assert [(s.level, s.step, s.path, sorted(s.manifests)) for s in cat.stored] == [("mirror", 9, step_dir,
                                                                                      [0, 1, 2, 3])]
    assert all(f.path.startswith(str(tmp_path / "cache")) for f in cat.found) and len(cat.found) == 4
    findings, counts = catalog_verify.check(cat)
    assert findings == [] and counts[("steps", "mirror")] == counts[("intact", "mirror")] == 1

    rc, out, _ = run("list", tmp_path)
    rows = [ln.split() for ln in out.splitlines()[1:] if ln.strip()[:1].isdigit()]
    assert rc == 0 and [r[:6] for r in rows] == [["9", "local", "1", "cache", "job", "4/4"],
                                                  ["9", "mirror", "1", "mirror", "job", "4/4"]], out
    rc, out, _ = run("verify", tmp_path)
    assert rc == 0 and "cache: 4 of 4 files intact; mirror: 1 of 1 steps intact" in out, out
    rc, out, _ = run("inspect", tmp_path, 9)
    assert rc == 0 and f"mirror step 9 ({step_dir}): 4 rank copies" in out and "rank 3: u <f8 (13,)" in out

    # a lost rank part of the cache: the mirror copy holds it (its rebuild_note)
    os.unlink(os.path.join(cache_dirs[3], mf.manifest_file_name(3)))
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1 and f"MISSING step 9 rank 3: no manifest under {tmp_path}" in out
    assert f"(the mirror copy of this checkpoint holds it: {step_dir})" in out, out

    # one damaged byte of the mirror's copy of rank 2: named by the level's check
    data = os.path.join(step_dir, mf.data_file_name(2))
    with open(data, "r+b") as f:
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 0xFF]))
    rc, out, _ = run("verify", tmp_path / "mirror")
    assert rc == 1 and f"DAMAGED step 9 (mirror): {data}" in out and "mirror: 0 of 1 steps intact" in out, out
    assert "1 DAMAGED" in out


def test_without_the_level_its_files_are_not_a_checkpoint(tmp_path):
    """The same tree with the mirror level not registered: its rank files read as a node cache's
    (of a step the cache lacks), its marker is ignored: what is seen depends on the level."""
    step_dir = write_mirror(tmp_path, 9)
    cat = catalog.scan(tmp_path)
    assert cat.stored == [] and sorted(f.rank for f in cat.found) == [0, 1, 2, 3]
    assert all(os.path.dirname(f.path) == step_dir for f in cat.found)


def test_a_partner_copy_is_found_checked_and_moved_through_the_partner_levels_files(tmp_path):
    """The built-in levels answer the same protocol: a partner copy in a held folder is the
    partner level's (held_file: what relocate moves), verified, and names what can rebuild a rank."""
    dirs = write_step(tmp_path, 9)                     # node0: ranks 0, 1; node1: ranks 2, 3
    held = os.path.join(dirs[0], mf.held_dir_name(0))
    os.mkdir(held)
    for src, dst in ((mf.manifest_file_name(2), "partner_000002.json"), (mf.data_file_name(2), "partner_000002.dat")):
        shutil.copyfile(os.path.join(dirs[2], src), os.path.join(held, dst))
    open(os.path.join(held, "partner_000002.dat.tmp"), "w").close()      # no level's file: ignored
    assert [held_file(n) for n in ("partner_000002.dat", "partner_000002.delta.json", "encoded.json", "parity.dat",
                                   "partner_000002.dat.tmp", "notes")] == [True, True, True, True, False, False]
    copies = [f for f in catalog.scan(tmp_path).found if f.files is not None]
    assert [(f.kind, f.rank, f.holder, f.data_path, f.label) for f in copies] == [
        ("partner", 2, 0, os.path.join(held, "partner_000002.dat"), "step 9 rank 2 (partner copy held by rank 0)")]
    rc, out, _ = run("verify", tmp_path)
    assert rc == 0 and "cache: 5 of 5 files intact" in out, out
    shutil.rmtree(tmp_path / "node1")
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1 and "MISSING step 9 rank 2: no manifest under" in out
    assert "rank 2: no manifest under " + str(tmp_path) + " (rebuildable from its partner copy held by rank 0)" in out
    with open(os.path.join(held, "partner_000002.dat"), "r+b") as f:
        f.write(b"#")
    rc, out, _ = run("verify", tmp_path)
    assert "DAMAGED step 9 rank 2 (partner copy held by rank 0): " + os.path.join(held, "partner_000002.dat") in out
    assert "(rebuildable" not in out


def test_the_command_registers_outside_levels_and_never_initializes_mpi(tmp_path):
    """``HPCCKPT_LEVEL_MODULES`` names the module that registers the mirror level; the command,
    a process of its own, imports the level modules (and mpi4py) without MPI_Init."""
    write_step(tmp_path / "cache", 9)
    write_mirror(tmp_path, 9, ckpt_id=CKPT_ID)
    plugin = tmp_path / "plugins"
    plugin.mkdir()
    (plugin / "mirror_plugin.py").write_text("from hpcckpt.levels import registry\n"
                                             "from test_level_files import MirrorLevel\n"
                                             "registry.register(MirrorLevel)\n")
    env = dict(os.environ, HPCCKPT_LEVEL_MODULES="mirror_plugin",
               PYTHONPATH=os.pathsep.join([str(plugin), os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    for command in ("list", "verify", "inspect"):
        args = [command, str(tmp_path)] + (["9"] if command == "inspect" else [])
        code = (f"import sys; sys.argv[1:] = {args!r}\n"
                "from hpcckpt.cli import main\n"
                "rc = main()\n"
                "from mpi4py import MPI\n"
                "print('RESULT', rc, 'mpi4py.MPI' in sys.modules, MPI.Is_initialized())\n")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                             stdin=subprocess.DEVNULL)
        assert "Traceback" not in res.stderr, res.stderr
        assert res.stdout.splitlines()[-1] == "RESULT 0 True False", res.stdout + res.stderr
        assert "mirror" in res.stdout, res.stdout
