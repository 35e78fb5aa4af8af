"""The library is a guest in the application's job: it talks only on its own communicators, and
what each rank receives per call does not grow with the number of ranks (tests/mpi/apps/guest_app.py)."""
import json
import os
import re

import pytest

from harness import run_mpi

pytestmark = pytest.mark.mpi


def guest(nprocs, root, *args, config=None):
    return run_mpi(nprocs, "guest_app.py", "--cache", os.path.join(root, "node{node}"),
                   "--config-json", json.dumps(config or {}), *args, timeout=120)


@pytest.mark.parametrize("background", ["none", "async_flush", "background"])
def test_a_posted_wildcard_receive_never_takes_a_library_message(background, shm_dir):
    config = {} if background == "none" else {background: True}
    res = guest(4, shm_dir, "--wildcard", "local,partner,xor,rs,pfs,partner", config=config)
    assert res.returncode == 0 and len(res.lines("WILDCARD OK")) == 4, str(res)


def test_success_path_bytes_per_rank_do_not_grow_with_the_rank_count(shm_dir):
    counts = {}
    for n in (2, 4, 8):
        res = guest(n, os.path.join(shm_dir, str(n)), "--count")
        assert res.returncode == 0 and "DONE" in res.stdout, str(res)
        for line in res.lines("UNPICKLED"):
            call, nbytes, rank = re.match(r"(\S+) (\d+) rank=(\d+)", line).groups()
            counts.setdefault(call, {}).setdefault(n, set()).add(int(nbytes))
        assert any("step=102" in line for line in res.lines("UNPICKLED restart")), str(res)
    for call, by_n in counts.items():
        assert by_n[2] == by_n[4] == by_n[8], f"{call}: bytes unpickled per rank {by_n}"
