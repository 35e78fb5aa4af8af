import os
import shutil
import sys
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tests check this checkout, in pytest and in every process they start (MPI jobs, the CLI,
# SLURM jobs): a PYTHONPATH naming another tree must not make the jobs import that one.
sys.path.insert(0, REPO)
os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and os.path.abspath(p) != REPO])
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))


def pytest_configure(config):
    # here, not in tests/mpi/conftest.py (which selects by it): tests/unit imports the matrix too
    config.addinivalue_line("markers", "matrix(key): a fault-matrix item; which ones run: tests/mpi/conftest.py")


@pytest.fixture
def shm_dir():
    """A fresh directory on tmpfs (like a node-local cache), removed afterwards."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = os.path.join(base or "/tmp", f"hpcckpt-test-{uuid.uuid4().hex[:12]}")
    os.makedirs(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)
