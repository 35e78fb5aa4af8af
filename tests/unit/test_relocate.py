"""relocate's listing of the files a host holds for ranks running elsewhere (pure, one process;
the moves themselves are tested on the virtual cluster: tests/vcluster/test_vcluster.py)."""
import json
import os

from hpcckpt import manifest as mf
from hpcckpt.config import Config
from hpcckpt.relocate import TEMP_SUFFIX, _foreign_files, _manifests_last
from hpcckpt.topology import Topology


def touch(path, size=0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * size)


def test_files_of_ranks_on_other_hosts_are_listed_without_temporary_files(tmp_path):
    cfg = Config.load(environ={}, name="job", cache_dir=str(tmp_path / "node{node}"))
    topo = Topology(0, 3, (0, 1, 2))
    step = tmp_path / "node1" / "job" / "step_0000000009"      # this host ran node 1 before
    touch(str(step / "rank_000001.dat"), 5)
    touch(str(step / "rank_000001.json"), 2)
    touch(str(step / "held_000001" / "partner_000000.dat"), 3)
    touch(str(step / "held_000001" / ("partner_000000.dat" + TEMP_SUFFIX)), 3)     # an interrupted move's
    touch(str(step / "held_000001" / "notes.txt"), 3)          # no level's file (levels/files.held_file)
    touch(str(step / ("rank_000001.dat" + TEMP_SUFFIX)), 5)
    touch(str(tmp_path / "node0" / "job" / "step_0000000009" / "rank_000000.json"))  # this host's own rank
    found, other_layout = _foreign_files(cfg, topo, host_ranks={0})
    assert sorted(found) == [1] and other_layout == []
    assert sorted((rel, size) for _, rel, size in found[1]) == [
        ("step_0000000009/held_000001/partner_000000.dat", 3), ("step_0000000009/rank_000001.dat", 5),
        ("step_0000000009/rank_000001.json", 2)]
    order = [rel for _, rel, _ in _manifests_last(found[1])]
    assert order[-1].endswith(".json") and order.index("step_0000000009/rank_000001.dat") < order.index(
        "step_0000000009/rank_000001.json")


def test_files_of_another_rank_count_are_not_listed_but_reported(tmp_path):
    """A host that ran rank 1 of a 4-rank job: a 3-rank job does not move rank 1's files of that
    step (nor rank 3's, beyond its size) and reports their manifests as of another layout."""
    cfg = Config.load(environ={}, name="job", cache_dir=str(tmp_path / "node{node}"))
    topo = Topology(0, 3, (0, 1, 2))
    step = tmp_path / "node1" / "job" / "step_0000000009"
    for q in (1, 3):
        m = mf.RankManifest(name="job", world_size=4, rank=q, node=q, step=9, level="partner", ckpt_id="a1",
                            created=1.0, data_file=mf.data_file_name(q), data_size=5, arrays=())
        touch(str(step / mf.data_file_name(q)), 5)
        touch(str(step / f"held_{q:06d}" / "partner_000000.dat"), 3)
        with open(step / mf.manifest_file_name(q), "w") as f:
            json.dump(m.to_json(), f)
    found, other_layout = _foreign_files(cfg, topo, host_ranks={0})
    assert found == {}
    assert sorted((f.step, f.manifest.rank, f.state) for f in other_layout) == [(9, 1, "incompatible"),
                                                                                (9, 3, "incompatible")]
    assert all("written by 4 ranks, this job has 3" in f.reason for f in other_layout)
