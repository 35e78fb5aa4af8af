"""The discrete-event simulator, its claims about Daly and multilevel, and `hpcckpt simulate`."""
import argparse
import sys

import numpy as np
import pytest

from hpcckpt.cli_interval import add_subcommands
from hpcckpt.errors import ConfigError
from hpcckpt.interval import daly, expected_efficiency_exponential, multilevel_plan, young
from hpcckpt.simulate import (
    formula_periods, level_rates, simulate, simulate_many, sweep)


# -- exact accounting on hand-made failure traces ------------------------------------------------

def test_failure_during_checkpoint_and_compute_by_hand():
    # period 30, cost 5, restart 3; failure at 32 hits the first checkpoint (30..35), the one at 50
    # hits compute 15 s after restarting from the start at 35.
    r = simulate(100, {"pfs": 30}, {"pfs": 5}, {"system": 1e9}, restarts={"pfs": 3},
                 trace=([32.0, 50.0], ["system", "system"]))
    assert (r.wall, r.checkpoint, r.lost, r.restart) == (168.0, 17.0, 45.0, 6.0)
    assert (r.failures, r.checkpoints) == (2, 3)
    assert r.efficiency == pytest.approx(100 / 168)


def test_multilevel_rollbacks_and_failure_during_restart_by_hand():
    # local every 10 s (cost 1, restart 2), pfs every 30 s (cost 3, restart 4), work 40.
    # t=25 process crash: back to local@20 (lost 3, restart 2 -> t=27); pfs checkpoint 37..40 is hit
    # at 38 by a node loss (only pfs survives it): back to the start (lost 30, restart 4 from scratch),
    # and at 40 a process crash hits that restart: it starts over (restart time 2 + 4).
    r = simulate(40, {"local": 10, "pfs": 30}, {"local": 1, "pfs": 3},
                 {"process": 1e9, "node": 1e9}, restarts={"local": 2, "pfs": 4},
                 trace=([25.0, 38.0, 40.0], ["process", "node", "process"]))
    assert (r.wall, r.checkpoint, r.lost, r.restart) == (89.0, 8.0, 33.0, 8.0)
    assert (r.failures, r.checkpoints) == (3, 5)


def test_no_failures_nested_schedule():
    r = simulate(40, {"local": 10, "pfs": 30}, {"local": 1, "pfs": 3}, {"process": 1e9}, trace=([], []))
    assert (r.wall, r.checkpoint, r.checkpoints) == (45.0, 5.0, 3)   # local, local, pfs; none at the end


def test_failure_no_enabled_level_survives_restarts_from_scratch():
    r = simulate(100, {"local": 10}, {"local": 1}, {"node": 1e9}, restarts={"local": 0},
                 trace=([50.0], ["node"]))
    assert r.lost == pytest.approx(50 - 4)     # 4 local checkpoints (4 s) before t = 50: all lost
    assert r.wall == pytest.approx(50 + 100 + 9)


@pytest.mark.parametrize("distribution", ["exponential", "weibull"])
def test_accounting_identity_and_reproducibility(distribution):
    kw = dict(distribution=distribution, shape=0.7, downtime=30.0)
    args = (20 * 86400.0, {"local": 120.0, "pfs": 3000.0}, {"local": 2.0, "pfs": 60.0},
            {"process": 3600.0, "node": 86400.0})
    a = simulate(*args, seed=5, **kw)
    assert a.wall == pytest.approx(a.work + a.checkpoint + a.lost + a.restart, rel=1e-12)
    assert a.failures > 100
    assert simulate(*args, seed=5, **kw) == a
    assert simulate(*args, seed=6, **kw) != a
    many = simulate_many(*args, trials=1, seed=5, **kw)
    assert many.wall == pytest.approx(a.wall)


