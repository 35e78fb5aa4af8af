"""hpcckpt on a virtual cluster: 4 nodes, each a set of Linux namespaces (jobs/vcluster) with its
own hostname, network (MPI over TCP between nodes), /dev/shm and node-local tmpfs at the same path.

The configuration is the one of a real cluster: ranks_per_node = "auto" (nodes found by MPI from
the hostnames), one cache_dir string without {node} on the node-local tmpfs, pfs_dir on the host
disk that every node shares. Losing a node is `jobs/vcluster kill` (its processes SIGKILLed, its
tmpfs unmounted), then `jobs/vcluster boot` brings a fresh, empty node back under the same name.
"""
import glob
import hashlib
import os
import re

import pytest

import vc_harness as vh

pytestmark = pytest.mark.vcluster
STEPS, EVERY = 20, 5          # checkpoints at steps 4, 9, 14, 19; crash after step 12 -> restart from 9


@pytest.fixture
def config(tmp_path, request):
    """A run.toml as on a cluster; a job name of its own per test (the node caches outlive a test)."""
    def write(**extra):
        digest = hashlib.sha1(request.node.name.encode()).hexdigest()[:8]      # unique per parametrization
        name = "vc-" + re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:50].strip("-") + "-" + digest
        cache = extra.pop("cache_dir", f"{vh.LOCAL}/hpcckpt-{{user}}")
        lines = [f'name = "{name}"', f'cache_dir = "{cache}"', f'pfs_dir = "{tmp_path}/pfs"',
                 'ranks_per_node = "auto"', "group_size = 4", "rs_parity = 2"]
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extra.items()]
        path = tmp_path / "run.toml"
        path.write_text("\n".join(lines) + "\n")
        return str(path), name
    return write


def sim(cluster, nprocs, rpn, cfg, *args, nodes=None, ok=True):
    res = cluster.mpirun(nprocs, "vc_app.py", "--config", cfg, "sim", "--steps", STEPS, "--every", EVERY, *args,
                         rpn=rpn, nodes=nodes)
    assert (res.returncode == 0) == ok, str(res)
    return res


def outputs(path):
    return {os.path.basename(f): open(f, "rb").read() for f in sorted(glob.glob(os.path.join(path, "*.npy")))}


def restart_step(res):
    (value,) = res.lines("RESTART")
    return None if value == "None" else int(value)


@pytest.fixture(scope="module")
def references(cluster, tmp_path_factory):
    """Failure-free runs: (nprocs, elastic) -> {file: bytes}."""
    refs = {}
    for nprocs, rpn, elastic in ((4, 1, False), (8, 2, False), (4, 1, True), (3, 1, False), (6, 2, False)):
        d = tmp_path_factory.mktemp(f"ref{nprocs}")
        (d / "run.toml").write_text(f'name = "ref{nprocs}{"e" if elastic else ""}"\n'
                                    f'cache_dir = "{vh.LOCAL}/ref"\npfs_dir = "{d}/pfs"\n')
        sim(cluster, nprocs, rpn, str(d / "run.toml"), "--no-restart", "--out", d / "out",
            *(["--elastic"] if elastic else []))
        refs[nprocs, elastic] = outputs(d / "out")
    return refs


@pytest.mark.parametrize("rpn", [1, 2])
def test_topology_is_found_from_the_hostnames(cluster, config, rpn):
    cfg, name = config()
    res = cluster.mpirun(4 * rpn, "vc_app.py", "--config", cfg, "topo", rpn=rpn)
    assert res.returncode == 0, str(res)
    seen = {}
    for line in res.lines("TOPO"):
        f = dict(kv.split("=", 1) for kv in line.split())
        seen[int(f["rank"])] = f
    assert sorted(seen) == list(range(4 * rpn)), str(res)
    for r, f in seen.items():
        assert f["host"] == f"n{r // rpn + 1}", str(res)            # the namespace's own hostname
        assert int(f["node"]) == int(f["split"]) == r // rpn, str(res)
        assert f["nodes"] == "4"
        assert f["cache"] == f"{vh.LOCAL}/hpcckpt-root/{name}" and f["exists"] == "True", str(res)


def test_each_node_sees_only_its_own_cache(cluster, config):
    cfg, name = config()
    sim(cluster, 4, 1, cfg, "--steps", 5, "--level", "local")
    for i, node in enumerate(cluster.nodes):
        res = cluster.exec(node, "sh", "-c", f"ls {vh.LOCAL}/hpcckpt-root/{name}/step_0000000004")
        assert res.returncode == 0, str(res)
        assert res.stdout.split() == [f"rank_{i:06d}.dat", f"rank_{i:06d}.json"], str(res)


