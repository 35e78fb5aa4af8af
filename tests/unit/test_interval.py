"""Interval formulas (Young, Daly, multilevel) and the `hpcckpt interval` subcommand."""
import argparse
import itertools
import math

import numpy as np
import pytest

from hpcckpt.cli_interval import add_subcommands
from hpcckpt.errors import ConfigError
from hpcckpt.interval import (
    daly, expected_efficiency_exponential, multilevel_plan, multilevel_periods, multilevel_waste,
    waste, young)


# -- Young and Daly ------------------------------------------------------------------------------

def test_young_is_sqrt_2cm_in_any_unit():
    assert young(5, 1440) == pytest.approx(120.0)                 # minutes in, minutes out
    assert young(300, 86400) == pytest.approx(7200.0)             # same in seconds


@pytest.mark.parametrize("mtbf_min, expected_min, tol", [
    (24 * 60, 116.7, 0.05),      # Daly 2006: M = 24 h, C = 5 min
    (6 * 60, 56.7, 0.05),        # M = 6 h
    (15, 9.14, 0.005),           # M = 15 min
])
def test_daly_reproduces_the_papers_values(mtbf_min, expected_min, tol):
    assert daly(5, mtbf_min) == pytest.approx(expected_min, abs=tol)
    assert daly(5 * 60, mtbf_min * 60) / 60 == pytest.approx(expected_min, abs=tol)


def test_daly_is_mtbf_when_cost_at_least_twice_mtbf():
    assert daly(10, 5) == 5
    assert daly(30, 5) == 5
    assert daly(9.9, 5) != 5


@pytest.mark.parametrize("cost, mtbf", [(5, 1440), (5, 360), (300, 21600)])
def test_daly_is_near_the_exact_optimum_of_the_exponential_model(cost, mtbf):
    taus = np.linspace(0.3, 3.0, 20001) * daly(cost, mtbf)
    eff = [expected_efficiency_exponential(t, cost, mtbf) for t in taus]
    best = taus[int(np.argmax(eff))]
    assert abs(best - daly(cost, mtbf)) / best < 0.002
    # Young is further off than Daly
    assert abs(young(cost, mtbf) - best) > abs(daly(cost, mtbf) - best)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "x", None, True])
def test_formulas_reject_bad_input(bad):
    for f in (young, daly):
        with pytest.raises(ConfigError):
            f(bad, 100)
        with pytest.raises(ConfigError):
            f(5, bad)


def test_first_order_waste_is_minimal_at_young():
    c, m = 60.0, 86400.0
    t = young(c, m)
    assert waste(t, c, m) < waste(0.9 * t, c, m)
    assert waste(t, c, m) < waste(1.1 * t, c, m)
    assert waste(t, c, m) == pytest.approx(math.sqrt(2 * c / m))
    assert waste(t, c, m, restart=60) == pytest.approx(math.sqrt(2 * c / m) + 60 / m)


def test_expected_efficiency_matches_closed_form():
    # T = M: efficiency = 1 / (e^(1 + C/M) - 1) with R = 0
    assert expected_efficiency_exponential(100, 10, 100) == pytest.approx(1 / math.expm1(1.1))
    assert expected_efficiency_exponential(100, 10, 100, restart=50) == pytest.approx(
        1 / (math.exp(0.5) * math.expm1(1.1)))


# -- multilevel ----------------------------------------------------------------------------------

COSTS = {"local": 2.0, "pfs": 60.0}
RATES = {"local": 1 / 3600, "pfs": 1 / 86400}


def test_single_level_plan_is_young():
    plan = multilevel_plan({"pfs": 60.0}, {"pfs": 1 / 86400})
    assert plan.periods["pfs"] == pytest.approx(young(60, 86400))
    assert plan.waste == pytest.approx(math.sqrt(2 * 60 / 86400) + 60 / 86400)