def test_weibull_renewal_rate_matches_mtbf():
    # long runs: failures per wall second -> 1 / MTBF (renewal theorem), for shape 0.7 and 1.5
    for shape in (0.7, 1.5):
        s = simulate_many(200 * 86400.0, {"pfs": 1800.0}, {"pfs": 60.0}, {"system": 6 * 3600.0},
                          trials=20, seed=1, distribution="weibull", shape=shape)
        assert s.failures / s.wall * 6 * 3600.0 == pytest.approx(1.0, rel=0.05)


def test_simulated_efficiency_matches_the_exact_exponential_model():
    c, m = 300.0, 6 * 3600.0
    tau = daly(c, m)
    s = simulate_many(400 * 3600.0, {"pfs": tau}, {"pfs": c}, {"system": m}, trials=200, seed=2)
    exact = expected_efficiency_exponential(tau, c, m, restart=c)
    assert abs(s.efficiency - exact) < max(4 * s.efficiency_sem, 1e-3)
    assert s.checkpoint + s.lost + s.restart == pytest.approx(s.waste, rel=1e-9)


# -- the claims ------------------------------------------------------------------------------------

def test_daly_is_within_one_percent_of_the_best_swept_interval():
    c, m = 300.0, 6 * 3600.0
    t_daly = daly(c, m)
    factors = np.geomspace(0.25, 4.0, 17)
    res = sweep(200 * 3600.0, [{"pfs": t_daly * f} for f in factors], {"pfs": c}, {"system": m},
                trials=200, seed=1)
    eff = np.array([r.efficiency for r in res])
    best = eff.max()
    at_daly = eff[8]                            # factor 1
    assert factors[8] == pytest.approx(1.0)
    assert at_daly >= 0.99 * best
    assert 2 <= int(np.argmax(eff)) <= 14        # the sweep brackets the optimum
    assert eff[0] < best - 0.05 and eff[-1] < best - 0.05   # and is sensitive to the interval


def test_multilevel_wastes_less_than_the_best_single_level_interval():
    costs = {"local": 2.0, "pfs": 60.0}
    failures = {"process": 3600.0, "node": 86400.0}
    work = 7 * 86400.0
    ml = formula_periods("multilevel", costs, failures)
    t_single = formula_periods("daly", {"pfs": 60.0}, failures)["pfs"]
    factors = np.geomspace(0.25, 4.0, 13)
    single = sweep(work, [{"pfs": t_single * f} for f in factors], {"pfs": 60.0}, failures, trials=60, seed=3)
    multi = simulate_many(work, ml, costs, failures, trials=60, seed=3)
    best_single = min(s.waste for s in single)
    assert multi.waste < 0.5 * best_single
    # the first-order model predicts the simulated multilevel waste
    plan = multilevel_plan(costs, level_rates(costs, failures))
    assert multi.waste == pytest.approx(plan.waste, rel=0.15)


# -- helpers and errors --------------------------------------------------------------------------

def test_level_rates_and_formula_periods():
    failures = {"process": 3600.0, "node": 86400.0, "system": 7 * 86400.0}
    assert level_rates(["local", "pfs"], failures) == pytest.approx(
        {"local": 1 / 3600, "pfs": 1 / 86400 + 1 / (7 * 86400)})
    assert level_rates(["partner"], failures) == pytest.approx({"partner": 1 / 3600 + 1 / 86400})
    p = formula_periods("daly", {"pfs": 60.0}, failures)
    assert p["pfs"] == pytest.approx(daly(60.0, 1 / (1 / 3600 + 1 / 86400 + 1 / (7 * 86400))))
    y = formula_periods("young", {"local": 2.0, "pfs": 60.0}, failures)
    assert y["local"] == pytest.approx(young(2.0, 3600.0))
    with pytest.raises(ConfigError):
        formula_periods("magic", {"pfs": 60.0}, failures)


