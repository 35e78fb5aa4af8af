"""hpcckpt/events.py without MPI: the event log's lines, its write failures, the INFO lines, the
decorator on a stand-in Checkpointer, and the reader's refusals (file and line named)."""
import json
import logging
import os
import types

import pytest

from hpcckpt import events
from hpcckpt.events import EventLog, EventsFormatError, parse_line, read

DATA = os.path.join(os.path.dirname(__file__), "data", "events.jsonl")


def lines(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f]


def test_rank_0_appends_one_json_line_per_event_and_a_relaunch_adds_to_the_file(tmp_path):
    path = tmp_path / "sub" / "ev.jsonl"
    first = EventLog(str(path), 0, 4, "job")
    first.emit("fallback", step=3, source="cache", reason="gone")
    first.emit("background", step=3, level="partner", seconds=float("inf"))
    first.close()
    again = EventLog(str(path), 0, 4, "job")          # the relaunch: another run id, the same file
    again.epoch = 2
    again.fallback(1, "pfs", "x" * (events.MESSAGE_MAX + 50))
    got = lines(path)
    assert [e["event"] for e in got] == ["fallback", "background", "fallback"]
    assert all(e["v"] == 1 and e["job"] == "job" and e["ranks"] == 4 for e in got)
    assert got[0]["run"] == got[1]["run"] != got[2]["run"]
    assert got[0]["epoch"] is None and got[2]["epoch"] == 2
    assert got[1]["seconds"] is None                     # no infinity in JSON
    assert len(got[2]["reason"]) == events.MESSAGE_MAX + 1
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)


def test_other_ranks_and_an_empty_path_write_nothing(tmp_path):
    for log in (EventLog(str(tmp_path / "a.jsonl"), 1, 4, "job"), EventLog("", 0, 4, "job")):
        log.emit("fallback", step=1, source="cache", reason="r")
        assert not log.active
    assert os.listdir(tmp_path) == []


