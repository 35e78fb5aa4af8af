"""The fault-injection matrix: real mpiexec jobs, one fault each, one stated outcome each.

Every case names its expected outcome — the set of steps restart() may return (``None``: no
checkpoint is recoverable) — and the test checks that restart() returned one of them AND that
the restored arrays are bitwise the state of that step (or untouched for None). Never wrong data;
never a hang (every job runs under the harness timeout, which kills the process group).

The application (apps/matrix_app.py) checkpoints every 5 steps (4, 9, 14, 19; keep = 2) and a
rank is SIGKILLed at step 12, so checkpoints 4 and 9 are on disk. ``test_fault`` runs every level,
placement and fault with the default configuration; ``test_fault_in_background_work`` puts a
fault (kill, error, exit, interrupt) into each phase of checkpoint 9 under ``background``,
``background`` with new files and ``async_flush``, and checks invariants rather than one step
(see ConfigCase). Virtual nodes: cache_dir = <root>/node{node}, ranks_per_node picks the
placement; losing a node = deleting its directory.

Which cases run (the hook in tests/mpi/conftest.py, the rule in reliability.select): every item
carries a ``matrix(key)`` mark and the module lists them all in MATRIX_KEYS.

- Always: the representative default subset (21 items: ``Case.default``, ``ConfigCase.default``,
  the real-ENOSPC tests of local and xor and the read-only pfs_dir test).
- Plus one rotating slice of the other 1036 (the rotating pool, marked ``slow``): the pool sorted
  by key and dealt into N = ceil(1036 / SLICE_SIZE) slices of at most 25 (key i in slice i % N, so
  a slice mixes levels, placements and faults), slice ``seed % N`` runs. The seed is
  ``RELIABILITY_SLICE`` (an integer; ``none``: no slice), else the commit of the checkout (``git
  rev-parse HEAD`` as a number), else a fixed seed 0 (the line below says so). Each commit's hash
  picks its slice, so over many commits CI covers the whole matrix; a slice adds about 1.5-2
  minutes on 2 cores.
- ``RELIABILITY_FULL=1``: all 1057 (hours on 2 cores).

The other cases are deselected, not skipped; a case named by its full node id
(``test_fault_matrix.py::test_fault[xor-8r8n-crash]``) always runs. A line after "collected" and
at the end of the session says what ran, e.g. ``fault matrix: default subset 21 cases + slice 7
of 42 (seed from commit abc1234: 25 cases) — RELIABILITY_SLICE=7 reruns it, RELIABILITY_FULL=1
runs all 1057``. ``-m "not slow"`` leaves out the slice: the default subset only (about a minute).
With ``RELIABILITY_RECORD=tests/tools/results`` the outcomes are kept for docs/RELIABILITY.md
(``python tests/tools/gen_reliability.py``).
"""
import glob
import itertools
import json
import os
import shutil
import subprocess
import uuid

import pytest

from harness import run_mpi
from reliability import check_restored, record
from hpcckpt.topology import encoding_groups, partner_holders

pytestmark = pytest.mark.mpi
LEVELS = ("local", "partner", "xor", "rs", "pfs")
PLACEMENTS = ((2, 1), (4, 1), (4, 2), (6, 1), (6, 2), (8, 1), (8, 2))
GROUP, RS_M = 4, 2
TIMEOUT = 120


def base_dir():
    root = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    return os.path.join(root, f"hpcckpt-matrix-{uuid.uuid4().hex[:10]}")


def job(nprocs, rpn, root, level, *args, env=None, config=None):
    cfg = {"ranks_per_node": rpn, "group_size": GROUP, "rs_parity": RS_M}
    cfg.update(config or {})
    return run_mpi(nprocs, "matrix_app.py", "--cache", os.path.join(root, "node{node}"), "--level", level,
                   "--config-json", json.dumps(cfg), *args, env=env, timeout=TIMEOUT)


def step_of(res):
    (value,) = res.lines("RESTART")
    return None if value == "None" else int(value)