@pytest.mark.parametrize("kwargs", [
    dict(failures={"meteor": 100.0}),
    dict(failures={"system": -1.0}),
    dict(periods={"pfs": 0.0}),
    dict(periods={"tape": 10.0}),
    dict(costs={"local": 1.0}),
    dict(distribution="gaussian"),
    dict(work=-5),
    dict(seed=-1),
    dict(seed=1.5),
])
def test_simulate_rejects_bad_input(kwargs):
    args = dict(work=1000.0, periods={"pfs": 100.0}, costs={"pfs": 5.0}, failures={"system": 3600.0})
    args.update(kwargs)
    with pytest.raises(ConfigError):
        simulate(args.pop("work"), args.pop("periods"), args.pop("costs"), args.pop("failures"), **args)


# -- CLI -----------------------------------------------------------------------------------------

def _run(argv):
    parser = argparse.ArgumentParser(prog="hpcckpt")
    add_subcommands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


FAST = ["--work", "5d", "--trials", "5", "--points", "5"]


def test_cli_simulate_table(capsys):
    assert _run(["simulate", "--cost", "5min", "--mtbf", "6h"] + FAST) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "%" in ln]
    assert len(lines) == 6                       # 5 swept (Daly among them) + Young
    assert sum("daly" in ln for ln in lines) == 1 and sum("young" in ln for ln in lines) == 1
    assert sum("best" in ln for ln in lines) == 1


def test_cli_simulate_multilevel_row(capsys):
    assert _run(["simulate", "--level", "local:2s:1h", "--level", "pfs:60s:1d"] + FAST) == 0
    out = capsys.readouterr().out
    assert "multilevel" in out and "local" in out


@pytest.mark.parametrize("argv", [
    ["simulate", "--cost", "5min"],
    ["simulate", "--cost", "5min", "--mtbf", "6h", "--work", "soon"],
    ["simulate", "--cost", "5min", "--mtbf", "6h", "--trials", "1"],
    ["simulate", "--cost", "5min", "--mtbf", "6h", "--min-factor", "3", "--max-factor", "2"],
    ["simulate", "--cost", "5min", "--mtbf", "24h", "--seed", "-1"] + FAST,
    ["simulate", "--cost", "5min", "--mtbf", "1min", "--work", "30d", "--trials", "2", "--points", "2"],
])
def test_cli_simulate_bad_input(argv, capsys):
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcckpt simulate: error:")


def test_cli_simulate_plot_without_matplotlib(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib -> ImportError
    assert _run(["simulate", "--cost", "5min", "--mtbf", "6h", "--plot", str(tmp_path / "w.png")] + FAST) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and err.count("\n") == 1
    assert not (tmp_path / "w.png").exists()


def test_cli_simulate_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "w.png"
    assert _run(["simulate", "--level", "local:2s:1h", "--level", "pfs:60s:1d", "--plot", str(png)] + FAST) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pure_python_fallback_gives_the_same_results(monkeypatch):
    import hpcckpt.simulate as sim
    args = (3 * 86400.0, {"local": 120.0, "pfs": 3000.0}, {"local": 2.0, "pfs": 60.0},
            {"process": 3600.0, "node": 86400.0})
    compiled = simulate(*args, seed=9)
    monkeypatch.setattr(sim, "_run_kernel", sim._kernel)
    assert simulate(*args, seed=9) == compiled


# -- the failure classes come from the levels (Level.survives) ----------------------------------

def test_each_failure_class_needs_the_cheapest_level_that_survives_it():
    from hpcckpt.simulate import failure_classes
    assert failure_classes() == {"process": "local", "node": "partner", "system": "pfs"}


def test_a_level_must_say_what_it_survives_in_known_words():
    from hpcckpt.levels import registry
    from hpcckpt.levels.base import Level
    bad = type("Diskish", (Level,), {"name": "diskish", "order": 47, "survives": "disk"})
    with pytest.raises(ValueError, match="level 'diskish' survives 'disk', not one of process, node, system"):
        registry.register(bad)
    assert "diskish" not in registry.LEVELS
