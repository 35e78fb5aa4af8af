"""Fixtures of the virtual-cluster tests: one 4-node cluster per module, torn down even on failure."""
import os

import pytest

import vc_harness as vh


def pytest_configure(config):
    config.addinivalue_line("markers", "vcluster: runs MPI jobs on a virtual cluster of Linux namespaces "
                                       "(jobs/vcluster; root; skipped otherwise, fails when CI=true)")


@pytest.fixture(scope="module")
def cluster(request):
    """A fresh 4-node virtual cluster (n1..n4), down at the end of the module whatever happens."""
    why = vh.problem()
    if why:
        vh.unavailable(why)
    for name in vh.stale_clusters():
        vh.Cluster(name, 0).down()
    c = vh.Cluster(f"pytest-{os.getpid()}", 4)
    c.down()
    request.addfinalizer(c.down)
    res = c.vc("up", c.nnodes, check=False)
    if res.returncode != 0 or res.timed_out:
        vh.unavailable(f"jobs/vcluster up {c.nnodes} failed (namespaces or veth not available?): "
                       f"{res.stderr.strip()[-500:]}")
    return c
