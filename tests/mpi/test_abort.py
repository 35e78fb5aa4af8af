"""One rank's exception never hangs the job (tests/mpi/apps/fail_app.py, plain ``mpiexec python``).

With ``abort_on_error`` (the default) an exception that leaves ``with Checkpointer`` on one rank,
or is uncaught after it, prints that rank's traceback and aborts the job in seconds; an
interrupt inside a collective call is agreed on, so the other ranks raise too instead of waiting.
Calls that the ranks make differently (need_checkpoint with other steps) are told so on every rank.
Every job runs under the harness timeout: a hang fails the test instead of blocking it."""
import json
import os
import time

import pytest

from harness import mpi, run_mpi

pytestmark = pytest.mark.mpi
QUICK = 60          # seconds: the jobs end in a few; the timeout only catches a hang


def fail(root, mode, config=None, env=None, nprocs=4):
    t0 = time.monotonic()
    res = run_mpi(nprocs, "fail_app.py", "--cache", os.path.join(root, "node{node}"), "--mode", mode,
                  "--config-json", json.dumps(config or {}), env=env, timeout=QUICK)
    return res, time.monotonic() - t0


@pytest.mark.parametrize("mode,rank,text", [
    ("raise-in-with", 2, "ValueError: rank 2 failed in the application's step"),
    ("raise-outside", 1, "ValueError: rank 1 failed after the checkpointer was closed"),
    ("protect-error", 3, "ProtectError: array 'u' is not C-contiguous")])
def test_one_rank_exception_ends_the_job_with_its_traceback(mode, rank, text, shm_dir):
    res, _ = fail(shm_dir, mode)
    # MPI_Abort(1); under load hydra may report instead the SIGKILL it sent to the other ranks
    assert res.returncode == 1 or mpi().rank_killed(res.returncode), str(res)
    assert f"hpcckpt[rank {rank}]: uncaught exception on this rank; aborting the job" in res.stderr, str(res)
    assert text in res.stderr and "Traceback (most recent call last)" in res.stderr, str(res)


@pytest.mark.parametrize("phase,level,action,cls", [
    ("written", "local", "interrupt", "KeyboardInterrupt"), ("written", "local", "exit", "SystemExit"),
    # red team 4: inside a partner / parity exchange the others waited forever for rank 1's messages
    ("encode", "partner", "interrupt", "KeyboardInterrupt"), ("encode", "partner", "exit", "SystemExit"),
    ("encode", "partner", "sigint", "KeyboardInterrupt"), ("encode", "xor", "interrupt", "KeyboardInterrupt"),
    ("encode", "rs", "sigint", "KeyboardInterrupt")])
def test_interrupt_inside_checkpoint_aborts_by_default(phase, level, action, cls, shm_dir):
    res, _ = fail(shm_dir, "fault", env={"_HPCCKPT_FAULT": f"{phase}:1:1:{action}"},
                  config={"level": level, "ranks_per_node": 1})
    # the app catches it on rank 1 and goes on; the others raised CollectiveError and went on:
    # the checkpoint of step 1 failed everywhere, the job continues and ends normally
    caught = res.lines("CAUGHT")
    assert res.returncode == 0 and "DONE" in res.stdout, str(res)
    assert any(c.startswith(f"{cls} rank=1") for c in caught), str(res)
    others = [c for c in caught if not c.startswith(f"{cls} rank=1")]
    assert len(others) == 3 and all(c.startswith("CollectiveError") and cls in c for c in others), str(res)


@pytest.mark.parametrize("level", ["partner", "xor"])
def test_sys_exit_on_one_rank_inside_close_aborts_the_job(level, shm_dir):
    """With ``background``, close() joins the last redundancy, agrees, then retires the step it
    replaced on each rank alone: sys.exit(5) there on rank 2 (as a signal handler's would) was
    seen by no excepthook, and the other ranks, past close(), waited in the application's next
    collective call for ever. Now that rank aborts the job with its status."""
    res = run_mpi(4, "app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--steps", 20, "--every", 5,
                  "--level", level, "--config-json", json.dumps({"ranks_per_node": 2, "background": True}),
                  env={"_HPCCKPT_FAULT": "retire:2:9:exit"}, timeout=QUICK)
    assert res.returncode == 5 or mpi().rank_killed(res.returncode), str(res)
    assert "hpcckpt[rank 2]: sys.exit(5) on this rank; aborting the job" in res.stderr, str(res)
    assert res.lines("CKPT 19") and "DONE" not in res.stdout, str(res)


def test_uncaught_interrupt_inside_checkpoint_aborts_the_job(shm_dir):
    res, seconds = fail(shm_dir, "fault-uncaught", env={"_HPCCKPT_FAULT": "written:1:1:interrupt"})
    # rank 1 aborts with 130; the others raised an agreed CollectiveError and may exit first:
    # mpiexec reports whichever ended the job, never a hang
    assert res.returncode != 0 and "DONE" not in res.stdout, str(res)
    assert "hpcckpt[rank 1]: uncaught exception on this rank" in res.stderr and "KeyboardInterrupt" in res.stderr


