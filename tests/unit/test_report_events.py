"""`hpcckpt report` on the event log of a real job (tests/unit/data/events.jsonl, recorded by
tests/tools/make_events.py: 3 runs of 4 ranks, a partner rebuild, a pfs restart, a fallback and
an injected write failure), and on bad input. No MPI."""
import os
import subprocess
import sys
import types

import pytest

from hpcckpt import interval, report, report_plot
from hpcckpt.events import read

DATA = os.path.join(os.path.dirname(__file__), "data", "events.jsonl")


def cli(*args):
    res = subprocess.run([sys.executable, "-m", "hpcckpt", "report", *map(str, args)], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in res.stderr, res.stderr
    return res


@pytest.fixture(scope="module")
def summary():
    return report.summarize(read([DATA]))


def test_the_summary_of_the_recorded_job(summary):
    assert len(summary.runs) == 3 and len(summary.starts) == 3
    assert {lv: len(lc.seconds) for lv, lc in summary.levels.items()} == {"local": 18, "partner": 3, "pfs": 4}
    assert [(e["step"], e["source"], e["own"], e["rebuilt"]) for e in summary.restarts] == [
        (17, "partner", 3, 1), (35, "pfs", 4, 0)]
    assert [(e["event"], e["step"]) for e in summary.problems] == [("fallback", 19), ("failure", 41)]
    assert summary.problems[1]["error"] == "CheckpointWriteError"
    # the MTBFs of level_mtbf, and Daly's interval of the mean cost (each run's first left out)
    assert {lv: lc.mtbf for lv, lc in summary.levels.items()} == {"local": 30.0, "partner": 120.0, "pfs": 600.0}
    local = summary.levels["local"]
    assert local.daly == pytest.approx(interval.daly(local.cost, 30.0))
    assert min(local.seconds) <= local.cost <= max(local.seconds)
    assert len(summary.levels["partner"].background) == 3 and len(summary.levels["pfs"].background) == 4
    assert local.interval is not None and all(x > 0 for x in local.observed)


def test_observed_intervals_leave_out_lower_levels_and_restarts():
    def ck(run, t, level, seconds):
        return {"event": "checkpoint", "run": run, "t": t, "level": level, "seconds": seconds, "call_seconds": seconds}
    ckpts = [ck("a", 10, "partner", 1), ck("a", 15, "local", 2), ck("a", 30, "partner", 1), ck("b", 100, "partner", 1)]
    # partner: from 10 to 29 (the start of the next), less 2 s of the local checkpoint: 17 s
    assert report.observed_intervals(ckpts, "partner") == [17.0]
    assert report.observed_intervals(ckpts, "local") == [3.0, 14.0]      # a partner checkpoint covers local
    assert report.observed_intervals(ckpts, "pfs") == []


def test_running_costs_leave_out_each_runs_first_once_it_has_more():
    ckpts = [{"run": r, "level": "local", "seconds": s} for r, s in (("a", 10.0), ("a", 2.0), ("a", 4.0), ("b", 9.0))]
    assert [c for _, c in report.running_costs(ckpts, "local")] == [10.0, 2.0, 3.0, 5.0]


def test_the_report_command_prints_the_table():
    res = cli(DATA)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "3 run(s) of job 'ev' on 4 ranks" in out and "policy: daly" in out
    table = out.split("\ncheckpoints", 1)[1].split("\n\n", 1)[0]
    rows = {ln.split()[0]: ln.split() for ln in table.splitlines()[1:]}
    assert rows["local"][1] == "18" and rows["partner"][1] == "3" and rows["pfs"][1] == "4" and rows["all"][1] == "25"
    restarts = [ln.split() for ln in out.splitlines() if ln.strip()[:2] in ("17", "35")]
    assert [r[:5] for r in restarts] == [["17", "partner", "partner", "3", "1"], ["35", "pfs", "pfs", "4", "0"]]
    assert "fallback: step 19 not restored from cache" in out
    assert "failure: checkpoint 41 raised CheckpointWriteError" in out
    assert "(cost 0.0" in out and "MTBF 30 s)" in out and "MTBF 10 min)" in out


def test_several_files_are_merged_in_time_order(tmp_path):
    with open(DATA) as f:
        text = f.readlines()
    (tmp_path / "b.jsonl").write_text("".join(text[:20]))
    (tmp_path / "a.jsonl").write_text("".join(text[20:]))
    res = cli(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert res.returncode == 0 and res.stdout == cli(DATA).stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"v": 1}\n')
    res = cli(bad)
    assert res.returncode == 2 and res.stderr.startswith(f"hpcckpt report: {bad}:1: field 'event' is missing")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = cli(empty)
    assert res.returncode == 2 and "no events in" in res.stderr
    res = cli(tmp_path / "missing.jsonl")
    assert res.returncode == 2 and "missing.jsonl" in res.stderr and res.stderr.count("\n") == 1
    assert cli().returncode == 2


def test_plot_without_matplotlib_says_which_extra(monkeypatch, capsys):
    monkeypatch.setattr(report_plot, "available", lambda: False)
    assert report.cmd_report(types.SimpleNamespace(events=[DATA], plot="x.png")) == 2
    assert "pip install hpcckpt[plot]" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path):
    if not report_plot.available():
        if os.environ.get("CI") == "true":
            pytest.fail("matplotlib is in the test extra: CI must test the plot")
        pytest.skip("matplotlib not installed (pip install hpcckpt[plot])")
    out = tmp_path / "timeline.png"
    res = cli(DATA, "--plot", out)
    assert res.returncode == 0, res.stderr
    assert f"plot written to {out}" in res.stdout
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out) > 20000


def test_every_level_has_a_style_of_its_own_and_none_is_red():
    from hpcckpt.levels.registry import LEVELS
    styles = [report_plot.style(lv) for lv in LEVELS]
    assert len(set(styles)) == len(styles) and not any("red" in c for c, _ in styles)
    assert report_plot.style("local") == ("tab:blue", "o") and report_plot.style("pfs") == ("tab:brown", "v")