# ---------------------------------------------------------------------- what should happen
def cache_recoverable(level, node_of, lost_ranks, bad_data=(), bad_parity=(), bad_copy=()):
    """Can the cache levels restore a step whose ranks ``lost_ranks`` lost everything (data,
    manifest, held redundancy), ``bad_data`` lost their own data, ``bad_parity`` their parity or
    encoded.json, ``bad_copy`` the partner copy of them? From the coding rules, not the code:
    partner: every lost rank's holder survives with a good copy; xor/rs: no stripe of a group
    loses more symbols than the group has parity (m = min(parity, k - 1))."""
    lost = set(lost_ranks)
    gone = lost | set(bad_data)
    if not gone:
        return True
    if level in ("local", "pfs"):
        return False
    if level == "partner":
        holders = partner_holders(node_of)
        return all(holders[r] is not None and holders[r] not in lost and r not in bad_copy for r in gone)
    parity = 1 if level == "xor" else RS_M
    for g in encoding_groups(node_of, GROUP):
        k = len(g)
        m = min(parity, k - 1)
        lost_data = [r in gone for r in g]
        lost_par = [r in lost or r in bad_parity for r in g]
        if not any(lost_data):
            continue
        if m == 0:
            return False
        for s in range(k):
            if sum((lost_par if p < m else lost_data)[(s + p) % k] for p in range(k)) > m:
                return False
    return True


# ---------------------------------------------------------------------- damage helpers
def step_path(root, node, step=9):
    return os.path.join(root, f"node{node}", "app", f"step_{step:010d}")


