"""faults.wrap_level: the fault wrapper around a Level (``_HPCCKPT_LEVEL_FAULT``), one process.

A fake level records the calls it gets; the wrapper must hand every call and attribute to it
unchanged, and fire the named action before the named phase only, on the named rank, level and step.
"""
import errno
import types

import pytest

from hpcckpt import faults
from hpcckpt.levels.base import Level
from hpcckpt.levels.options import Setting


class Fake(Level):
    """Records every call; returns something recognisable from each."""
    name, order, redundant = "fake", 77, True
    settings = {"dir": Setting("", str, doc="a directory")}
    files = object()

    def __init__(self, ctx=None):
        super().__init__(ctx)
        self.calls = []
        self.sent = 123

    def prepares(self):
        return True

    def prepare(self, step, ckpt_id, items, epoch, state_keys):
        self.calls.append(("prepare", step))
        return "pipe"

    def protect(self, manifest, pending=None):
        self.calls.append(("protect", manifest.step, pending))
        return "committed"

    def retire(self, manifest, clear_others=False):
        self.calls.append(("retire", manifest.step, clear_others))

    def discard(self, pending):
        self.calls.append(("discard",))

    def clear_earlier(self, epoch):
        self.calls.append(("clear_earlier",))

    def offers(self, skipped=None):
        self.calls.append(("offers",))
        return {4: (1, "id")}

    def recover(self, step, ckpt_id, data_ok):
        self.calls.append(("recover", step))
        return True

    def restore(self, step, protected, state, layouts):
        self.calls.append(("restore", step))

    def close(self):
        self.calls.append(("close",))

    def own_method(self):
        return "own"

    @classmethod
    def placement_warnings(cls, node_of, options, config):
        return [f"fake: {len(node_of)} ranks"]


def manifest(step):
    return types.SimpleNamespace(step=step)


def wrap(monkeypatch, spec, rank=1, level=None):
    if spec is None:
        monkeypatch.delenv(faults.LEVEL_ENV, raising=False)
    else:
        monkeypatch.setenv(faults.LEVEL_ENV, spec)
    monkeypatch.delenv("_HPCCKPT_FAULT_ONCE", raising=False)
    level = level or Fake()
    return level, faults.wrap_level(level, rank)


@pytest.mark.parametrize("spec", [None, "", "pfs:protect:1"])
def test_no_fault_for_this_level_is_the_level_itself(monkeypatch, spec):
    level, wrapped = wrap(monkeypatch, spec)
    assert wrapped is level


@pytest.mark.parametrize("spec", ["fake:protect:0", "*:protect:2", "fake:ready:0"])
def test_another_rank_gets_the_same_proxy_that_never_fires(monkeypatch, spec):
    """Every rank has the proxy (the protocol's path is the same everywhere); only one fires."""
    level, w = wrap(monkeypatch, spec)
    _, here = wrap(monkeypatch, spec, rank=int(spec.split(":")[2]))
    assert type(w) is type(here) and w is not level
    assert w.protect(manifest(9)) == "committed" and w.ready() is None
    with pytest.raises(OSError):
        (here.protect(manifest(9)) if ":protect:" in spec else here.ready())


def test_the_proxy_is_a_level_that_passes_everything_through(monkeypatch):
    level, w = wrap(monkeypatch, "fake:close:1")
    assert w is not level and isinstance(w, Level)
    assert (w.name, w.order, w.redundant, w.restores, w.any_rank_count) == ("fake", 77, True, False, False)
    assert w.settings is Fake.settings and w.files is Fake.files
    assert w.sent == 123 and w.own_method() == "own" and w.ctx is None      # not in the interface
    assert w.prepares() and not w.background() and w.comms() == () and w.pinned_steps() == ()
    assert w.placement_warnings([0, 1], {}, None) == ["fake: 2 ranks"]
    assert w.prepare(4, "id", [], 1, {}) == "pipe"
    assert w.protect(manifest(4), "pipe") == "committed"
    w.retire(manifest(4), clear_others=True)
    assert w.offers() == {4: (1, "id")}
    assert w.recover(4, "id", [True, False]) is True
    w.restore(4, [], {}, {})
    assert level.calls == [("prepare", 4), ("protect", 4, "pipe"), ("retire", 4, True), ("offers",),
                           ("recover", 4), ("restore", 4)]
    w.sent = 7                                   # the protocol's writes reach the level
    assert level.sent == 7
    with pytest.raises(OSError):
        w.close()
    assert level.calls[-1] == ("close",)         # a collective phase: the error comes once it has run