def test_exception_on_every_rank_while_a_flush_runs_waits_for_it(shm_dir):
    res, _ = fail(shm_dir, "flush-then-raise", config={"async_flush": True, "abort_on_error": False})
    assert res.returncode != 0 and "Segmentation" not in res.stderr, str(res)
    assert "every rank fails while the flush runs" in res.stderr, str(res)   # (4 ranks' lines interleave)
    assert "flush of step 0 completed while an exception was unwinding" in res.stderr, str(res)
    assert os.path.exists(os.path.join(shm_dir, "pfs", "fail", "step_0000000000", "COMMITTED.json"))


def test_scavenge_right_after_an_async_pfs_checkpoint(shm_dir):
    res, _ = fail(shm_dir, "async-scavenge", config={"async_flush": True})
    assert res.returncode == 0 and "DONE" in res.stdout, str(res)
    assert res.lines("SCAVENGED") == ["None"], str(res)      # pfs already has step 1 once the flush is done


def calls(shm_dir, case, *args):
    res = run_mpi(4, "calls_app.py", "--cache", os.path.join(shm_dir, "node{node}"), "--case", case, *args,
                  timeout=120)
    assert res.returncode == 0, str(res)
    return res


def test_ranks_that_pass_need_checkpoint_other_steps_are_told_so(shm_dir):
    """need_checkpoint(step) with a different step per rank, or a bad step on rank 0 only: the same
    HpcCkptError on every rank (rank 0 alone would otherwise decide for a step the others are not at)."""
    res = calls(shm_dir, "need-disagree")
    errors = res.lines("ERROR")
    assert len(errors) == 8 and all(e.startswith("HpcCkptError") for e in errors), str(res)
    assert sum("ranks disagree on need_checkpoint(step): steps 0..3" in e for e in errors) == 4, str(res)
    assert sum("step must be an integer" in e for e in errors) == 4, str(res)
    assert res.lines("OK") == ["2"] * 4


@pytest.mark.parametrize("thread_level", ["funneled", "serialized"])
def test_background_without_thread_multiple_works_synchronously_with_one_warning(thread_level, shm_dir):
    res = calls(shm_dir, "thread-level", "--thread-level", thread_level)
    assert res.lines("OK") == ["0"] * 4 + ["1"] * 4 + ["2"] * 4, str(res)
    assert res.stderr.count("needs MPI_THREAD_MULTIPLE") == 1, str(res)


def test_sys_exit_0_on_one_rank_closes_collectively_instead_of_hanging(tmp_path):
    """sys.exit(0) on one rank inside the with block closes the Checkpointer collectively, as
    leaving the block does: with the other ranks leaving it too the job ends cleanly; with
    another rank making another call both get the error naming the calls (before: rank 1 left
    without a word and rank 0 waited in its next call forever)."""
    res = run_mpi(2, "diverge_app.py", str(tmp_path / "a"), "exit0-then-close", timeout=60)
    assert res.returncode == 0 and res.lines("DONE") == [""], str(res)          # rank 0 only: rank 1 exited
    res = run_mpi(2, "diverge_app.py", str(tmp_path / "b"), "exit0-vs-checkpoint", timeout=60)
    assert res.returncode != 0 and "the ranks made different hpcckpt calls" in res.stderr + res.stdout, str(res)
    assert "rank 1: close()" in res.stderr + res.stdout, str(res)


@pytest.mark.parametrize("case", ["need-vs-checkpoint", "restart-vs-checkpoint", "should-exit-vs-checkpoint",
                                  "wait-vs-checkpoint", "extra-checkpoint"])
def test_ranks_making_different_calls_get_an_error_naming_them(case, tmp_path):
    """Every call is collective; an application whose ranks make different calls used to hang or
    get another call's answer (should_exit() True from the checkpoint's reduction). Each
    agreement carries the name of its step, so the first one where the ranks differ raises a
    CollectiveError naming both calls on both ranks; a rank that leaves it uncaught (rank 1 in
    close() after rank 0's extra checkpoint) ends the job, as any uncaught error does."""
    res = run_mpi(2, "diverge_app.py", str(tmp_path), case, timeout=60)
    said = "the ranks made different hpcckpt calls (rank 0: "
    if case == "extra-checkpoint":
        assert res.returncode != 0 and "rank 1: close())" in res.stderr and said in res.stderr, str(res)
    else:
        caught = res.lines("CAUGHT")
        assert res.returncode == 0 and len(caught) == 2 and len(res.lines("DONE")) == 2, str(res)
        assert all(c.startswith("CollectiveError " + said) and "rank 1: checkpoint(5, level='local')" in c
                   for c in caught), str(res)
