"""One conformance test for every registered level (hpcckpt/levels/registry.py).

What a level promises follows from its class alone (``redundant``, ``restores``), so a new level
is tested here by being registered: every level restarts bitwise after a process crash and keeps
at most ``keep`` committed steps; after a node is lost or one rank's newest data is damaged, a
*redundant* level rebuilds the same step from the other nodes, a *restoring* level restores it
from its own copy, and a level that is neither falls back (to the older step it still has
everywhere, or to none). 4 ranks on 4 virtual nodes; app.py checkpoints at steps 4 and 9 and
rank 3 is killed at step 12.

Faults through the interface (``faults.wrap_level``, ``_HPCCKPT_LEVEL_FAULT``): for every level,
an injected ENOSPC at each phase that level runs (``phases``) on one rank makes every rank raise
the same error (no hang), or, at a restart, makes the restart fall back; the relaunch restores
bitwise (after the loss of that rank's node, where the level survives one), never taking what the
failed phase left half-written. test_mirror_level.py runs them on a level defined in a test.
"""
import glob
import json
import os
import shutil

import pytest

from harness import outputs, restart_step, run_mpi
from hpcckpt.config import Config
from hpcckpt.levels import registry
from hpcckpt.levels.base import Level, LevelContext

pytestmark = pytest.mark.mpi
NPROCS, STEPS, EVERY, CRASH = 4, 20, 5, 12        # committed: 4 and 9 (keep = 2)
CONFIG = {"ranks_per_node": 1, "group_size": 4, "rs_parity": 2, "keep": 2}
FAULT_CONFIG = {**CONFIG, "pfs_direct_io": True}   # a level may prepare (pfs: the files laid out first)
FAULT_STEP, FAULT_RANK = 9, NPROCS - 1
FAULT_TIMEOUT = 60                                 # a job with a fault (about 2 s): a hang costs no more than this
HERE = os.path.dirname(os.path.abspath(__file__))


def job_env(extra=None):
    """The environment of a job: the modules of the levels registered outside hpcckpt (a test's:
    ``HPCCKPT_LEVEL_MODULES``, found on ``PYTHONPATH``), and ``extra``."""
    env = dict(extra or {})
    modules = sorted({c.__module__ for c in registry.classes().values()} - set(registry.BUILTIN_MODULES))
    if modules:
        env.setdefault(registry.MODULES_ENV, ",".join(modules))
        env.setdefault("PYTHONPATH", os.pathsep.join([HERE] + [p for p in os.environ.get("PYTHONPATH", "")
                                                               .split(os.pathsep) if p]))
    return env


def app(root, level, *args, expect_ok=True, config=CONFIG, env=None, timeout=240):
    res = run_mpi(NPROCS, "app.py", "--cache", os.path.join(root, "cache", "node{node}"), "--steps", STEPS,
                  "--every", EVERY, "--uneven", "--level", level, "--config-json", json.dumps(config), *args,
                  env=job_env(env), timeout=timeout)
    if expect_ok is not None:
        assert (res.returncode == 0) == expect_ok, str(res)
    return res


def committed_cache_steps(root):
    """Steps with a committed manifest of some rank in some node's cache."""
    found = glob.glob(os.path.join(root, "cache", "node*", "app", "step_*", "rank_*.json"))
    return sorted({int(os.path.basename(os.path.dirname(p))[5:]) for p in found})


