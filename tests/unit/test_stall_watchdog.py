"""The stall watchdog in one process (hpcckpt.watchdog): a wait past stall_timeout is logged once,
naming the hpcckpt call and step found in the waiting stack and what it waits for, and the Python
stacks are dumped once per process. The MPI side (other ranks, abort): tests/mpi/test_watchdog.py."""
import logging
import time

import pytest

from hpcckpt import faults, watchdog


@pytest.fixture
def armed(monkeypatch):
    monkeypatch.setattr(watchdog, "_dumped", False)
    watchdog.configure(0.2, "warn", rank=7)
    yield
    watchdog.configure(0)


def stalls(caplog):
    return [r.getMessage() for r in caplog.records if "stalled for" in r.getMessage()]


def test_a_stalled_wait_is_logged_once_with_the_call_step_and_what_it_waits_for(armed, caplog, capfd, monkeypatch):
    # the wait's stack goes through hpcckpt.faults.hit (a sleep): that is the call it names
    monkeypatch.setattr(faults, "_PARSED", ("stall", "*", "*", "sleep=1.2"))
    with caplog.at_level(logging.WARNING, logger="hpcckpt"):
        with watchdog.watch("the other ranks in the agreement %r", "writing checkpoint 4"):
            faults.hit("stall", 0, step=4)
    lines = stalls(caplog)
    assert len(lines) == 1, lines                          # once per wait, not at every wake-up
    assert lines[0].startswith("rank 7: stalled for "), lines
    assert "in hit(phase='stall', rank=0, step=4), step 4: waiting for the other ranks in the agreement " \
           "'writing checkpoint 4' (stall_timeout = 0.2 s); the Python stacks of this process follow" in lines[0]
    err = capfd.readouterr().err
    assert "hpcckpt[rank 7] | Current thread 0x" in err, err          # faulthandler's lines, prefixed
    assert "hpcckpt[rank 7] |   File \"" in err and " in hit\n" in err, err


def test_the_stacks_are_dumped_once_per_process(armed, caplog, capfd):
    with caplog.at_level(logging.WARNING, logger="hpcckpt"):
        for n in range(2):
            with watchdog.watch("wait %s", n, step=n):
                time.sleep(0.8)
    lines = stalls(caplog)
    assert len(lines) == 2 and "an hpcckpt call, step 0: waiting for wait 0" in lines[0], lines
    assert "step 1: waiting for wait 1" in lines[1] and "stacks" not in lines[1], lines
    assert capfd.readouterr().err.count("hpcckpt[rank 7] | Current thread 0x") == 1


def test_a_short_wait_is_not_reported_and_nested_waits_report_the_innermost(armed, caplog):
    with caplog.at_level(logging.WARNING, logger="hpcckpt"):
        with watchdog.watch("short"):
            time.sleep(0.05)
        with watchdog.watch("outer"):
            with watchdog.watch("inner"):
                time.sleep(0.8)
                assert watchdog._current[watchdog.threading.get_ident()].what == "inner"
            assert watchdog._current[watchdog.threading.get_ident()].what == "outer"
        assert watchdog.threading.get_ident() not in watchdog._current
    lines = stalls(caplog)
    assert len(lines) == 1 and lines[0].endswith("waiting for inner (stall_timeout = 0.2 s); the Python stacks "
                                                 "of this process follow"), lines


def test_off_watches_nothing():
    watchdog.configure(0)
    assert watchdog.watch("x") is watchdog.watch("y")        # the shared no-op: nothing allocated per wait
    with watchdog.watch("x"):
        assert not watchdog._current