def test_a_write_failure_warns_once_and_never_raises(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = EventLog(str(blocker / "ev.jsonl"), 0, 4, "job")       # its directory is a file
    with caplog.at_level(logging.WARNING, logger="hpcckpt"):
        for _ in range(3):
            log.emit("fallback", step=1, source="cache", reason="r")
    warnings = [r for r in caplog.records if "cannot write the events file" in r.getMessage()]
    assert len(warnings) == 1 and "no more events" in warnings[0].getMessage()
    assert not log.active


def test_the_info_lines():
    assert events.checkpoint_line(12, "partner", 256 << 20, 0.0834, "partner redundancy") == (
        "checkpoint 12 (partner): 256.0 MiB in 0.083 s (application waited); the partner redundancy follows in "
        "the background")
    assert events.checkpoint_line(3, "local", 100, 0.5, before=(0.25, "background pfs flush of step 1")) == (
        "checkpoint 3 (local): 100 B in 0.500 s (application waited, and 0.250 s before it for the background pfs "
        "flush of step 1)")
    assert events.restart_line(11, "partner", "partner", 3, 1, 0.41) == (
        "restarted from step 11 (partner): own cache on 3 ranks, rebuilt from partner copies on 1; 0.410 s")
    assert events.restart_line(11, "xor", "xor", 7, 1, 1).endswith("own cache on 7 ranks, rebuilt from xor parity "
                                                                    "on 1; 1.000 s")
    assert events.restart_line(9, "local", "cache", 4, 0, 0.1) == (
        "restarted from step 9 (local): own cache on 4 ranks; 0.100 s")
    assert events.restart_line(9, "pfs", "pfs", 4, 0, 0.1) == (
        "restarted from step 9 (pfs): read from pfs on 4 ranks; 0.100 s")


def test_restored_notes_name_the_source():
    log = EventLog("", 0, 4, "job")
    log.restored(5, "partner", [True, False, True, True])
    assert log._restored == (5, "partner", "partner", 3, 1)
    log.restored(5, "partner")
    assert log._restored == (5, "partner", "cache", 4, 0)
    log.restored(5, "pfs", direct=True)
    assert log._restored == (5, "pfs", "pfs", 4, 0)


class _NoMPI:
    """A communicator the decorator must never touch: close() may run after MPI.Finalize()."""

    @property
    def rank(self):
        raise AssertionError("an MPI call (comm.rank) from the event log")

    size = rank


class _Fake:
    """What the decorator reads of a Checkpointer: _events, _epoch, _flush, policy, _warned."""

    def __init__(self, path, rank=0):
        self.comm = _NoMPI()
        self._events = EventLog(path, rank, 4, "job")
        self._epoch, self._flush = 3, None
        self.policy = types.SimpleNamespace(kind="daly", periods=lambda: {"local": 12.5, "pfs": float("inf")})

    @events.recorded("checkpoint")
    def checkpoint(self, step, fail=None, background=None):
        if background:
            self._flush = types.SimpleNamespace(step=step, what=background)
        if fail:
            raise fail
        return types.SimpleNamespace(step=step, level="local", bytes=2048, seconds=0.25)

    @events.recorded("restart")
    def restart(self, source):
        if source:
            self._events.restored(7, "partner", [True, False, True, True] if source == "partner" else None)
        return 7

    @events.recorded("close")
    def close(self):
        pass

    @events.recorded("wait")
    def wait(self):
        raise events.HpcCkptError("the pfs flush failed")

    @events.recorded("checkpoint")
    def final_checkpoint(self, step):
        self.wait()                  # as checkpoint() waits for a final pfs step: the outer call records


def test_the_decorator_records_checkpoints_restarts_and_failures(tmp_path, caplog):
    path = str(tmp_path / "ev.jsonl")
    fake = _Fake(path)
    with caplog.at_level(logging.INFO, logger="hpcckpt"):
        fake.checkpoint(4, background="partner redundancy")
        fake.checkpoint(5)                              # waits for step 4's background work first
        assert fake.restart("partner") == 7
        with pytest.raises(KeyError):
            fake.checkpoint(6, fail=KeyError("boom"))
        err = events.HpcCkptError("the background work of step 5 failed")
        err.info = types.SimpleNamespace(step=6, level="local", bytes=1, seconds=0.5)
        with pytest.raises(events.HpcCkptError):
            fake.checkpoint(6, fail=err)             # taken, then the earlier background error
        fake.close()
    got = lines(path)
    assert [e["event"] for e in got] == ["checkpoint", "checkpoint", "restart", "failure", "checkpoint", "failure"]
    c4, c5, r, f1, c6, f2 = got
    assert (c4["step"], c4["level"], c4["bytes"], c4["seconds"], c4["background"]) == (4, "local", 2048, 0.25,
                                                                                      "partner redundancy")
    assert c4["interval"] == {"local": 12.5, "pfs": None} and c4["policy"] == "daly" and c4["epoch"] == 3
    assert c5["background"] is None
    assert (r["step"], r["level"], r["source"], r["own"], r["rebuilt"]) == (7, "partner", "partner", 3, 1)
    assert (f1["op"], f1["step"], f1["error"], f1["message"]) == ("checkpoint", 6, "KeyError", "'boom'")
    assert c6["step"] == 6 and f2["error"] == "HpcCkptError"
    text = caplog.text
    assert "checkpoint 4 (local): 2.0 KiB in 0.250 s (application waited); the partner redundancy follows" in text
    assert "before it for the background partner redundancy of step 4" in text
    assert "restarted from step 7 (partner): own cache on 3 ranks, rebuilt from partner copies on 1" in text
    assert fake._events._fd is None                    # closed with the Checkpointer


def test_a_call_inside_a_recorded_call_is_recorded_once(tmp_path):
    fake = _Fake(str(tmp_path / "ev.jsonl"))
    with pytest.raises(events.HpcCkptError):
        fake.final_checkpoint(9)
    with pytest.raises(events.HpcCkptError):
        fake.wait()
    assert [(e["event"], e["op"], e["step"]) for e in lines(tmp_path / "ev.jsonl")] == [
        ("failure", "checkpoint", 9), ("failure", "wait", None)]


def test_a_restart_without_a_note_is_from_the_cache_and_other_ranks_log_nothing(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="hpcckpt"):
        _Fake(str(tmp_path / "r1.jsonl"), rank=1).restart(None)
        assert caplog.text == ""
        _Fake(str(tmp_path / "r0.jsonl")).restart(None)
    assert "restarted from step 7 (level unknown): own cache on 4 ranks" in caplog.text
    assert os.listdir(tmp_path) == ["r0.jsonl"]


def test_recording_that_fails_never_fails_the_call(tmp_path, caplog, monkeypatch):
    fake = _Fake(str(tmp_path / "ev.jsonl"))
    monkeypatch.setattr(fake.policy, "periods", lambda: 1 / 0)        # recorded as unknown
    monkeypatch.setattr(fake._events, "emit", lambda *a, **k: 1 / 0)
    with caplog.at_level(logging.WARNING, logger="hpcckpt"):
        assert fake.checkpoint(1).step == 1
        assert fake.checkpoint(2).step == 2
    assert caplog.text.count("recording an event failed (ZeroDivisionError") == 1


def test_a_start_that_cannot_be_recorded_only_warns(tmp_path, caplog):
    log = EventLog(str(tmp_path / "ev.jsonl"), 0, 4, "job")
    with caplog.at_level(logging.WARNING, logger="hpcckpt"):
        log.start(object())                               # no policy, no config: nothing raised
    assert "recording an event failed (AttributeError" in caplog.text
    assert not os.path.exists(tmp_path / "ev.jsonl")


def test_the_recorded_file_parses():
    got = read([DATA])
    assert {e["event"] for e in got} == set(events.KINDS)
    assert all(e["v"] == 1 for e in got)


GOOD = ('{"v":1,"event":"restart","t":1.5,"run":"r","ranks":4,"step":3,"source":"partner","seconds":0.1,"own":3,'
        '"rebuilt":1}')


@pytest.mark.parametrize("text,says", [
    ("not json", "not a JSON object"),
    ("[1, 2]", "not a JSON object but list"),
    (GOOD.replace('"v":1', '"v":2'), "schema version 2, newer than this hpcckpt reads"),
    (GOOD.replace('"v":1,', ''), "field 'v' is missing"),
    (GOOD.replace('"v":1', '"v":0'), "schema version 0, expected 1"),
    (GOOD.replace('"t":1.5', '"t":"noon"'), "field 't' is a str, expected int or float"),
    (GOOD.replace('"t":1.5', '"t":NaN'), "NaN is not a number JSON allows"),
    (GOOD.replace('"step":3', '"step":true'), "field 'step' is a bool, expected int in a 'restart' event"),
    (GOOD.replace('"source":"partner"', '"source":"tape"'), "unknown restart source 'tape'"),
    (GOOD.replace(',"own":3', ''), "field 'own' is missing"),
])
def test_a_bad_line_is_refused_with_its_file_and_line(tmp_path, text, says):
    path = tmp_path / "ev.jsonl"
    path.write_text(GOOD + "\n\n" + text + "\n" + GOOD + "\n")
    with pytest.raises(EventsFormatError) as e:
        read([str(path)])
    assert str(e.value).startswith(f"{path}:3: ") and says in str(e.value), str(e.value)


def test_an_incomplete_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "ev.jsonl"
    path.write_text(GOOD + "\n" + GOOD[:40])
    said = []
    assert len(read([str(path)], warn=said.append)) == 1
    assert said and f"{path}:2" in said[0] and "incomplete last line" in said[0]
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(EventsFormatError, match=r":2: not UTF-8"):
        read([str(path)])


def test_unknown_event_kinds_of_version_1_are_kept():
    e = parse_line('{"v":1,"event":"later","t":1,"run":"r","ranks":2,"x":1}', "f:1")
    assert e["event"] == "later"


def test_restart_sources_are_the_cache_and_the_levels_that_restore_or_rebuild():
    assert events.sources() == ("cache", "partner", "xor", "rs", "pfs")
    line = '{"v":1,"event":"restart","t":1.0,"run":"r","job":"j","ranks":4,"epoch":1,"step":3,"level":"local",' \
           '"source":"%s","own":4,"rebuilt":0,"seconds":0.1}'
    assert parse_line(line % "rs", "f:1")["source"] == "rs"
    with pytest.raises(EventsFormatError, match="unknown restart source 'local'"):
        parse_line(line % "local", "f:1")
