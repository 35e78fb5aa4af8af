"""What porting applications ran into (issue 41), under real mpiexec with 3-4 ranks
(tests/mpi/apps/porting_app.py): the ``ckpt = Checkpointer(...)`` ... ``ckpt.close()`` form
when one rank raises (uncaught, caught, close() in a finally), a value created inside the loop
restored through a None placeholder, how ROWS spreads leftover rows on another rank count (as
np.array_split), and a state key whose dtype differs between ranks refused at the first
checkpoint when the pfs level is in the schedule. docs/PORTING.md describes each."""
import json
import os

import numpy as np
import pytest

from harness import mpi, run_mpi

pytestmark = pytest.mark.mpi
DIFFERENT_CALLS = "the ranks made different hpcckpt calls (rank 0: need_checkpoint(5); rank 2: close())"


def porting(nprocs, root, mode, *args, config=None):
    return run_mpi(nprocs, "porting_app.py", "--root", root, "--mode", mode,
                   "--config-json", json.dumps(config or {}), *args, timeout=180)


def stderr_of(root, ranks=range(4)):
    """What the ranks of a close-* job wrote to stderr (porting_app keeps it in a file per rank)."""
    return "".join(open(os.path.join(root, f"stderr.rank{r}")).read() for r in ranks)


def test_close_form_an_uncaught_exception_on_one_rank_aborts_the_job_with_its_traceback(tmp_path):
    res = porting(4, str(tmp_path), "close-uncaught", config={"schedule": {"local": 2}})
    assert res.returncode == 1 or mpi().rank_killed(res.returncode), str(res)
    err = stderr_of(tmp_path, [2])
    assert "hpcckpt[rank 2]: uncaught exception on this rank; aborting the job" in err, err
    assert "ValueError: rank 2 failed at step 5" in err, err
    assert not res.lines("RESULT"), str(res)


@pytest.mark.parametrize("mode", ["close-caught", "close-finally"])
def test_close_form_one_rank_calling_close_alone_ends_the_job_naming_both_calls(mode, tmp_path):
    """Rank 2 catches its ValueError and calls close() (or reaches close() in a finally) while
    the others call need_checkpoint(5): the agreement of both calls raises CollectiveError
    naming them; it aborts the job (no hang). In the finally form the ValueError's traceback is
    not printed: the CollectiveError replaces it."""
    res = porting(4, str(tmp_path), mode, config={"schedule": {"local": 2}})
    assert res.returncode == 1 or mpi().rank_killed(res.returncode), str(res)
    err = stderr_of(tmp_path)
    assert DIFFERENT_CALLS in err and "aborting the job" in err, err
    assert not [ln for ln in res.lines("RESULT") if "closed" in ln or "finished" in ln], str(res)
    if mode == "close-finally":
        assert "ValueError" not in err, err


def test_close_form_an_error_every_rank_gets_can_be_caught_and_close_called(tmp_path):
    """An HpcCkptError raised on every rank (agreed: here an unknown level) leaves every rank's
    loop alike: catching it and calling close() (in a finally) ends the job cleanly."""
    res = porting(4, str(tmp_path), "close-agreed")
    assert res.returncode == 0, str(res)
    assert sorted(res.lines("RESULT")) == sorted([f"{r} caught HpcCkptError" for r in range(4)]
                                                 + [f"{r} closed" for r in range(4)]), str(res)


def test_a_value_created_in_the_loop_is_restored_through_a_none_placeholder(tmp_path):
    ref = porting(4, str(tmp_path / "ref"), "placeholder", "--fail-at", -1)
    assert ref.returncode == 0 and ref.lines("RESTART") == ["None"] * 4, str(ref)
    crashed = porting(4, str(tmp_path / "run"), "placeholder", "--fail-at", 5)
    assert crashed.returncode == 0 and crashed.lines("RESTART") == ["None"] * 4, str(crashed)
    res = porting(4, str(tmp_path / "run"), "placeholder", "--fail-at", -1)
    assert res.returncode == 0 and res.lines("RESTART") == ["4"] * 4, str(res)
    assert sorted(res.lines("VALUE")) == sorted(ref.lines("VALUE")), f"WRONG DATA\n{res}\n{ref}"
    assert sorted(res.lines("VALUE")) != sorted(crashed.lines("VALUE"))


@pytest.mark.parametrize("counts,new", [((5, 0, 9, 3), 3), ((2, 2, 2, 2), 3), ((7, 0, 0, 4), 2)])
def test_rows_on_another_rank_count_are_spread_as_np_array_split(counts, new, tmp_path):
    res = porting(len(counts), str(tmp_path), "rows", "--counts", ",".join(map(str, counts)))
    assert res.returncode == 0, str(res)
    res = porting(new, str(tmp_path), "rows", "--restart")
    assert res.returncode == 0, str(res)
    got = sorted(tuple(map(int, ln.split())) for ln in res.lines("ROWS"))
    split = np.array_split(np.arange(sum(counts)), new)
    assert got == [(r, int(s[0]) if s.size else -1, s.size) for r, s in enumerate(split)]


PFS_SCHEDULE = {"schedule": {"local": 2, "pfs": 6}}


@pytest.mark.parametrize("names,differ", [(0, "u"), (300, "u"), (300, "x217")])
def test_a_dtype_that_differs_between_ranks_is_refused_at_the_first_checkpoint_when_pfs_is_scheduled(
        names, differ, tmp_path):
    """300 names fill the 64 buckets of hpcckpt.dtype_check several times over: the later
    rounds sort them out, and the one name that differs is found and named."""
    res = porting(4, str(tmp_path), "dtype", "--names", names, "--differ", differ, config=PFS_SCHEDULE)
    assert res.returncode == 0, str(res)
    assert not res.lines("CHECKPOINTED"), str(res)     # refused at the first one (step 1, local)
    errors = {ln.split(" ", 1)[1] for ln in res.lines("ERROR")}
    assert len(res.lines("ERROR")) == 4 and len(errors) == 1, str(res)
    want = "<f4 rank; a lower rank: <f8 rank" if differ == "u" else "<i8 rank; a lower rank: <i4 rank"
    (text,) = errors
    assert text.startswith(f"ProtectError array {differ!r}: the ranks disagree on its dtype or layout (rank 1: {want})")


@pytest.mark.parametrize("config,differ,levels", [
    (PFS_SCHEDULE, "", ["local", "local", "pfs", "local", "local"]),      # the same dtypes: nothing refused
    ({"schedule": {"local": 2, "partner": 4}}, "u", ["local", "partner", "local", "partner", "local"]),
])
def test_dtypes_pass_when_they_agree_or_when_no_pfs_step_is_scheduled(config, differ, levels, tmp_path):
    res = porting(4, str(tmp_path), "dtype", "--names", 300, "--differ", differ, config=config)
    assert res.returncode == 0 and not res.lines("ERROR"), str(res)
    for r in range(4):
        mine = [ln.split()[1:] for ln in res.lines("CHECKPOINTED") if ln.split()[0] == str(r)]
        assert mine == [[str(s), lv] for s, lv in zip((1, 3, 5, 7, 9), levels)], str(res)