def committed_pfs_steps(root):
    return sorted(int(os.path.basename(os.path.dirname(p))[5:])
                  for p in glob.glob(os.path.join(root, "cache", "pfs", "app", "step_*", "COMMITTED.json")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    app(str(d), "local", "--out", str(d / "out"), "--no-restart")
    return outputs(str(d / "out"))


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """{level: a directory where a run of that level crashed at step 12} (made once, copied per case)."""
    made = {}

    def get(level):
        if level not in made:
            d = tmp_path_factory.mktemp(f"crashed-{level}")
            app(str(d), level, "--crash-at", CRASH, "--crash-rank", NPROCS - 1, expect_ok=False)
            made[level] = str(d)
        return made[level]
    return get


def lose_node(root, node):
    shutil.rmtree(os.path.join(root, "cache", f"node{node}"))


def damage_newest(root, rank):
    (path,) = glob.glob(os.path.join(root, "cache", "node*", "app", "step_0000000009", f"rank_{rank:06d}.dat"))
    with open(path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))


def survives_a_node(level):
    cls = registry.level_class(level)
    return cls.redundant or cls.restores


def expected_after_loss(level, older_everywhere):
    if survives_a_node(level):
        return 9
    return 4 if older_everywhere else None


@pytest.mark.parametrize("level", list(registry.LEVELS))
@pytest.mark.parametrize("fault", ["crash", "node-lost", "damaged"])
def test_level_contract(level, fault, reference, crashed, tmp_path):
    root = str(tmp_path / "run")
    shutil.copytree(crashed(level), root)
    assert committed_cache_steps(root) == [4, 9]                       # keep = 2: the older ones retired
    if level == "pfs":
        assert committed_pfs_steps(root) == [4, 9]
    if fault == "crash":
        expected = 9
    elif fault == "node-lost":
        lose_node(root, NPROCS - 1)
        expected = expected_after_loss(level, older_everywhere=False)
    else:
        damage_newest(root, 1)
        expected = expected_after_loss(level, older_everywhere=True)
    res = app(root, level, "--out", os.path.join(root, "out"))
    assert restart_step(res) == expected, str(res)
    assert outputs(os.path.join(root, "out")) == reference           # bitwise, whatever the path
    # keep = 2 of this run (a run that restored nothing rewrote steps 4 and 9 under its own epoch)
    assert committed_cache_steps(root) == [14, 19]


# ---------------------------------------------------------------------- faults through the interface
SAVE_PHASES = ("prepare", "protect", "retire")
RESTART_PHASES = ("offers", "recover", "restore")


def runs_prepare(cls, config):
    """Whether the save protocol calls ``prepare`` of level ``cls`` under ``config`` (its
    ``prepares()``, asked of an object made without MPI: a level that overrides it must not need
    MPI to answer)."""
    if cls.prepares is Level.prepares:
        return False
    return bool(cls(LevelContext(None, None, None, config, config.level_options(cls.name))).prepares())


def phases(level, config=FAULT_CONFIG):
    """The phases of the Level interface that a checkpoint and a restart at ``level`` (a name, or
    a Level class not registered yet) run."""
    cls = level if isinstance(level, type) else registry.level_class(level)
    cfg = Config.load(name="app", cache_dir="/nonexistent/node{node}", pfs_dir="/nonexistent/pfs", environ={},
                      **config)
    out = [p for p in SAVE_PHASES if p != "prepare" or runs_prepare(cls, cfg)]
    if cls.redundant:
        out.append("recover")
    if cls.restores:
        out += ["offers", "restore"]
    return out


def fault_cases(levels, kinds):
    """(level name, phase) of the phases in ``kinds`` that ``levels`` (names or Level classes) run."""
    return [(lv.name if isinstance(lv, type) else lv, ph) for lv in levels for ph in phases(lv) if ph in kinds]


def fault_env(level, phase, rank, step=FAULT_STEP, env=None):
    return {**(env or {}), "_HPCCKPT_LEVEL_FAULT": f"{level}:{phase}:{rank}:{step}:error"}


def errors_of(res):
    """{rank: error class} of the ERROR lines app.py prints when hpcckpt raised."""
    out = {}
    for line in res.lines("ERROR"):
        cls, rank = line.split()[:2]
        out[int(rank.removeprefix("rank="))] = cls
    return out


def check_raised_everywhere(res, label):
    """Every rank raised the same HpcCkptError (no hang: run_mpi's timeout), naming the fault."""
    assert res.returncode != 0, str(res)
    raised = errors_of(res)
    assert sorted(raised) == list(range(NPROCS)) and len(set(raised.values())) == 1, str(res)
    assert label in res.stdout, str(res)


def save_fault(root, level, phase, *, env=None, config=FAULT_CONFIG):
    """A run whose ``phase`` of ``level`` fails on FAULT_RANK at step 9 (checkpoints 4 and 9):
    every rank raises; or, where the protocol only warns about it (``retire``), the run goes on.
    Returns the steps of checkpoints the application was told were taken."""
    res = app(root, level, "--out", os.path.join(root, "out0"), expect_ok=None, config=config,
              env=fault_env(level, phase, FAULT_RANK, env=env), timeout=FAULT_TIMEOUT)
    label = f"{level}.{phase}"
    if res.returncode == 0 and phase == "retire":
        assert label in res.stdout + res.stderr, str(res)         # the fault fired: a warning names it
    else:
        check_raised_everywhere(res, label)
    return [int(line.split()[0]) for line in res.lines("CKPT")], res


def check_relaunch(root, level, reference, taken, *, env=None, config=FAULT_CONFIG):
    """Relaunch without a fault (after the loss of FAULT_RANK's node when the level survives one):
    a step at least as new as the newest that checkpoint() returned, restored bitwise."""
    lose = survives_a_node(level)
    if lose:
        lose_node(root, FAULT_RANK)
    res = app(root, level, "--out", os.path.join(root, "out"), config=config, env=env)
    step = restart_step(res)
    if taken:
        assert step is not None and step >= max(taken), (taken, str(res))
    assert outputs(os.path.join(root, "out")) == reference, str(res)
    return step


@pytest.mark.parametrize("level,phase", fault_cases(registry.LEVELS, SAVE_PHASES))
def test_a_save_phase_fails_on_one_rank(level, phase, reference, tmp_path):
    root = str(tmp_path / "run")
    taken, _ = save_fault(root, level, phase)
    assert taken[:1] == [4], taken
    assert check_relaunch(root, level, reference, taken) in (4, 9)


def restart_fault(root, level, phase, reference, *, env=None, config=CONFIG):
    """``root`` holds steps 4 and 9 of a crashed run; FAULT_RANK's node is lost, so that the
    restart needs the level (recover, offers, restore). A fault in ``phase`` of step 9 makes every
    rank raise, or the restart fall back to step 4 (bitwise); a relaunch without it restores 9."""
    lose_node(root, FAULT_RANK)
    rank = 0 if phase == "offers" else FAULT_RANK     # offers: rank 0's
    res = app(root, level, "--out", os.path.join(root, "out"), expect_ok=None, config=config,
              env=fault_env(level, phase, rank, env=env), timeout=FAULT_TIMEOUT)
    label = f"{level}.{phase}"
    assert label in res.stdout + res.stderr, str(res)
    if res.returncode == 0:
        assert restart_step(res) in (4, None), str(res)     # fell back: never what the failed phase left
        assert outputs(os.path.join(root, "out")) == reference
        return
    check_raised_everywhere(res, label)
    res = app(root, level, "--out", os.path.join(root, "out"), config=config, env=env)
    assert restart_step(res) == 9, str(res)
    assert outputs(os.path.join(root, "out")) == reference


@pytest.mark.parametrize("level,phase", fault_cases(registry.LEVELS, RESTART_PHASES))
def test_a_restart_phase_fails_on_one_rank(level, phase, reference, crashed, tmp_path):
    root = str(tmp_path / "run")
    shutil.copytree(crashed(level), root)
    restart_fault(root, level, phase, reference)