def rank_file(root, rpn, rank, ext, step=9):
    return os.path.join(step_path(root, rank // rpn, step), f"rank_{rank:06d}.{ext}")


def held_file(root, rpn, holder, name, step=9):
    return os.path.join(step_path(root, holder // rpn, step), f"held_{holder:06d}", name)


def flip(path, offset=None, mask=0x40):
    size = os.path.getsize(path)
    offset = size // 2 if offset is None else offset
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def flip_json_checksum(path, key=b'"checksum": '):
    """Change one hex digit of the first checksum after ``key`` in a JSON file (damage that still parses)."""
    text = open(path, "rb").read()
    i = text.index(b'"', text.index(key) + len(key)) + 1
    repl = b"0" if text[i:i + 1] != b"0" else b"1"
    with open(path, "r+b") as f:
        f.seek(i)
        f.write(repl)


def lose_nodes(root, nodes):
    for n in nodes:
        shutil.rmtree(os.path.join(root, f"node{n}"), ignore_errors=True)


def lose_every_cache(root):
    for d in glob.glob(os.path.join(root, "node*")):
        shutil.rmtree(d)


def pfs_step(root, step=9):
    return os.path.join(root, "pfs", "app", f"step_{step:010d}")


def flip_pfs_dataset(root, rank=1, node=0):
    import h5py
    path = os.path.join(pfs_step(root), f"node_{node:06d}.h5")
    with h5py.File(path, "r") as f:
        ds = f[f"rank_{rank:06d}/u"]
        off = ds.id.get_offset() + ds.nbytes // 2
    flip(path, off)


# ---------------------------------------------------------------------- the cases
class Case:
    def __init__(self, kind, level, nprocs, rpn, fault, expected, damage=None, env=None, crash=True,
                 default=False, errors=False, steps=20, note=""):
        self.kind, self.level, self.nprocs, self.rpn = kind, level, nprocs, rpn
        self.fault, self.expected, self.damage, self.env = fault, expected, damage, env
        self.crash, self.default, self.errors, self.steps, self.note = crash, default, errors, steps, note

    @property
    def id(self):
        return f"{self.level}-{self.nprocs}r{self.nprocs // self.rpn}n-{self.kind}"


def node_of(nprocs, rpn):
    return [r // rpn for r in range(nprocs)]


def cases():
    out = []
    order = itertools.count()
    default = {     # the representative subset, always run; the rest: one slice per run, or RELIABILITY_FULL=1
        ("local", 4, 2): {"crash", "flip-data", "kill@commit", "kill@retire"},
        ("partner", 4, 1): {"lose-node+partner", "kill@encode"},
        ("xor", 8, 1): {"lose-2-diff-groups", "flip-parity+lose-member"},
        ("xor", 4, 2): {"enospc@commit"},
        ("rs", 6, 1): {"lose-3-same-group", "flip-parity+lose-member"},
        ("pfs", 4, 2): {"kill@pfs-renamed", "flip-h5-dataset", "enospc@pfs-write"},
    }
    for level, (n, rpn) in itertools.product(LEVELS, PLACEMENTS):
        nodes = node_of(n, rpn)
        nn = max(nodes) + 1
        if level in ("partner", "xor", "rs") and nn < 2:
            continue
        picked = default.get((level, n, rpn), set())
        cs = []

        def add(kind, expected, **kw):
            cs.append(Case(kind, level, n, rpn, kw.pop("fault", kind), expected, default=kind in picked, **kw))

        def after_loss(lost_ranks, **bad):
            if level == "pfs":
                return {9}
            if cache_recoverable(level, nodes, lost_ranks, **bad):
                return {9}
            # step 4 lost the same nodes but its redundancy is intact
            return {4} if bad and cache_recoverable(level, nodes, lost_ranks) else {None}

        ranks_of = lambda ns: [r for r in range(n) if nodes[r] in ns]  # noqa: E731
        add("crash", {9}, note="SIGKILL of one rank mid-compute")
        add("lose-1-node", after_loss(ranks_of([1])), damage=("lose", [1]))
        if level in ("partner", "xor", "rs"):
            groups = encoding_groups(nodes, GROUP)
            g0 = groups[0]
            two = sorted({nodes[r] for r in g0})[:2]
            add("lose-2-same-group", after_loss(ranks_of(two)), damage=("lose", two))
            if len({nodes[r] for r in g0}) >= 3:
                three = sorted({nodes[r] for r in g0})[:3]
                add("lose-3-same-group", after_loss(ranks_of(three)), damage=("lose", three))
            if len(groups) > 1:
                diff = sorted({nodes[g0[0]], nodes[groups[1][-1]]})
                if len(diff) == 2:
                    add("lose-2-diff-groups", after_loss(ranks_of(diff)), damage=("lose", diff))
            holders = partner_holders(nodes)
            r = next((r for r in range(n) if holders[r] is not None and nodes[holders[r]] != nodes[r]), None)
            if r is not None:
                pair = sorted({nodes[r], nodes[holders[r]]})
                add("lose-node+partner", after_loss(ranks_of(pair)), damage=("lose", pair))
        # damage to one rank's files of step 9 (rank 1)
        fallback = {4} if level == "local" else {9}
        redundant = level in ("partner", "xor", "rs")
        fixable = {9} if not redundant or cache_recoverable(level, nodes, [], bad_data=[1]) else {4}
        for kind in ("flip-data", "truncate-data", "delete-data", "flip-manifest", "delete-manifest",
                     "garbage-manifest"):
            add(kind, fallback if level == "local" else fixable, damage=(kind, 1))
        if level in ("xor", "rs") and n >= 2:
            g = next(g for g in encoding_groups(nodes, GROUP) if len(g) > 1)
            owner, member = g[0], g[1]
            add("flip-parity", {9}, damage=("flip-parity", owner))
            add("flip-parity+lose-member", after_loss(ranks_of([nodes[member]]), bad_parity=[owner])
                if nodes[owner] != nodes[member] else {9}, damage=("flip-parity+lose", owner, nodes[member]))
            add("flip-encoded.json+lose-member", after_loss(ranks_of([nodes[member]]), bad_parity=[owner])
                if nodes[owner] != nodes[member] else {9}, damage=("flip-info+lose", owner, nodes[member]))
        if level == "partner":
            holders = partner_holders(nodes)
            src = next(r for r in range(n) if holders[r] is not None)
            add("flip-copy", {9}, damage=("flip-copy", src, holders[src]))
            add("flip-copy+lose-owner", after_loss(ranks_of([nodes[src]]), bad_copy=[src]),
                damage=("flip-copy+lose", src, holders[src]))
        # kill the job at each phase of the checkpoint of step 9 (rank 1; retire: while removing 4)
        phases = ["write", "written", "commit", "committed", "retire"]
        if redundant:
            phases.insert(2, "encode")
        for ph in phases:
            exp = {"committed": {4, 9}, "retire": {14}}.get(ph, {4})
            if ph == "commit" and redundant:
                # rank 1 dies before its manifest; a rank that wrote its own (after the agreement
                # that every rank's data and redundancy are complete) makes step 9 committed, and
                # rank 1 is then rebuilt like a lost rank: 9 or 4, depending on that race
                exp = {4, 9}
            add(f"kill@{ph}", exp, fault=f"{ph}:1:{4 if ph == 'retire' else 9}", crash=False)
        # I/O errors mid-checkpoint on one rank: every rank raises, the app goes on (14 commits)
        errs = [("enospc@write", "write"), ("enospc@commit", "commit")]
        if redundant:
            errs.append(("enospc@encode", "encode"))
        if level == "pfs":
            errs.append(("enospc@pfs-write", "pfs-write"))
        for kind, ph in errs:
            add(kind, {14}, fault=f"{ph}:{n - 1}:9:error", crash=False, errors=True)
        if level == "pfs":
            for ph in ("pfs-write", "pfs-written", "pfs-commit", "pfs-renamed"):
                add(f"kill@{ph}", {4}, fault=f"{ph}:{0 if 'commit' in ph or 'renamed' in ph else 1}:9",
                    crash=False, damage=("lose-all",), note="then every cache lost: pfs only")
            for kind, exp in (("flip-h5-dataset", {4}), ("truncate-node-file", {4}), ("delete-node-file", {4}),
                              ("flip-COMMITTED.json", {4}), ("delete-COMMITTED.json", {4}),
                              ("flip-master", {9})):
                add(kind, exp, damage=(kind,), note="every cache lost: pfs only")
        for c in cs:
            c.order = next(order)
        out += cs
    return out


ALL_CASES = cases()


# ---------------------------------------------------------------------- faults under other configurations
# The cases above run with the default configuration. These put a fault into the checkpoint of
# step 9 under the configurations that move work out of checkpoint() (background redundancy or
# pfs flush, new files at every checkpoint), where a fault lands in a background thread or
# surfaces at a later call: 4 ranks on 2 nodes, one job with the fault, then a restart. Each
# states the invariants instead of one step (which step a background fault leaves depends on
# timing): the job ends (no hang); an injected error is raised on every rank alike (so is a
# sys.exit() or an interrupt in a background thread; in the main thread they end the job through
# an abort, as a kill does); restart() returns a step no older than the last one checkpoint()
# returned (nothing committed is lost) and no newer than the job could commit; its arrays are
# that step's, bitwise.
BACKGROUND_CONFIGS = {
    "bg": {"background": True},
    "bg-new": {"background": True, "reuse_files": False},
    "async": {"async_flush": True},          # pfs only: the flush in the background, the cache level in line
}
BACKGROUND_ACTIONS = ("kill", "error", "exit", "interrupt")
BACKGROUND_DEFAULT = {("partner", "bg", "error@background"), ("xor", "bg-new", "kill@background"),
                      ("pfs", "bg-new", "error@pfs-layout"), ("pfs", "async", "exit@pfs-written")}


class ConfigCase:
    def __init__(self, level, config, action, phase, order):
        self.level, self.config, self.action, self.phase, self.order = level, config, action, phase, order
        self.kind = f"{config}-{action}@{phase}"
        self.nprocs, self.rpn = 4, 2
        # the rank: one that is not rank 0 (which prints), an aggregator for the layout, rank 0
        # for what only rank 0 does
        rank = {"pfs-layout": 2, "pfs-commit": 0, "pfs-renamed": 0}.get(phase, 1 if action != "error" else 3)
        self.fault = f"{phase}:{rank}:{4 if phase == 'retire' else 9}:{action}"   # retire: while removing 4
        # the newest step it can leave: an error (or an exit or interrupt in a background thread,
        # reported as one) lets the job go on to checkpoint 14 (rank 0 is killed at step 16)
        self.newest = 9 if action == "kill" and phase != "retire" else 14
        self.default = (level, config, f"{action}@{phase}") in BACKGROUND_DEFAULT

    @property
    def id(self):
        return f"{self.level}-4r2n-{self.kind}"


def config_cases():
    out, order = [], itertools.count(20000)
    for level, config in itertools.product(("partner", "xor", "rs", "pfs"), BACKGROUND_CONFIGS):
        if config == "async" and level != "pfs":
            continue
        phases = ["write", "written", "commit", "committed", "retire"]
        if level == "pfs":
            phases += ["pfs-write", "pfs-written", "pfs-commit", "pfs-renamed"]
            if not BACKGROUND_CONFIGS[config].get("reuse_files", True):
                phases.insert(5, "pfs-layout")        # laid out at every step only with new files
        else:
            phases[2:2] = ["encode", "background"]
        for phase, action in itertools.product(phases, BACKGROUND_ACTIONS):
            out.append(ConfigCase(level, config, action, phase, next(order)))
    return out


CONFIG_CASES = config_cases()


ENOSPC_LEVELS = {"local": True, "xor": True, "partner": False, "pfs": False}   # level: in the default subset
READ_ONLY_KEY = "pfs-4r2n-read-only-pfs_dir"
# every item of this module, key: default (True: always runs; False: the rotating pool, see the docstring)
MATRIX_KEYS = {c.id: c.default for c in ALL_CASES}
MATRIX_KEYS.update({f"{level}-4r4n-real-ENOSPC": d for level, d in ENOSPC_LEVELS.items()})
MATRIX_KEYS[READ_ONLY_KEY] = True
MATRIX_KEYS.update({c.id: c.default for c in CONFIG_CASES})
assert len(MATRIX_KEYS) == len(ALL_CASES) + len(ENOSPC_LEVELS) + 1 + len(CONFIG_CASES), "matrix keys must be unique"


def matrix_marks(key):
    """The marks of one item: its key for the selection hook (tests/mpi/conftest.py); the
    rotating pool is also ``slow``."""
    return [pytest.mark.matrix(key)] + ([] if MATRIX_KEYS[key] else [pytest.mark.slow])


def params():
    for c in ALL_CASES:
        yield pytest.param(c, id=c.id, marks=matrix_marks(c.id))


@pytest.fixture(scope="module")
def crashed():
    """Base states (kill one rank at step 12) per (level, nprocs, rpn), copied for each case."""
    made, dirs = {}, []

    def get(level, nprocs, rpn):
        key = (level, nprocs, rpn)
        if key not in made:
            d = base_dir()
            dirs.append(d)
            res = job(nprocs, rpn, d, level, "--crash-at", 12, "--crash-rank", nprocs - 1)
            assert res.returncode != 0 and "CKPT 9" in res.stdout, str(res)
            made[key] = d
        return made[key]
    yield get
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def apply_damage(case, root):
    d = case.damage
    if d is None:
        return
    what, rpn = d[0], case.rpn
    if what == "lose":
        lose_nodes(root, d[1])
    elif what == "lose-all":
        lose_every_cache(root)
    elif what == "flip-data":
        flip(rank_file(root, rpn, d[1], "dat"))
    elif what == "truncate-data":
        path = rank_file(root, rpn, d[1], "dat")
        os.truncate(path, os.path.getsize(path) - 8)
    elif what == "delete-data":
        os.unlink(rank_file(root, rpn, d[1], "dat"))
    elif what == "flip-manifest":
        flip_json_checksum(rank_file(root, rpn, d[1], "json"))
    elif what == "delete-manifest":
        os.unlink(rank_file(root, rpn, d[1], "json"))
    elif what == "garbage-manifest":
        with open(rank_file(root, rpn, d[1], "json"), "r+b") as f:
            f.seek(10)
            f.write(b"\x00garbage")
    elif what == "flip-parity":
        flip(held_file(root, rpn, d[1], "parity.dat"), 0)
    elif what == "flip-parity+lose":
        flip(held_file(root, rpn, d[1], "parity.dat"), 0)
        lose_nodes(root, [d[2]])
    elif what == "flip-info+lose":
        flip_json_checksum(held_file(root, rpn, d[1], "encoded.json"), b'"parity_checksums": [')
        lose_nodes(root, [d[2]])
    elif what in ("flip-copy", "flip-copy+lose"):
        src, holder = d[1], d[2]
        flip(held_file(root, rpn, holder, f"partner_{src:06d}.dat"))
        if what == "flip-copy+lose":
            lose_nodes(root, [src // rpn])
    else:   # pfs damage, with every cache lost
        lose_every_cache(root)
        s = pfs_step(root)
        if what == "flip-h5-dataset":
            flip_pfs_dataset(root, rank=1, node=1 // case.rpn)   # rank 1's dataset is in its node's file
        elif what == "truncate-node-file":
            p = os.path.join(s, "node_000000.h5")
            os.truncate(p, os.path.getsize(p) - 100)
        elif what == "delete-node-file":
            os.unlink(os.path.join(s, "node_000000.h5"))
        elif what == "flip-COMMITTED.json":
            flip_json_checksum(os.path.join(s, "COMMITTED.json"))
        elif what == "delete-COMMITTED.json":
            os.unlink(os.path.join(s, "COMMITTED.json"))
        elif what == "flip-master":
            flip(os.path.join(s, "checkpoint.h5"))
        else:
            raise AssertionError(what)


def restart_restored(case, root, tmp_path, config=None):
    """Launch the job again to restart and dump its arrays: (result, restored step, None or what
    differs from that step's state, how it came back: pfs / rebuilt / cache / -)."""
    res = job(case.nprocs, case.rpn, root, case.level, "--steps", 0, "--restored", tmp_path / "restored",
              config=config, env={"HPCCKPT_LOG_LEVEL": "INFO"})
    assert res.returncode == 0, str(res)
    got = step_of(res)
    wrong = check_restored(tmp_path / "restored", case.nprocs, got)
    via = ("pfs" if "from pfs" in res.stderr else "rebuilt" if "rebuilt rank" in res.stderr
           else "cache" if got is not None else "-")
    return res, got, wrong, via


@pytest.mark.parametrize("case", list(params()))
def test_fault(case, crashed, tmp_path):
    n, rpn, level = case.nprocs, case.rpn, case.level
    root = base_dir()
    try:
        fail_lines = []
        if case.crash:
            shutil.copytree(crashed(level, n, rpn), root, symlinks=True)
        else:   # a run of its own with the fault injected
            args = ["--crash-at", 16 if case.errors else -1, "--crash-rank", 0]
            res = job(n, rpn, root, level, *args, env={"_HPCCKPT_FAULT": case.fault})
            assert res.returncode != 0, f"the fault {case.fault} did not stop the job:\n{res}"
            if case.errors:
                fail_lines = res.lines("CKPTFAIL")
                assert len(fail_lines) == n, str(res)           # raised on every rank
                assert all(f.startswith("9 CheckpointWriteError") for f in fail_lines), str(res)
                assert "CKPT 14" in res.stdout, str(res)          # and the app went on
                if level != "pfs":                              # no rank kept a piece of step 9
                    assert not glob.glob(os.path.join(root, "node*", "app", "step_0000000009", "rank_*")), \
                        os.listdir(os.path.join(root, "node0", "app"))
        apply_damage(case, root)
        res, got, wrong, via = restart_restored(case, root, tmp_path)
        warnings = [ln.split("WARNING: ", 1)[1] for ln in res.stderr.splitlines() if "WARNING: " in ln
                    and "cannot survive" not in ln]
        record("fault_matrix", {
            "case": case.id, "order": case.order, "level": level, "ranks": n, "nodes": n // rpn + (n % rpn > 0),
            "fault": case.kind, "expected": sorted(case.expected, key=str), "observed": got, "via": via,
            "ok": wrong is None and got in case.expected, "note": case.note,
            "message": (fail_lines[0].split(" ", 2)[2][:160] if fail_lines else (warnings[0][:160] if warnings else "")),
        })
        assert wrong is None, wrong
        assert got in case.expected, f"restart() returned {got}, expected one of {case.expected}\n{res}"
        if got is None:   # a warning says why; with nothing left at all, an INFO line says so
            assert warnings or "no checkpoint to restart from" in res.stderr, "a None restart must say why"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=matrix_marks(c.id)) for c in CONFIG_CASES])
def test_fault_in_background_work(case, tmp_path):
    n, rpn, level = case.nprocs, case.rpn, case.level
    root = base_dir()
    try:
        config = BACKGROUND_CONFIGS[case.config]
        args = ["--crash-at", -1 if case.action == "kill" else 16, "--crash-rank", 0]
        res = job(n, rpn, root, level, *args, env={"_HPCCKPT_FAULT": case.fault}, config=config)
        assert res.returncode != 0, f"the job ended normally:\n{res}"      # killed by the fault, or at step 16
        done = [int(ln.split()[0]) for ln in res.lines("CKPT ")]
        fails = res.lines("CKPTFAIL ")
        cause = {"error": "(injected fault)", "exit": "SystemExit: 5", "interrupt": "KeyboardInterrupt"}.get(case.action)
        if fails:      # raised on every rank alike, at one call (an error after the manifest: a CollectiveError)
            assert case.action != "kill" and case.phase != "retire", str(res)
            assert len({f.split()[0] for f in fails}) == 1, str(res)
            assert all(f.split()[1] in ("CheckpointWriteError", "CollectiveError") and cause in f for f in fails), str(res)
        if case.action == "error" and case.phase != "retire":
            assert len(fails) == n, str(res)      # and the job went on to step 16
        elif len(fails) < n and case.phase != "retire":
            # a kill, or a sys.exit() or an interrupt in the main thread: that rank ended the job at
            # checkpoint 9 (it aborts it: the others raised a CollectiveError, printed if the abort let them)
            assert max(done) <= 9 and not any(f"rank={case.fault.split(':')[1]} " in f for f in fails), str(res)
        # (a failed removal only warns: an error at retire lets the job go on)
        res, got, wrong, via = restart_restored(case, root, tmp_path, config)
        oldest = max(done)          # at least 4, committed before the fault
        ok = wrong is None and got is not None and oldest <= got <= case.newest
        record("fault_matrix", {
            "case": case.id, "order": case.order, "level": level, "ranks": n, "nodes": n // rpn,
            "fault": f"{case.action}@{case.phase} ({case.config})", "expected": list(range(oldest, case.newest + 1, 5)),
            "observed": got, "via": via, "ok": ok, "note": json.dumps(config),
            "message": fails[0].split(" ", 2)[2][:160] if fails else ""})
        assert wrong is None, wrong
        assert got is not None and oldest <= got <= case.newest, \
            f"restart() returned {got}; the last checkpoint() that returned was {oldest}\n{res}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------- real full disks, read-only pfs
def _mount(args, target):
    os.makedirs(target, exist_ok=True)
    r = subprocess.run(["mount", *args, target], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount ({' '.join(args)}): {r.stderr.strip() or r.stdout.strip()} (needs root)")


def _umount(target):
    subprocess.run(["umount", "-l", target], capture_output=True)


@pytest.mark.parametrize("level", [pytest.param(level, marks=matrix_marks(f"{level}-4r4n-real-ENOSPC"))
                                   for level in ENOSPC_LEVELS])
def test_real_enospc_on_a_small_tmpfs(level, tmp_path):
    """A 2 MiB tmpfs filled up by another file mid-run: the checkpoint fails on every rank with
    CheckpointWriteError, the previous one stays restorable, and once the file is gone the
    application checkpoints again."""
    n, rpn = 4, 1
    mnt = str(tmp_path / "small")
    _mount(["-t", "tmpfs", "-o", "size=2m", "tmpfs"], mnt)
    try:
        root = str(tmp_path / "r")
        cache = os.path.join(mnt if level != "pfs" else root, "node{node}")
        pfs = os.path.join(mnt if level == "pfs" else root, "pfs")
        ballast = os.path.join(mnt, "ballast")
        cfg = json.dumps({"ranks_per_node": rpn, "group_size": GROUP, "rs_parity": RS_M})
        common = ["--cache", cache, "--pfs", pfs, "--level", level, "--config-json", cfg]
        res = run_mpi(n, "matrix_app.py", *common, "--fill", f"{ballast}:12", "--crash-at", 16,
                      timeout=TIMEOUT)
        fails = res.lines("CKPTFAIL")
        assert res.returncode != 0 and len(fails) == n, str(res)
        assert all(f.startswith("14 CheckpointWriteError") for f in fails), str(res)
        assert "No space left" in fails[0], str(res)
        if level == "pfs":        # the cache committed 14; pfs must still hold 9
            shutil.rmtree(os.path.join(root, "node0"))
        res = run_mpi(n, "matrix_app.py", *common, "--steps", 25, "--fill", f"{ballast}:-1", "--unfill-at-start", "--restored",
                      tmp_path / "restored", env={"HPCCKPT_LOG_LEVEL": "INFO"}, timeout=TIMEOUT)
        assert res.returncode == 0, str(res)
        got = step_of(res)
        wrong = check_restored(tmp_path / "restored", n, got)
        went_on = [ln for ln in res.lines("CKPT") if ln.split()[0] in ("14", "19", "24")]
        record("fault_matrix", {
            "case": f"{level}-{n}r{n // rpn}n-real-ENOSPC", "order": 10000, "level": level, "ranks": n,
            "nodes": n // rpn, "fault": "tmpfs full (2 MiB) at checkpoint 14", "expected": [9], "observed": got,
            "via": "pfs" if level == "pfs" else "cache", "ok": wrong is None and got == 9 and len(went_on) == 3,
            "note": "then the file is removed: checkpoints 14, 19, 24 succeed", "message": fails[0].split(" ", 2)[2][:160]})
        assert wrong is None, wrong
        assert got == 9 and len(went_on) == 3, str(res)
    finally:
        _umount(mnt)


@pytest.mark.matrix(READ_ONLY_KEY)
def test_read_only_pfs_dir(tmp_path):
    """pfs_dir read-only (a read-only bind mount: chmod does not stop root): restart from pfs
    works, new pfs checkpoints fail on every rank with a clear error, nothing hangs."""
    n, rpn = 4, 2
    root = str(tmp_path / "r")
    cfg = json.dumps({"ranks_per_node": rpn})
    common = ["--cache", os.path.join(root, "node{node}"), "--level", "pfs", "--config-json", cfg]
    res = run_mpi(n, "matrix_app.py", *common, "--crash-at", 12, timeout=TIMEOUT)
    assert res.returncode != 0 and "CKPT 9" in res.stdout, str(res)
    lose_every_cache(root)
    pfs = os.path.join(root, "pfs")
    _mount(["--bind", pfs], pfs)
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", pfs], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")
        res = run_mpi(n, "matrix_app.py", *common, "--steps", 15, "--restored", tmp_path / "restored",
                      timeout=TIMEOUT)
        assert res.returncode == 0, str(res)
        got = step_of(res)
        wrong = check_restored(tmp_path / "restored", n, got)
        fails = res.lines("CKPTFAIL")
        record("fault_matrix", {
            "case": f"pfs-{n}r{n // rpn}n-read-only-pfs_dir", "order": 10001, "level": "pfs", "ranks": n,
            "nodes": n // rpn, "fault": "pfs_dir read-only, every cache lost", "expected": [9], "observed": got,
            "via": "pfs", "ok": wrong is None and got == 9 and len(fails) == n,
            "note": "restore reads; the next pfs checkpoint fails on every rank", "message": fails[0].split(" ", 2)[2][:160] if fails else ""})
        assert wrong is None and got == 9, str(res)
        assert len(fails) == n and all("Read-only file system" in f for f in fails), str(res)
    finally:
        _umount(pfs)
