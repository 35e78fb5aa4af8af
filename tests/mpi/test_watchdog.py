"""The stall watchdog under real mpiexec (hpcckpt.watchdog): one rank sleeps inside a checkpoint
(``_HPCCKPT_FAULT=PHASE:1:STEP:sleep=S``) longer than ``stall_timeout``; every rank that waits
for it logs one line naming the call, the step and what it waits for, and dumps its Python
stacks. With ``stall_action = "warn"`` the job then goes on and ends normally (the checkpoint
restores bitwise); with ``"abort"`` it ends with MPI_Abort(124) and the line, never a hang (the
harness timeout is far above the watchdog's). The single-process side: tests/unit/test_stall_watchdog.py."""
import json
import os
import re

import pytest

from harness import mpi, outputs, restart_step, run_mpi
from hpcckpt.watchdog import ABORT_STATUS

pytestmark = pytest.mark.mpi
JOB_TIMEOUT = 120          # seconds: the jobs end in a few; the timeout only catches a hang


def app(cache, *args, config=None, env=None, steps=10):
    cfg = {"ranks_per_node": 1, "stall_timeout": 1}
    cfg.update(config or {})
    return run_mpi(4, "app.py", "--cache", os.path.join(cache, "node{node}"), "--steps", steps, "--every", 5,
                   "--config-json", json.dumps(cfg), *args, env=env, timeout=JOB_TIMEOUT)


def stall_lines(res):
    """{rank: [the text of its stall lines]} from the job's stderr."""
    out = {}
    for m in re.finditer(r"hpcckpt\[rank (\d+)\] WARNING: (rank \d+: stalled for [^\n]*)", res.stderr):
        out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def test_a_rank_sleeping_inside_a_checkpoint_is_reported_by_the_others_and_the_job_goes_on(shm_dir, tmp_path):
    res = app(shm_dir, "--level", "partner", env={"_HPCCKPT_FAULT": "written:1:9:sleep=4"})
    assert res.returncode == 0 and "DONE" in res.stdout and res.lines("CKPT 9") == ["partner 32288"], str(res)
    lines = stall_lines(res)
    assert sorted(lines) == [0, 2, 3], str(res)          # rank 1 sleeps: it waits for nobody
    for rank in (0, 2, 3):
        assert len(lines[rank]) == 1, str(res)           # once per wait
        assert re.fullmatch(
            rf"rank {rank}: stalled for \d+\.\d s in Checkpointer\.checkpoint\(step=9, state=None, level='partner'\), "
            r"step 9: waiting for the other ranks in the agreement 'writing checkpoint 9' \(MPI_Allreduce on the "
            r"library's communicator\) \(stall_timeout = 1 s\); the Python stacks of this process follow",
            lines[rank][0]), str(res)
    # faulthandler's dump of each of the three processes (once each): its main thread waits in the agreement
    for rank in (0, 2, 3):
        dump = re.findall(rf"^hpcckpt\[rank {rank}\] \| (.*)$", res.stderr, re.M)
        assert sum(d.startswith("Current thread 0x") for d in dump) == 1, str(res)     # the watchdog's: once
        assert any(re.fullmatch(r'  File ".*hpcckpt/comm\.py", line \d+ in reduce_max', d) for d in dump), dump
    assert not re.search(r"^hpcckpt\[rank 1\] \|", res.stderr, re.M), str(res)
    # the stalled checkpoint restores bitwise: a restart from it ends where a run without a stall ends
    # (rank 2 with other watchdog settings: they are this process's, not compared between ranks)
    again = app(shm_dir, "--out", tmp_path / "restarted", "--level", "partner", "--rank-config-json",
                '2:{"stall_timeout": "off", "stall_action": "abort"}', steps=20)
    assert restart_step(again) == 9 and not stall_lines(again), str(again)
    ref = app(str(tmp_path / "ref"), "--out", tmp_path / "ref-out", "--no-restart", "--level", "partner", steps=20)
    assert outputs(tmp_path / "restarted") == outputs(tmp_path / "ref-out") and outputs(tmp_path / "ref-out")


