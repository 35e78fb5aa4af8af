"""Online recovery (hpcckpt.online, ULFM) on the virtual cluster: a node's ranks and files are
lost while the job runs, and the job goes on inside the same mpirun.

7 processes, 2 per node (``jobs/vcluster mpirun --ft -n 7 --ranks-per-node 2``): workers 0,1 on
n1, 2,3 on n2, 4 on n3, and the spares (world ranks 5, 6) on n3 and n4. ranks_per_node = "auto",
one cache_dir string for every node (the node-local tmpfs). At a known step worker 0 waits; the
test runs ``jobs/vcluster lose n2`` (every application process of n2 SIGKILLed, its tmpfs
unmounted: workers 2 and 3 and their checkpoint files are gone; the MPI launcher's daemon stays,
since Open MPI 5.0.11's runtime ends the whole job when it loses one, ULFM or not) and lets it go
on. The spares take numbers 2 and 3 from n3 and n4: detected again, that placement would be
another rank -> node map ((0,0,1,2,1) instead of (0,0,1,1,2)) and the checkpoints would not
match it; hpcckpt.online pins the original map (they stand in for n2), so the survivors restore
from their own caches and ranks 2 and 3 are rebuilt from the partner copies / parity held on
the other nodes. The final field equals a failure-free run's, bit for bit.

Open MPI only (ULFM); under MPICH the test skips with the reason.
"""
import json
import os
import re
import time

import numpy as np
import pytest

import vc_harness as vh
from hpcckpt import mpi_launch

pytestmark = pytest.mark.vcluster
STEPS, EVERY, PAUSE = 14, 3, 9         # checkpoints after steps 2, 5, 8, 11, 13: n2 lost at step 9 -> from 8
APP = "vc_online_app.py"


@pytest.fixture(scope="module")
def ulfm(request):
    """The module's cluster, when this MPI has ULFM (checked before any cluster is made)."""
    path = vh.mpiexec_path()
    if path is not None and not mpi_launch.detect(path).supports_ulfm:
        pytest.skip(f"online recovery needs ULFM (Open MPI 5 with --with-ft ulfm); "
                    f"{mpi_launch.detect(path).flavour.title} has none")
    return request.getfixturevalue("cluster")


def write_config(path, name, extra=""):
    path.write_text(f'name = "{name}"\ncache_dir = "{vh.LOCAL}/hpcckpt-{{user}}"\npfs_dir = "{path.parent}/pfs"\n'
                    f'ranks_per_node = "auto"\ngroup_size = 3\n{extra}')
    return str(path)


def job(cluster, cfg, level, out, *extra, during=None):
    return cluster.mpirun(7, APP, "--config", cfg, "--spares", 2, "--steps", STEPS, "--every", EVERY,
                          "--level", level, "--out", out, *extra, rpn=2, ft=True, timeout=150, during=during)


def done(res):
    lines = res.lines("DONE")
    assert len(lines) == 1, str(res)
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def reference(ulfm, tmp_path_factory):
    """The failure-free run's final field (the same launch, layout and levels)."""
    d = tmp_path_factory.mktemp("online-ref")
    res = job(ulfm, write_config(d / "run.toml", "vc-online-ref"), "partner", d / "ref.npy")
    assert res.returncode == 0, str(res)
    assert done(res)["recoveries"] == 0, str(res)
    return np.load(d / "ref.npy")


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_node_lost_while_running_recovers_online(ulfm, reference, tmp_path, level):
    cluster = ulfm
    signals = tmp_path / "signals"
    signals.mkdir()
    killed = []

    def lose_n2(deadline):
        """While the job runs (bounded by the job's deadline): when worker 0 pauses at step PAUSE,
        lose n2, then let it go on."""
        while not (signals / "paused").exists():
            if time.monotonic() > deadline - 30:
                raise AssertionError(f"the job never reached step {PAUSE}")
            time.sleep(0.05)
        killed.append(cluster.lose("n2"))
        (signals / "resume").touch()

    cfg = write_config(tmp_path / "run.toml", f"vc-online-{level}")
    try:
        res = job(cluster, cfg, level, tmp_path / "out.npy", "--pause-at", PAUSE, "--signal-dir", signals,
                  during=lose_n2)
    finally:
        cluster.boot("n2")                 # a fresh, empty n2 for the next test of the module
    assert killed and "n2: application processes killed, tmpfs gone" in killed[0].stdout, str(res)
    hosts = {tuple(ln.split()[:2]): ln.split()[2] for ln in res.lines("HOST")}
    assert hosts == {("worker", "0"): "n1", ("worker", "1"): "n1", ("worker", "2"): "n2", ("worker", "3"): "n2",
                     ("worker", "4"): "n3", ("spare", "5"): "n3", ("spare", "6"): "n4"}, str(res)
    assert res.returncode == 0, str(res)                    # one mpirun: it recovered without ending
    info = done(res)
    assert info == {"recoveries": 1, "spares_left": 0, "host": "n1"}, str(res)
    recovered = [json.loads(ln) for ln in res.lines("RECOVERED")]
    assert len(recovered) == 5, str(res)                    # every worker of the recovered job
    for r in recovered:
        assert r["lost"] == [2, 3] and r["by"] == [5, 6] and r["from"] == 8 and r["attempts"] == 1, str(res)
    # the replacements run on n3 (beside worker 4) and n4
    assert sorted((r["world_rank"], r["host"]) for r in recovered) == [(0, "n1"), (1, "n1"), (4, "n3"), (5, "n3"),
                                                                         (6, "n4")], str(res)
    # ranks 2 and 3's files went with n2; the replacements' caches had none: rebuilt from the level
    assert re.search(rf"step 8: rebuilt rank\(s\) \[2, 3\] from the {level} level", res.stderr), str(res)
    final = np.load(tmp_path / "out.npy")
    assert final.dtype == reference.dtype and final.shape == reference.shape
    assert final.tobytes() == reference.tobytes()          # bit for bit
