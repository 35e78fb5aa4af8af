"""Checked-in checkpoints of every format version (tests/golden/, written by
tests/tools/make_golden.py) must restore bitwise, from the cache and from pfs, with this
version — or be refused with a clear version error. v1: before epochs, layouts and state dicts
(protected arrays only); v2: the current format, with a state dict."""
import os
import shutil
import sys

import numpy as np
import pytest

import hpcckpt

pytestmark = pytest.mark.mpi
GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
sys.path.insert(0, os.path.join(os.path.dirname(GOLDEN), "tools"))
from make_golden import golden_values  # noqa: E402


def restore(root, with_state):
    from mpi4py import MPI
    want, want_state = golden_values()
    arrays = {k: np.zeros_like(v) for k, v in want.items()}
    state = {k: None for k in want_state} if with_state else None
    if with_state:
        state["p"] = {"pos": None, "ids": None}
    with hpcckpt.Checkpointer(MPI.COMM_SELF, name="golden", cache_dir=os.path.join(root, "cache", "node{node}"),
                              pfs_dir=os.path.join(root, "pfs"), ranks_per_node=1, log_level="ERROR") as ckpt:
        for k, a in arrays.items():
            ckpt.protect(k, a)
        step = ckpt.restart(state)
    assert step == 7
    for k, a in arrays.items():
        assert a.dtype == want[k].dtype and a.tobytes() == want[k].tobytes(), k
    if with_state:
        assert state["t"] == 0.25 and state["n"] == 2 ** 70 + 1 and state["label"] == "golden"
        assert state["pair"] == (1, None) and type(state["x"]) is np.float32 and state["x"] == 1.25
        assert state["rng"] == want_state["rng"]
        for k in ("pos", "ids"):
            assert state["p"][k].tobytes() == want_state["p"][k].tobytes()


@pytest.mark.parametrize("version,with_state", [("v1", False), ("v2", True)])
@pytest.mark.parametrize("source", ["cache", "pfs"])
def test_golden_checkpoints_restore_bitwise(version, with_state, source, tmp_path):
    root = str(tmp_path / version)
    shutil.copytree(os.path.join(GOLDEN, version), root)
    if source == "pfs":
        shutil.rmtree(os.path.join(root, "cache"))
    restore(root, with_state)