@pytest.mark.parametrize("level", ["partner", "xor", "rs"])
@pytest.mark.parametrize("nprocs,rpn", [(4, 1), (8, 2)])
def test_lost_node_is_rebuilt_bitwise(cluster, config, references, tmp_path, level, nprocs, rpn):
    cfg, name = config()
    sim(cluster, nprocs, rpn, cfg, "--level", level, "--crash-at", 12, "--crash-rank", nprocs - 1, ok=False)
    cluster.kill("n2")
    cluster.boot("n2")
    left = cluster.exec("n2", "find", vh.LOCAL, "/dev/shm", "-mindepth", "1")
    assert left.returncode == 0 and left.stdout == "", str(left)       # the fresh node is empty
    res = sim(cluster, nprocs, rpn, cfg, "--level", level, "--out", tmp_path / "out")
    assert restart_step(res) == 9, str(res)
    lost = list(range(rpn, 2 * rpn))
    assert f"rebuilt rank(s) {lost}" in res.stderr, str(res)
    assert outputs(tmp_path / "out") == references[nprocs, False]


SHIFT, REORDER = (["n1", "n2", "n3"], "n1", ["n2", "n3", "n4"]), (["n1", "n2", "n3"], None, ["n3", "n1", "n2"])


@pytest.mark.parametrize("level,node_dirs,rpn,hosts", [("partner", False, 1, SHIFT), ("xor", False, 1, SHIFT),
                                                        ("partner", True, 1, SHIFT), ("rs", False, 2, SHIFT),
                                                        ("partner", False, 1, REORDER)])