def test_two_level_plan_is_nested_and_near_each_levels_young_period():
    plan = multilevel_plan(COSTS, RATES)
    n = plan.ratios["local"]
    assert isinstance(n, int) and n > 1
    assert plan.periods["pfs"] == pytest.approx(n * plan.periods["local"])
    assert plan.periods["pfs"] == pytest.approx(plan.pattern)
    # relaxed optimum: each level at sqrt(2 D / lambda) with D the incremental cost
    assert plan.periods["local"] == pytest.approx(math.sqrt(2 * 2 / RATES["local"]), rel=0.1)
    assert plan.periods["pfs"] == pytest.approx(math.sqrt(2 * 58 / RATES["pfs"]), rel=0.1)
    assert plan.waste == pytest.approx(multilevel_waste(plan.periods, COSTS, RATES))
    single = waste(young(60, 1 / (RATES["local"] + RATES["pfs"])), 60, 1 / (RATES["local"] + RATES["pfs"]), 60)
    assert plan.waste < 0.5 * single


def _brute_force(costs, rates, inclusive, max_ratio):
    names = list(costs)
    best = math.inf
    for ratios in itertools.product(range(1, max_ratio + 1), repeat=len(names) - 1):
        n = [1.0]
        for r in reversed(ratios):
            n.insert(0, n[0] * r)
        d = [costs[lv] if inclusive else costs[lv] - (costs[names[i - 1]] if i else 0.0)
             for i, lv in enumerate(names)]
        a = sum(ni * di for ni, di in zip(n, d))
        b = sum(rates.get(lv, 0) / (2 * ni) for lv, ni in zip(names, n))
        best = min(best, 2 * math.sqrt(a * b) + sum(rates.get(lv, 0) * costs[lv] for lv in names))
    return best


@pytest.mark.parametrize("inclusive", [False, True])
def test_integer_search_finds_the_brute_force_optimum(inclusive):
    costs = {"local": 1.0, "partner": 8.0, "rs": 20.0, "pfs": 120.0}
    rates = {"local": 1 / 1800, "partner": 1 / 20000, "rs": 1 / 200000, "pfs": 1 / 400000}
    plan = multilevel_plan(costs, rates, inclusive=inclusive)
    assert plan.waste == pytest.approx(_brute_force(costs, rates, inclusive, 30), rel=1e-12)
    assert plan.waste == pytest.approx(multilevel_waste(plan.periods, costs, rates, inclusive=inclusive))


def test_inclusive_costs_never_waste_less():
    a = multilevel_plan(COSTS, RATES, inclusive=False).waste
    b = multilevel_plan(COSTS, RATES, inclusive=True).waste
    assert b > a


def test_coordinate_descent_on_large_grids_is_a_local_optimum():
    costs = {"local": 1.0, "partner": 2.0, "xor": 3.0, "rs": 4.0, "pfs": 5.0}
    rates = {"local": 1e-2, "partner": 1e-4, "xor": 1e-6, "rs": 1e-8, "pfs": 1e-10}
    plan = multilevel_plan(costs, rates)
    names = list(costs)
    ratios = [plan.ratios[lv] for lv in names[:-1]]
    assert all(r > 3 for r in ratios)          # about 10 between successive levels

    def w(rs):
        n = [1.0]
        for r in reversed(rs):
            n.insert(0, n[0] * r)
        p_top = math.sqrt(sum(ni * (costs[lv] - (costs[names[i - 1]] if i else 0)) for i, (lv, ni) in enumerate(zip(names, n)))
                          / sum(rates[lv] / (2 * ni) for lv, ni in zip(names, n)))
        return multilevel_waste({lv: p_top / ni for lv, ni in zip(names, n)}, costs, rates)

    assert plan.waste == pytest.approx(w(ratios))
    for i in range(len(ratios)):
        for delta in (-1, 1):
            other = list(ratios)
            other[i] += delta
            if other[i] >= 1:
                assert w(other) >= plan.waste * (1 - 1e-12)