def test_stall_action_abort_ends_the_job_with_the_line(shm_dir):
    res = app(shm_dir, config={"stall_action": "abort"}, env={"_HPCCKPT_FAULT": "written:1:9:sleep=600"})
    # MPI_Abort(124) on the first rank that reports; hydra may report the SIGKILL it sent the others instead
    assert res.returncode == ABORT_STATUS or mpi().rank_killed(res.returncode), str(res)
    assert "DONE" not in res.stdout and res.lines("CKPT 4") == ["local 32288"], str(res)
    assert 1 not in stall_lines(res), str(res)          # the sleeping rank waits for nobody
    lines = [line for rank_lines in stall_lines(res).values() for line in rank_lines]
    assert lines and all(
        "in Checkpointer.checkpoint(step=9, state=None, level='local'), step 9: waiting for the other ranks in "
        "the agreement 'writing checkpoint 9'" in line
        and line.endswith(f"; aborting the job (stall_action = 'abort', status {ABORT_STATUS})")
        for line in lines), str(res)
    assert re.search(r"^hpcckpt\[rank \d\] \| Current thread 0x", res.stderr, re.M), str(res)


def test_a_stalled_background_thread_is_reported_by_the_call_that_joins_it(shm_dir):
    """background = true: rank 1's background thread sleeps before the partner copies of step 4;
    checkpoint(9) joins it on every rank. Rank 1's main thread names the join; the other ranks
    name the join or their own background thread, whichever waited past the timeout first."""
    res = app(shm_dir, "--level", "partner", config={"background": True},
              env={"_HPCCKPT_FAULT": "background:1:4:sleep=4"})
    assert res.returncode == 0 and "DONE" in res.stdout and res.lines("CKPT 9") == ["partner 32288"], str(res)
    lines = stall_lines(res)
    join = ("in Checkpointer.checkpoint(step=9, state=None, level='partner'), step 9: waiting for this rank's "
            "background thread: the partner redundancy of step 4 (stall_timeout = 1 s)")
    assert any(join in line for line in lines.get(1, ())), f"{lines}\n{res}"
    assert not any("(thread hpcckpt-background-4)" in line for line in lines.get(1, ())), str(res)   # it sleeps
    for rank in (0, 2, 3):
        assert any(join in line or "(thread hpcckpt-background-4), step 4: waiting for " in line
                   for line in lines.get(rank, ())), str(res)


def test_a_stalled_pfs_writer_thread_is_reported(shm_dir):
    """Rank 1's pfs writer thread sleeps half-way through its node file: rank 1 names the join of
    its writer, rank 0 (its node's aggregator) the node's reduction after the writes, the ranks
    of the other node the agreement that ends the pfs write."""
    res = app(shm_dir, "--level", "pfs", config={"ranks_per_node": 2}, env={"_HPCCKPT_FAULT": "pfs-write:1:9:sleep=4"})
    assert res.returncode == 0 and "DONE" in res.stdout and res.lines("CKPT 9") == ["pfs 32288"], str(res)
    lines = stall_lines(res)
    call = "in Checkpointer.checkpoint(step=9, state=None, level='pfs'), step 9: waiting for "
    waits = {1: r"this rank's pfs writer thread \(writing .*/step_0000000009\.tmp-\w+/node_000000\.h5\)",
             0: r"the other ranks of this node \(MPI_Allreduce: did a pfs write fail\)",
             2: r"the other ranks in the agreement 'writing pfs checkpoint 9' \(MPI_Allreduce on the library's "
                r"communicator\)"}
    waits[3] = waits[2]
    assert sorted(lines) == [0, 1, 2, 3], str(res)
    for rank, wait in waits.items():
        assert len(lines[rank]) == 1 and re.fullmatch(
            rf"rank {rank}: stalled for \d+\.\d s {re.escape(call)}{wait} \(stall_timeout = 1 s\); the Python "
            r"stacks of this process follow", lines[rank][0]), str(res)
