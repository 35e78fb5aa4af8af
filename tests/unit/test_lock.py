"""The per-job lock file (hpcckpt/lock.py) with real processes: a child forked by the
application never holds the parent's lock."""
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hpcckpt.errors import ConcurrentJobError
from hpcckpt.lock import DirLock, running_jobs


def test_a_second_lock_on_the_same_file_is_refused(tmp_path):
    path = str(tmp_path / ".lock")
    held = DirLock(path, "the job")
    try:
        with pytest.raises(ConcurrentJobError, match=f"pid {os.getpid()}"):
            DirLock(path, "the job")
    finally:
        held.release()
    DirLock(path, "the job").release()


def test_a_forked_child_does_not_keep_the_lock_after_release(tmp_path):
    """Red team 4: a child forked while the lock was held (a multiprocessing pool, a helper)
    kept it after the parent released it: reopening the Checkpointer was ConcurrentJobError."""
    path = str(tmp_path / ".lock")
    held = DirLock(path, "the job")
    pid = os.fork()
    if pid == 0:                      # the child outlives the release
        time.sleep(5)
        os._exit(0)
    try:
        held.release()
        DirLock(path, "the job").release()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_forked_child_does_not_keep_the_lock_of_a_parent_that_died(tmp_path):
    """The parent takes the lock, forks a child that sleeps, and dies without releasing (a
    crash): the lock is free at once, although the child still runs."""
    path = str(tmp_path / ".lock")
    script = textwrap.dedent(f"""
        import os, sys, time
        from hpcckpt.lock import DirLock
        lock = DirLock({path!r}, "the job")
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            time.sleep(20)
            os._exit(0)
        print(pid, flush=True)
        os._exit(9)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(res.stdout.split()[0])
    try:
        assert os.path.exists(f"/proc/{child}")          # still running
        DirLock(path, "the job").release()
    finally:
        os.kill(child, 9)


def test_running_jobs_reads_the_held_locks_without_taking_one(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / ".lock.rank_000001").write_text("")                 # a lock file nobody holds
    held = DirLock(str(job / ".lock.rank_000000"), "test")
    try:
        found = running_jobs([str(job), str(tmp_path / "absent")])
        assert found == [f"{job / '.lock.rank_000000'}, held by pid {os.getpid()} on {socket.gethostname()}"]
        DirLock(str(job / ".lock.rank_000001"), "test").release()   # not taken by running_jobs meanwhile
        assert running_jobs([str(job)], proc_locks=str(tmp_path / "no-proc-locks")) == []   # not Linux
    finally:
        held.release()
    assert running_jobs([str(job)]) == []
