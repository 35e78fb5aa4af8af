import os
import shutil
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))


@pytest.fixture
def shm_dir():
    """A fresh directory on tmpfs (like a node-local cache), removed afterwards."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = os.path.join(base or "/tmp", f"hpcckpt-test-{uuid.uuid4().hex[:12]}")
    os.makedirs(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)