def test_levels_above_the_last_failure_class_are_never_taken_alone():
    periods = multilevel_periods({"local": 2.0, "partner": 10.0, "pfs": 60.0}, {"local": 1 / 3600, "partner": 1 / 86400})
    assert math.isinf(periods["pfs"])
    assert math.isfinite(periods["partner"]) and periods["partner"] > periods["local"]


def test_multilevel_rejects_bad_input():
    with pytest.raises(ConfigError):
        multilevel_plan({"local": 2.0}, {"pfs": 1e-4})            # rate without cost
    with pytest.raises(ConfigError):
        multilevel_plan({"local": 2.0, "pfs": 60.0}, {})          # no failures at all
    with pytest.raises(ConfigError):
        multilevel_plan({"disk": 2.0}, {"disk": 1e-4})            # unknown level
    with pytest.raises(ConfigError):
        multilevel_plan({"local": -2.0}, {"local": 1e-4})
    with pytest.raises(ConfigError):
        multilevel_plan({"local": 2.0}, {"local": -1e-4})


# -- CLI -----------------------------------------------------------------------------------------

def _parser():
    parser = argparse.ArgumentParser(prog="hpcckpt")
    add_subcommands(parser.add_subparsers())
    return parser


def _run(argv):
    args = _parser().parse_args(argv)
    return args.func(args)


def test_cli_interval_single_level(capsys):
    assert _run(["interval", "--cost", "5min", "--mtbf", "24h"]) == 0
    out = capsys.readouterr().out
    assert "Young" in out and "Daly" in out
    assert "2 h" in out            # Young: sqrt(2 * 5 min * 24 h) = 120 min
    assert "116.7 min" in out      # Daly


@pytest.mark.parametrize("argv", [["interval", "--cost", "2h", "--mtbf", "1h"],
                                  ["interval", "--level", "local:2h:1h", "--level", "pfs:60s:1d"]])
def test_cli_interval_says_when_the_first_order_model_does_not_hold(argv, capsys):
    assert _run(argv) == 0
    assert "note: the checkpoint costs are not small against the MTBF" in capsys.readouterr().out
    assert _run(["interval", "--cost", "5min", "--mtbf", "24h"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_cli_interval_multilevel(capsys):
    assert _run(["interval", "--level", "local:2s:1h", "--level", "pfs:60s:1d"]) == 0
    out = capsys.readouterr().out
    plan = multilevel_plan(COSTS, RATES)
    assert f"every {plan.ratios['local']} local" in out
    assert "local" in out and "pfs" in out and "waste" in out


@pytest.mark.parametrize("argv", [
    ["interval", "--cost", "5min"],
    ["interval", "--cost", "5 parsecs", "--mtbf", "1h"],
    ["interval", "--cost", "0", "--mtbf", "1h"],
    ["interval", "--level", "disk:2s:1h"],
    ["interval", "--level", "local:2s"],
    ["interval", "--level", "local:2s:1h", "--level", "local:3s:1h"],
    ["interval", "--level", "local:2s:1h", "--cost", "1s", "--mtbf", "1h"],
])
def test_cli_interval_bad_input_is_one_line_and_status_2(argv, capsys):
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcckpt interval: error:")
    assert "Traceback" not in err


@pytest.mark.parametrize("argv,what", [(["interval", "--cost", "5min", "--mtbf", "-1h"], "mtbf"),
                                       (["interval", "--cost", "-5min", "--mtbf", "1h"], "cost"),
                                       (["simulate", "--cost", "5min", "--mtbf", "-2d"], "mtbf")])
def test_cli_a_negative_time_given_as_its_own_argument_is_named(argv, what, capsys):
    """``--mtbf -1h`` (not ``--mtbf=-1h``): the message says what is wrong with the value, not
    argparse's "expected one argument"."""
    from hpcckpt import cli
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "expected one argument" not in err and what in err and "Traceback" not in err, err