@pytest.mark.parametrize("phase,call", [
    ("prepare", lambda w: w.prepare(9, "id", [], 1, {})),
    ("protect", lambda w: w.protect(manifest(9))),
    ("retire", lambda w: w.retire(manifest(9))),
    ("offers", lambda w: w.offers()),
    ("recover", lambda w: w.recover(9, "id", [False])),
    ("restore", lambda w: w.restore(9, [], {}, {})),
    ("close", lambda w: w.close()),
    ("discard", lambda w: w.discard(None)),
    ("clear_earlier", lambda w: w.clear_earlier(2)),
])
def test_each_phase_fails_with_enospc(monkeypatch, phase, call):
    """A local phase fails before the level runs; a collective one after it ran on this rank
    (as a level keeping the interface's rule fails: in every round of its exchange, then raising)."""
    level, w = wrap(monkeypatch, f"*:{phase}:1")
    with pytest.raises(OSError) as e:
        call(w)
    assert e.value.errno == errno.ENOSPC and e.value.filename == f"fake.{phase}"
    ran = [c[0] for c in level.calls]
    local = phase in ("offers", "discard")
    assert faults.PHASES[phase][1] == (not local)
    assert ran == ([] if local else [phase])
    level.calls.clear()
    other = [p for p in ("protect", "retire", "offers", "close") if p != phase][0]
    {"protect": lambda: w.protect(manifest(9)), "retire": lambda: w.retire(manifest(9)),
     "offers": w.offers, "close": w.close}[other]()       # the other phases run untouched
    assert level.calls and level.calls[0][0] == other


def test_the_step_selects_the_call(monkeypatch):
    level, w = wrap(monkeypatch, "fake:protect:*:9")
    assert w.protect(manifest(4)) == "committed"
    with pytest.raises(OSError):
        w.protect(manifest=manifest(9))
    assert level.calls == [("protect", 4, None), ("protect", 9, None)]
    level, w = wrap(monkeypatch, "fake:recover:1:9:kill")      # kill: before the phase (not reached here)
    w.recover(4, "id", [False])
    level, w = wrap(monkeypatch, "fake:recover:1:9")
    w.recover(4, "id", [False])
    with pytest.raises(OSError):
        w.recover(9, "id", [False])
    level, w = wrap(monkeypatch, "fake:offers:1:9")     # a phase without a step: any step matches
    with pytest.raises(OSError):
        w.offers()


@pytest.mark.parametrize("action,raised", [("error", OSError), ("", OSError), ("interrupt", KeyboardInterrupt),
                                           ("exit", SystemExit)])
def test_actions(monkeypatch, action, raised):
    level, w = wrap(monkeypatch, f"fake:restore:1:*:{action}")
    with pytest.raises(raised):
        w.restore(9, [], {}, {})
    assert level.calls == [("restore", 9)]            # collective: raised once it ran here
    level, w = wrap(monkeypatch, f"fake:offers:1:*:{action}")
    with pytest.raises(raised):
        w.offers()
    assert level.calls == []                          # local: raised before


def test_sleep_goes_on(monkeypatch):
    level, w = wrap(monkeypatch, "fake:restore:1:*:sleep=0.01")
    w.restore(9, [], {}, {})
    assert level.calls == [("restore", 9)]


def test_once(monkeypatch, tmp_path):
    level, w = wrap(monkeypatch, "fake:protect:1")
    monkeypatch.setenv("_HPCCKPT_FAULT_ONCE", str(tmp_path / "once"))
    with pytest.raises(OSError):
        w.protect(manifest(4))
    assert w.protect(manifest(4)) == "committed"


@pytest.mark.parametrize("spec", ["fake", "fake:protect", "fake:write:1", "fake:protect:1:2:error:x"])
def test_a_malformed_spec_is_a_clear_error(monkeypatch, spec):
    with pytest.raises(ValueError, match="LEVEL:PHASE:RANK"):
        wrap(monkeypatch, spec)


def test_the_proxy_defines_the_phases_of_the_level_and_the_faulted_one(monkeypatch):
    """The protocol skips a phase a level leaves to the interface (save._defines): so does the
    proxy, except for the phase it is to fail."""
    level, w = wrap(monkeypatch, "fake:ready:1")
    assert type(w).pinned_steps is Level.pinned_steps and type(w).abandon is Level.abandon
    assert type(w).protect is not Level.protect and type(w).ready is not Level.ready
    assert w.pinned_steps() == () and w.abandon() is None
    with pytest.raises(OSError):
        w.ready()
    level, w = wrap(monkeypatch, "fake:close:1")
    assert type(w).ready is Level.ready