def test_a_relaunch_on_shifted_hosts_moves_the_node_caches(cluster, config, references, tmp_path, level, node_dirs,
                                                           rpn, hosts):
    """Three nodes' ranks on n1, n2, n3; SHIFT: n1 is lost and the relaunch runs on n2, n3, n4
    (what `hpcckpt run --exclude-failed-node` with a spare gives when the first node fails):
    every node's ranks run on the host after their own; REORDER: nothing is lost, the relaunch
    gets the hosts in another order. The files of the ranks whose host changed (their data, the
    partner copies or parity they hold) are moved to the hosts that run them now, the lost node
    is rebuilt, and the run ends bitwise equal to a failure-free one; also with a cache_dir
    naming {node} (n2 then holds node 1's files under node1/ and runs node 0)."""
    before, lost, after = hosts
    nprocs = 3 * rpn
    cache = f"{vh.LOCAL}/hpcckpt-{{user}}" + ("/node{node}" if node_dirs else "")
    cfg, name = config(cache_dir=cache)
    sim(cluster, nprocs, rpn, cfg, "--level", level, "--crash-at", 12, "--crash-rank", nprocs - 1, ok=False,
        nodes=before)
    if lost:
        cluster.kill(lost)
        cluster.boot(lost)
    res = sim(cluster, nprocs, rpn, cfg, "--level", level, "--out", tmp_path / "out", nodes=after)
    assert restart_step(res) == 9, str(res)
    moved = [r for r in range(nprocs) if before[r // rpn] not in (after[r // rpn], lost)]   # their host changed
    assert f"rank(s) {moved} were on other hosts" in res.stderr, str(res)
    rebuilt = [r for r in range(nprocs) if before[r // rpn] == lost]
    assert (f"rebuilt rank(s) {rebuilt}" in res.stderr) == bool(rebuilt), str(res)
    assert outputs(tmp_path / "out") == references[nprocs, False]
    for node, host in enumerate(after):      # moved, not copied: each host holds only its ranks' files
        found = cluster.exec(host, "find", f"{vh.LOCAL}/hpcckpt-root", "-path", f"*/{name}/*", "-name", "rank_*.json")
        assert found.returncode == 0, str(found)
        assert {os.path.basename(p) for p in found.stdout.split()} == \
            {f"rank_{r:06d}.json" for r in range(node * rpn, (node + 1) * rpn)}, str(found)


@pytest.mark.parametrize("plant", ["damaged", "same-run"])
def test_a_moved_step_replaces_files_of_the_same_name_only_when_they_are_older(cluster, config, references,
                                                                               tmp_path, plant):
    """The shift above, but n3, which is to receive rank 1's files from n2, holds a manifest of
    the same name in step 9: a damaged one is replaced by rank 1's step 9 (restart from 9); one
    of the same run (not older) is neither overwritten nor replaced, n2 keeps all of rank 1's
    step 9, a warning says so, and the restart falls back to step 4. Bitwise either way."""
    cfg, name = config()
    before, lost, after = SHIFT
    sim(cluster, 3, 1, cfg, "--level", "partner", "--crash-at", 12, "--crash-rank", 2, ok=False, nodes=before)
    cluster.kill(lost)
    cluster.boot(lost)
    root = f"{vh.LOCAL}/hpcckpt-root/{name}"
    manifest = f"{root}/step_0000000009/rank_000001.json"
    text = "{}" if plant == "damaged" else cluster.exec("n2", "cat", manifest).stdout
    planted = cluster.exec("n3", "sh", "-c", f"cat > {manifest} <<'EOF'\n{text}\nEOF")
    assert planted.returncode == 0, str(planted)
    res = sim(cluster, 3, 1, cfg, "--level", "partner", "--out", tmp_path / "out", nodes=after)
    assert outputs(tmp_path / "out") == references[3, False]
    kept = cluster.exec("n2", "find", f"{root}/step_0000000009", "-type", "f")
    rank1 = {"rank_000001.json", "rank_000001.dat", "held_000001/partner_000000.json", "held_000001/partner_000000.dat"}
    left = {os.path.relpath(p, f"{root}/step_0000000009") for p in kept.stdout.split()} & rank1
    if plant == "damaged":
        assert restart_step(res) == 9 and "left where they were" not in res.stderr, str(res)
    else:
        assert restart_step(res) == 4 and "left where they were" in res.stderr, str(res)
        assert left == rank1, str(kept)


def test_a_fresh_start_on_reordered_hosts_replaces_the_earlier_run(cluster, config, references, tmp_path):
    """A run ends at step 19 on n1, n2, n3; a run with start = "fresh" on the same hosts in
    another order (n3, n1, n2) crashes after step 12; its relaunch restarts from its own step 9,
    not from the earlier run's step 19, and each host holds only its ranks' files of the new run:
    the fresh run looks at (and, after its first checkpoint, removes) the earlier run's files of
    each rank on whichever host they are, as a restart does."""
    before, _, after = REORDER
    cfg, name = config()
    sim(cluster, 3, 1, cfg, "--level", "partner", nodes=before)
    fresh, _ = config(start="fresh")
    res = sim(cluster, 3, 1, fresh, "--level", "partner", "--crash-at", 12, "--crash-rank", 2, ok=False, nodes=after)
    assert restart_step(res) is None and "were on other hosts" in res.stderr, str(res)
    cfg, _ = config()
    res = sim(cluster, 3, 1, cfg, "--level", "partner", "--out", tmp_path / "out", nodes=after)
    assert restart_step(res) == 9 and "were on other hosts" not in res.stderr, str(res)
    assert outputs(tmp_path / "out") == references[3, False]
    for node, host in enumerate(after):
        found = cluster.exec(host, "find", f"{vh.LOCAL}/hpcckpt-root/{name}", "-name", "rank_*.json")
        assert {os.path.basename(p) for p in found.stdout.split()} == {f"rank_{node:06d}.json"}, str(found)


def test_a_relaunch_on_another_rank_count_leaves_the_node_caches_where_they_are(cluster, config, references,
                                                                                tmp_path):
    """Four ranks checkpoint on n1..n4; a relaunch of two ranks on n2, n1 (each on the host of
    the other's files) cannot restart from the node caches (IncompatibleCheckpointError; no pfs
    step) and moves nothing: those files are of another rank count, and the relaunch on the
    original four hosts restarts from them."""
    cfg, name = config()
    sim(cluster, 4, 1, cfg, "--level", "partner", "--crash-at", 12, "--crash-rank", 3, ok=False)
    res = sim(cluster, 2, 1, cfg, "--level", "partner", nodes=["n2", "n1"], ok=False)
    assert "IncompatibleCheckpointError" in res.stdout and "written by 4 ranks" in res.stdout, str(res)
    assert "were on other hosts" not in res.stderr, str(res)
    for node, host in enumerate(cluster.nodes):
        found = cluster.exec(host, "find", f"{vh.LOCAL}/hpcckpt-root/{name}/step_0000000009", "-name", "rank_*.json")
        assert {os.path.basename(p) for p in found.stdout.split()} == {f"rank_{node:06d}.json"}, str(found)
    res = sim(cluster, 4, 1, cfg, "--level", "partner", "--out", tmp_path / "out")
    assert restart_step(res) == 9, str(res)
    assert outputs(tmp_path / "out") == references[4, False]


def test_rs_survives_two_lost_nodes(cluster, config, references, tmp_path):
    cfg, name = config()
    sim(cluster, 4, 1, cfg, "--level", "rs", "--crash-at", 12, "--crash-rank", 3, ok=False)
    for node in ("n1", "n3"):
        cluster.kill(node)
        cluster.boot(node)
    res = sim(cluster, 4, 1, cfg, "--level", "rs", "--out", tmp_path / "out")
    assert restart_step(res) == 9 and "rebuilt rank(s) [0, 2]" in res.stderr, str(res)
    assert outputs(tmp_path / "out") == references[4, False]


@pytest.mark.parametrize("before,rpn,after,nodes", [(4, 1, 2, ["n1", "n2"]), (8, 2, 3, ["n1", "n2", "n4"])])
def test_pfs_restart_on_fewer_nodes(cluster, config, references, tmp_path, before, rpn, after, nodes):
    cfg, name = config()
    sim(cluster, before, rpn, cfg, "--elastic", "--level", "pfs", "--crash-at", 12, "--crash-rank", before - 1,
        ok=False)
    gone = [n for n in cluster.nodes if n not in nodes]
    for node in gone:
        cluster.kill(node)
    try:
        res = sim(cluster, after, 1, cfg, "--elastic", "--level", "pfs", "--out", tmp_path / "out", nodes=nodes)
    finally:
        for node in gone:
            cluster.boot(node)
    assert restart_step(res) == 9, str(res)
    assert outputs(tmp_path / "out") == references[4, True]
