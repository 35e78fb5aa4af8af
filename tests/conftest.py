import os
import shutil
import sys
import uuid

import pytest

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
